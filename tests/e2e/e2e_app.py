"""The example app the end-to-end tests run in real worker processes.

Workers load it as ``tests.e2e.e2e_app:app`` (from the repository root); the database comes from
``--db``/``$CONVEYOR_DATABASE_URL``. Behaviour is configured from environment variables, read at
import time, so that a test sets them for its worker subprocesses:

``E2E_RUN_LOG``
    A file every handler run appends one line to (``O_APPEND``, one ``write``, so lines from
    several processes never interleave): ``<event> <job id> <delivery> <attempt> <pid> <cpus>``, the
    last the CPUs the handler's thread may run on (``0,1``; ``-`` where the platform cannot tell).
``E2E_WORK_SLEEP``
    Seconds each ``e2e.work`` run sleeps before deciding its outcome (default 0).
``E2E_VISIBILITY_TIMEOUT``
    The tasks' visibility timeout in seconds (default 2: leases of a killed worker expire fast).

The producer side (the tests) calls :func:`register` on its own ``App`` so that jobs are enqueued
with exactly the policy the workers run them under.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conveyor import App, JobContext

WORK = "e2e.work"
SLOW = "e2e.slow"
CRASH = "e2e.crash"
EXIT = "e2e.exit"
WORK_QUEUE = "e2e"
SLOW_QUEUE = "slow"
CRASH_QUEUE = "crash"

#: Attempts before a transient failure is dead-lettered.
MAX_ATTEMPTS = 3
#: Deliveries of an ``e2e.crash`` job before it counts as poison.
CRASH_MAX_DELIVERIES = 2
#: Retries wait this long (a fixed schedule), so that a run is not dominated by backoff.
BACKOFF = [0.05]

#: Outcome kinds of ``e2e.work`` (the payload's ``kind``).
OK = "ok"
TRANSIENT_ONCE = "transient_once"
PERMANENT = "permanent"
TRANSIENT_ALWAYS = "transient_always"


class TransientError(Exception):
    """A failure a retry can fix (not in the tasks' ``dead_on``)."""


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


RUN_LOG = os.environ.get("E2E_RUN_LOG") or None
WORK_SLEEP = _env_float("E2E_WORK_SLEEP", 0.0)
VISIBILITY_TIMEOUT = _env_float("E2E_VISIBILITY_TIMEOUT", 2.0)


def record(event: str, ctx: JobContext) -> None:
    """Append one line to the run log (if configured): atomic across processes thanks to O_APPEND."""
    if RUN_LOG is None:
        return
    getaffinity = getattr(os, "sched_getaffinity", None)
    cpus = ",".join(map(str, sorted(getaffinity(0)))) if getaffinity is not None else "-"
    line = f"{event} {ctx.job_id} {ctx.deliveries} {ctx.attempt} {os.getpid()} {cpus}\n".encode()
    fd = os.open(RUN_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def register(app: App) -> None:
    """Register the e2e tasks on ``app`` (the workers' app, or a test's producer app)."""

    @app.task(
        name=WORK,
        queue=WORK_QUEUE,
        max_attempts=MAX_ATTEMPTS,
        backoff=BACKOFF,
        visibility_timeout=VISIBILITY_TIMEOUT,
    )
    def work(kind: str, n: int, ctx: JobContext) -> dict[str, Any]:
        """Succeeds or fails as ``kind`` says. Attempts are counted by the database (``ctx.attempt``),
        never in process memory, so a killed and restarted worker keeps the policy exact."""
        record("run", ctx)
        if WORK_SLEEP:
            time.sleep(WORK_SLEEP)
        if kind == TRANSIENT_ONCE and ctx.attempt == 1:
            raise TransientError(f"job {n}: transient failure on the first attempt")
        if kind == PERMANENT:
            raise ValueError(f"job {n}: permanent failure")
        if kind == TRANSIENT_ALWAYS:
            raise TransientError(f"job {n}: transient failure, attempt {ctx.attempt}")
        return {"n": n, "attempt": ctx.attempt}

    @app.task(
        name=SLOW,
        queue=SLOW_QUEUE,
        max_attempts=MAX_ATTEMPTS,
        backoff=BACKOFF,
        visibility_timeout=VISIBILITY_TIMEOUT,
    )
    def slow(seconds: float, ctx: JobContext) -> dict[str, Any]:
        """Sleeps ``seconds``; logs ``start`` and ``end`` so a test can see what is in flight."""
        record("start", ctx)
        time.sleep(seconds)
        record("end", ctx)
        return {"slept": seconds}

    @app.task(
        name=CRASH,
        queue=CRASH_QUEUE,
        max_attempts=MAX_ATTEMPTS,
        max_deliveries=CRASH_MAX_DELIVERIES,
        backoff=BACKOFF,
        visibility_timeout=VISIBILITY_TIMEOUT,
    )
    def crash(ctx: JobContext) -> None:
        """A poison job: it kills the process running it (think OOM kill or segfault)."""
        record("run", ctx)
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(
        name=EXIT,
        queue=CRASH_QUEUE,
        max_attempts=CRASH_MAX_DELIVERIES,
        max_deliveries=CRASH_MAX_DELIVERIES,
        backoff=BACKOFF,
        visibility_timeout=VISIBILITY_TIMEOUT,
    )
    def exits(how: str, ctx: JobContext) -> None:
        """A hostile job: ``how="os._exit"`` ends the process at once (no cleanup: a real crash);
        ``how="SystemExit"`` raises SystemExit, as library code sometimes does; ``how="ok"`` is an
        innocent job of the same task (it sleeps ``E2E_WORK_SLEEP``, then returns); ``how="pool"`` leaves a
        ``ThreadPoolExecutor`` behind whose task never ends (Python waits for its threads at exit) and
        returns."""
        record("run", ctx)
        if how == "ok":
            time.sleep(WORK_SLEEP)
            return
        if how == "pool":
            _LEFT_BEHIND.append(ThreadPoolExecutor(1))
            _LEFT_BEHIND[-1].submit(threading.Event().wait)
            return
        if how == "os._exit":
            os._exit(1)
        if how == "os._exit(0)":
            os._exit(0)
        raise SystemExit(3)


#: What ``e2e.exit`` jobs with ``how="pool"`` left running.
_LEFT_BEHIND: list[ThreadPoolExecutor] = []

app = App()
register(app)
