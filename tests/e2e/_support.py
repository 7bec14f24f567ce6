"""Helpers for the end-to-end tests: real `conveyor` subprocesses, bounded waits, database reads."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from uuid import UUID

from conveyor.backends import open_backend
from conveyor.backends.base import (
    ArchiveReadParams,
    Backend,
    JobRecord,
    JobsListParams,
    QueuesStatsParams,
)

REPO = Path(__file__).resolve().parents[2]
APP_PATH = "tests.e2e.e2e_app:app"

T = TypeVar("T")


def conveyor_argv(db: str, *args: str) -> list[str]:
    """The real command line: ``python -m conveyor --db URL ...`` with this interpreter."""
    return [sys.executable, "-m", "conveyor", "--db", db, *args]


def worker_argv(db: str, *args: str) -> list[str]:
    """``conveyor worker`` for the e2e app, logging at INFO (start, rescues, stop with its counters)."""
    return conveyor_argv(db, "-v", "worker", APP_PATH, *args)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2E_") and k != "CONVEYOR_DATABASE_URL"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class Proc:
    """One subprocess whose output goes to a file (a pipe nobody reads could block it)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Procs:
    """Starts subprocesses and, at teardown, kills (by pid) any that still run."""

    directory: Path
    started: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Proc:
        log = self.directory / f"{name}.{len(self.started)}.log"
        out = open(log, "wb")  # noqa: SIM115 - the child owns it; closed right after the fork
        try:
            popen = subprocess.Popen(
                list(argv), cwd=REPO, env=child_env(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            out.close()
        proc = Proc(name, popen, log)
        self.started.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.started:
            # The process's own group (start_new_session): a prefork supervisor's children and what a
            # handler forked go too, also once the process itself has exited (they outlive it, and keep
            # its pid as their group's id, so that no other process can be given it meanwhile). Only
            # groups this fixture created are signalled.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)

    def outputs(self) -> str:
        return "\n".join(
            f"----- {p.name} (pid {p.pid}, rc {p.popen.poll()}) -----\n{p.output()[-4000:]}" for p in self.started
        )


def wait_until(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy (and return that); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def now() -> datetime:
    return datetime.now(UTC)


class Db:
    """Reads the queue's state through the Backend API (the same on every engine)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.backend: Backend = open_backend(url)

    def close(self) -> None:
        self.backend.close()

    def live(self) -> list[JobRecord]:
        rows: list[JobRecord] = []
        after = None
        while True:
            page = self.backend.jobs_list(JobsListParams(limit=5000, after=after))
            rows.extend(page)
            if len(page) < 5000:
                return rows
            after = page[-1].id

    def held_by(self, worker_id: str) -> int:
        """How many live jobs are leased to ``worker_id``."""
        return sum(1 for r in self.live() if r.state == "processing" and r.worker_id == worker_id)

    def archived(self) -> list[JobRecord]:
        rows: list[JobRecord] = []
        after: tuple[datetime, UUID] | None = None
        while True:
            page = self.backend.archive_read(ArchiveReadParams(after, limit=5000))
            rows.extend(page)
            if len(page) < 5000:
                return rows
            last = page[-1]
            assert last.finished_at is not None
            after = (last.finished_at, last.id)

    def terminal_counts(self) -> Counter[str]:
        """Counts by state over every queue, from queues_stats (cheap enough to poll)."""
        out: Counter[str] = Counter()
        for s in self.backend.queues_stats(QueuesStatsParams(now())):
            out["completed"] += s.completed
            out["dead"] += s.dead
            out["expired"] += s.expired
            out["pending"] += s.pending + s.scheduled
            out["processing"] += s.processing
        return out


def iter_lines(path: Path) -> Iterator[list[str]]:
    if not path.exists():
        return
    with open(path) as f:
        for line in f:
            yield line.split()


def pids_logging(run_log: Path, event: str) -> list[int]:
    """Distinct pids that logged ``event``, in order of first appearance."""
    seen: dict[int, None] = {}
    for fields in iter_lines(run_log):
        if fields[0] == event:
            seen.setdefault(int(fields[4]), None)
    return list(seen)


def at_least(pids: list[int], n: int) -> list[int] | None:
    return pids if len(pids) >= n else None
