"""The worker processes of a chaos run, started as users start them, and kept running as a process
supervisor (systemd, Kubernetes) would: a worker process that exits is started again.

Plain workers are ``conveyor worker APP``; prefork ones ``conveyor worker APP --processes N``, whose
own supervisor restarts its children. Every process gets its own session (process group), so that a
prefork tree can be killed whole and nothing outlives :meth:`Fleet.cleanup`. The fleet records
what happened to every process it saw (start, exit, exit code) in the run's :class:`Events`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class Events:
    """A thread-safe, append-only list of what the harness did and saw, each with its wall time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[dict[str, Any]] = []

    def add(self, kind: str, t: float | None = None, **fields: Any) -> dict[str, Any]:
        item = {"kind": kind, "t": time.time() if t is None else t, **fields}
        with self._lock:
            self.items.append(item)
        return item

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.items if e["kind"] == kind]


#: Seconds a worker process is given to start (interpreter, imports, its signal handlers) before the
#: final graceful stop is sent.
_START_GRACE = 3.0


@dataclass
class Member:
    """One worker command line, run again whenever its process exits."""

    name: str
    argv: list[str]
    processes: int
    concurrency: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    #: When ``proc`` was started (time.monotonic()).
    started_at: float = 0.0
    generation: int = 0
    retired: bool = False
    #: Every process group this member ever started (killed at cleanup if still there).
    groups: list[int] = field(default_factory=list)
    #: The prefork children seen alive at the last look (for exits the supervisor restarts).
    children: set[int] = field(default_factory=set)

    @property
    def prefork(self) -> bool:
        return self.processes > 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def prefork_children(pid: int) -> list[int]:
    """A prefork supervisor's worker processes (not multiprocessing's resource tracker)."""
    out = []
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    for child in children:
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
        except OSError:
            continue
    return out


class Fleet:
    """Starts, watches, restarts and finally stops the worker processes of one run."""

    def __init__(
        self,
        directory: Path,
        database_url: str,
        app_path: str,
        env: Mapping[str, str],
        events: Events,
        restart_delay: float = 0.2,
    ) -> None:
        self.directory = directory
        self.database_url = database_url
        self.app_path = app_path
        self.env = dict(env)
        self.events = events
        self.restart_delay = restart_delay
        self.members: list[Member] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str, concurrency: int, processes: int = 1, extra: Sequence[str] = ()) -> Member:
        argv = [
            sys.executable, "-m", "conveyor", "--db", self.database_url, "-v", "worker", self.app_path,
            "--concurrency", str(concurrency), "--processes", str(processes), "--graceful-timeout", "10", *extra,
        ]  # fmt: skip
        member = Member(name, argv, processes, concurrency, self.directory / f"{name}.log")
        self.members.append(member)
        return member

    def _spawn(self, member: Member) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAOS_", "E2E_"))}
        env.pop("CONVEYOR_DATABASE_URL", None)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        with open(member.log, "ab") as out:
            out.write(f"===== generation {member.generation} =====\n".encode())
            out.flush()
            member.proc = subprocess.Popen(
                member.argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        member.started_at = time.monotonic()
        member.groups.append(member.proc.pid)
        member.children = set()
        role = "supervisor" if member.prefork else "worker"
        self.events.add("process_start", pid=member.proc.pid, member=member.name, role=role)

    def start(self) -> None:
        """Start every member, then watch them from a thread until :meth:`stop_all`."""
        with self._lock:
            for member in self.members:
                self._spawn(member)
        self._thread = threading.Thread(target=self._watch, name="chaos-fleet", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            with self._lock:
                for member in self.members:
                    self._look(member)

    def _look(self, member: Member) -> None:
        proc = member.proc
        if proc is None or member.retired:
            return
        if member.prefork:
            now_children = set(prefork_children(proc.pid)) if proc.poll() is None else set()
            for gone in member.children - now_children:
                self.events.add("process_exit", pid=gone, member=member.name, role="child", rc=None)
            for new in now_children - member.children:
                self.events.add("process_start", pid=new, member=member.name, role="child")
            member.children = now_children
        rc = proc.poll()
        if rc is None:
            return
        role = "supervisor" if member.prefork else "worker"
        self.events.add("process_exit", pid=proc.pid, member=member.name, role=role, rc=rc)
        for gone in member.children:
            self.events.add("process_exit", pid=gone, member=member.name, role="child", rc=None)
        member.children = set()
        # A supervisor's restart delay, then the same command line again.
        time.sleep(self.restart_delay)
        member.generation += 1
        self._spawn(member)

    def worker_pids(self) -> dict[int, Member]:
        """Every process that runs handlers now (plain workers, prefork children), by pid."""
        with self._lock:
            out: dict[int, Member] = {}
            for member in self.members:
                if not member.alive():
                    continue
                assert member.proc is not None
                if member.prefork:
                    for child in prefork_children(member.proc.pid):
                        out[child] = member
                else:
                    out[member.proc.pid] = member
            return out

    def wait_running(self, timeout: float) -> None:
        """Wait until every member runs all its worker processes."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                want = sum(m.processes for m in self.members)
            if len(self.worker_pids()) >= want:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"worker processes not all running after {timeout}s:\n{self.outputs()}")
            time.sleep(0.05)

    def kill_group(self, member: Member) -> list[int]:
        """SIGKILL a member's whole process group (a prefork tree: supervisor and children);
        return the pids that were in it. The watcher starts it again."""
        with self._lock:
            if member.proc is None or not member.alive():
                return []
            pids = [member.proc.pid, *prefork_children(member.proc.pid)]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(member.proc.pid, signal.SIGKILL)
            return pids

    def stop_all(self, timeout: float = 40.0) -> dict[str, int | None]:
        """Graceful stop (SIGTERM) of every member; return each one's exit code (None: had to be killed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        codes: dict[str, int | None] = {}
        with self._lock:
            # A member restarted a moment ago (after a kill near the end) may still be starting
            # Python, before any signal handler of the worker's exists: a SIGTERM then ends it
            # with -15, which says nothing about stopping cleanly. Give it its start first.
            youngest = max((m.started_at for m in self.members if m.proc is not None), default=0.0)
            time.sleep(max(0.0, youngest + _START_GRACE - time.monotonic()))
            for member in self.members:
                member.retired = True
                if member.proc is not None and member.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(member.proc.pid, signal.SIGCONT)
                    member.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for member in self.members:
                if member.proc is None:
                    continue
                try:
                    codes[member.name] = member.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    codes[member.name] = None
                self.events.add(
                    "process_exit", pid=member.proc.pid, member=member.name, role="final", rc=codes[member.name]
                )
        return codes

    def cleanup(self) -> None:
        """SIGKILL what is left of every process group this fleet started (only processes that are
        still in one of those groups: a group id is never signalled once its processes are gone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        groups = {g for member in self.members for g in member.groups}
        for member in self.members:
            member.retired = True
        for pid in _pids_in_groups(groups):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for member in self.members:
            if member.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    member.proc.wait(timeout=10)

    def outputs(self, tail: int = 3000) -> str:
        parts = []
        for member in self.members:
            text = member.log.read_text(errors="replace") if member.log.exists() else ""
            parts.append(f"----- {member.name} ({member.log}) -----\n{text[-tail:]}")
        return "\n".join(parts)


def _pids_in_groups(groups: set[int]) -> list[int]:
    """Processes whose process group is one of ``groups``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command (which may contain spaces) start after its closing parenthesis.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) in groups:
            out.append(int(entry.name))
    return out
