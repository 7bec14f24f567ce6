"""The job mix of the chaos runs, loaded by real worker processes as ``tests.chaos.mix_app:app``.

One task per kind of job, each with the policy the checker expects of it (see ``EXPECTED`` in
``_checker.py``). Every handler run writes its own history to an append-only file, so that the
checker sees every run, also the ones whose outcome the queue never recorded:

``start <job> <task> <deliveries> <attempt> <pid> <time>`` when the handler starts, and
``end ... <outcome>`` when it returns or raises (``ok``, or the exception's type). A run with no
``end`` line ended with its process (killed, crashed, or still hanging when the worker stopped).

Each line is one ``write`` to a file opened with ``O_APPEND``: lines from many processes never
interleave. Configuration comes from the environment, read at import time, so that a harness sets it
for its worker subprocesses (``MixConfig.env``) and registers the same tasks on its producer app.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from conveyor import App, JobContext

QUEUE = "chaos"

#: Task name of each kind of job.
FAST = "chaos.fast"
LONG = "chaos.long"
FLAKY = "chaos.flaky"
DOOMED = "chaos.doomed"
PERMANENT = "chaos.permanent"
NUL_RESULT = "chaos.nul_result"
NUL_ERROR = "chaos.nul_error"
NUL_FLAKY = "chaos.nul_flaky"
SYSTEM_EXIT = "chaos.system_exit"
KEYBOARD = "chaos.keyboard_interrupt"
CRASH = "chaos.crash"
HANG = "chaos.hang"

KINDS = (FAST, LONG, FLAKY, DOOMED, PERMANENT, NUL_RESULT, NUL_ERROR, NUL_FLAKY, SYSTEM_EXIT, KEYBOARD, CRASH, HANG)
#: The handlers that misbehave on purpose.
HOSTILE = (NUL_RESULT, NUL_ERROR, NUL_FLAKY, SYSTEM_EXIT, KEYBOARD, CRASH, HANG)

#: Attempts of every task but ``flaky`` (which needs more than it fails).
MAX_ATTEMPTS = 3
FLAKY_MAX_ATTEMPTS = 5
#: ``flaky`` fails this many attempts, then succeeds.
FLAKY_FAILURES = 2
#: A ``crash`` job may start this many times before poison protection dead-letters it.
CRASH_MAX_DELIVERIES = 2
#: The ``hang`` task's timeout: its first attempt sleeps far past it.
HANG_TIMEOUT = 1.0
#: Retries wait this long (a fixed schedule), so that backoff does not dominate a run.
BACKOFF = [0.1]


class TransientError(Exception):
    """A failure a retry can fix (not in the tasks' ``dead_on``)."""


@dataclass(frozen=True)
class MixConfig:
    """What the workers and the producer must agree on."""

    run_log: str | None = None
    #: Lease length of every task; heartbeats extend it every third of it.
    visibility_timeout: float = 2.0
    #: Seconds a ``fast`` job sleeps (0: none).
    fast_sleep: float = 0.0
    #: Seconds a ``long`` job runs: longer than its lease, so only heartbeats keep it.
    long_seconds: float = 5.0
    #: Seconds the first attempt of a ``hang`` job sleeps (far past ``HANG_TIMEOUT``).
    hang_seconds: float = 20.0

    @classmethod
    def from_env(cls) -> MixConfig:
        def num(name: str, default: float) -> float:
            raw = os.environ.get(name)
            return float(raw) if raw else default

        d = cls()
        return cls(
            run_log=os.environ.get("CHAOS_RUN_LOG") or None,
            visibility_timeout=num("CHAOS_VISIBILITY_TIMEOUT", d.visibility_timeout),
            fast_sleep=num("CHAOS_FAST_SLEEP", d.fast_sleep),
            long_seconds=num("CHAOS_LONG_SECONDS", d.long_seconds),
            hang_seconds=num("CHAOS_HANG_SECONDS", d.hang_seconds),
        )

    def env(self) -> dict[str, str]:
        """The environment a worker process needs to run this configuration."""
        out = {
            "CHAOS_VISIBILITY_TIMEOUT": repr(self.visibility_timeout),
            "CHAOS_FAST_SLEEP": repr(self.fast_sleep),
            "CHAOS_LONG_SECONDS": repr(self.long_seconds),
            "CHAOS_HANG_SECONDS": repr(self.hang_seconds),
        }
        if self.run_log:
            out["CHAOS_RUN_LOG"] = self.run_log
        return out


def register(app: App, config: MixConfig) -> None:
    """Register the chaos tasks on ``app`` (the workers' app, or a harness's producer app)."""
    log_path = config.run_log
    vt = config.visibility_timeout

    def record(event: str, ctx: JobContext, outcome: str = "-") -> None:
        if log_path is None:
            return
        line = (
            f"{event} {ctx.job_id} {ctx.task} {ctx.deliveries} {ctx.attempt} {os.getpid()} "
            f"{time.time():.6f} {outcome}\n"
        )
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def recorded(ctx: JobContext, body: Any) -> Any:
        """Run ``body()`` between a ``start`` and an ``end`` line (the end names the outcome)."""
        record("start", ctx)
        try:
            result = body()
        except BaseException as exc:
            record("end", ctx, type(exc).__name__)
            raise
        record("end", ctx, "ok")
        return result

    common: dict[str, Any] = {"queue": QUEUE, "backoff": BACKOFF, "visibility_timeout": vt}

    @app.task(name=FAST, max_attempts=MAX_ATTEMPTS, **common)
    async def fast(n: int, ctx: JobContext) -> dict[str, int]:
        # The one async handler of the mix: it runs on the worker's event loop, the others in threads.
        record("start", ctx)
        try:
            if config.fast_sleep:
                await asyncio.sleep(config.fast_sleep)
        except BaseException as exc:  # cancelled: the worker's loop is going away
            record("end", ctx, type(exc).__name__)
            raise
        record("end", ctx, "ok")
        return {"n": n}

    @app.task(name=LONG, max_attempts=MAX_ATTEMPTS, **common)
    def long(n: int, ctx: JobContext) -> dict[str, int]:
        def body() -> dict[str, int]:
            time.sleep(config.long_seconds)
            return {"n": n}

        return dict(recorded(ctx, body))

    @app.task(name=FLAKY, max_attempts=FLAKY_MAX_ATTEMPTS, **common)
    def flaky(n: int, ctx: JobContext) -> dict[str, int]:
        def body() -> dict[str, int]:
            if ctx.attempt <= FLAKY_FAILURES:
                raise TransientError(f"job {n}: transient failure, attempt {ctx.attempt}")
            return {"n": n}

        return dict(recorded(ctx, body))

    @app.task(name=DOOMED, max_attempts=MAX_ATTEMPTS, **common)
    def doomed(n: int, ctx: JobContext) -> None:
        def body() -> None:
            raise TransientError(f"job {n}: transient failure, attempt {ctx.attempt}")

        recorded(ctx, body)

    @app.task(name=PERMANENT, max_attempts=MAX_ATTEMPTS, **common)
    def permanent(n: int, ctx: JobContext) -> None:
        def body() -> None:
            raise ValueError(f"job {n}: permanent failure")

        recorded(ctx, body)

    @app.task(name=NUL_RESULT, max_attempts=MAX_ATTEMPTS, **common)
    def nul_result(n: int, ctx: JobContext) -> str:
        return str(recorded(ctx, lambda: f"head-{n}\x00tail-{n}"))

    @app.task(name=NUL_ERROR, max_attempts=MAX_ATTEMPTS, **common)
    def nul_error(n: int, ctx: JobContext) -> None:
        def body() -> None:
            raise ValueError(f"head-{n}\x00tail-{n}")

        recorded(ctx, body)

    @app.task(name=NUL_FLAKY, max_attempts=MAX_ATTEMPTS, **common)
    def nul_flaky(n: int, ctx: JobContext) -> dict[str, int]:
        def body() -> dict[str, int]:
            if ctx.attempt == 1:
                raise TransientError(f"head-{n}\x00tail-{n}")
            return {"n": n}

        return dict(recorded(ctx, body))

    @app.task(name=SYSTEM_EXIT, max_attempts=MAX_ATTEMPTS, **common)
    def system_exit(n: int, ctx: JobContext) -> dict[str, int]:
        def body() -> dict[str, int]:
            if ctx.attempt == 1:
                # What argparse, click or a library's sys.exit() does inside a handler.
                raise SystemExit(f"job {n}: a library called sys.exit()")
            return {"n": n}

        return dict(recorded(ctx, body))

    @app.task(name=KEYBOARD, max_attempts=MAX_ATTEMPTS, **common)
    def keyboard_interrupt(n: int, ctx: JobContext) -> dict[str, int]:
        def body() -> dict[str, int]:
            if ctx.attempt == 1:
                raise KeyboardInterrupt  # raised by code, not by a signal
            return {"n": n}

        return dict(recorded(ctx, body))

    @app.task(name=CRASH, max_attempts=MAX_ATTEMPTS, max_deliveries=CRASH_MAX_DELIVERIES, **common)
    def crash(n: int, ctx: JobContext) -> None:
        # A real crash (think segfault or OOM kill): no exception, no cleanup, the process is gone.
        record("start", ctx)
        os._exit(1)

    @app.task(name=HANG, max_attempts=MAX_ATTEMPTS, timeout=HANG_TIMEOUT, **common)
    def hang(n: int, ctx: JobContext) -> dict[str, int]:
        def body() -> dict[str, int]:
            if ctx.attempt == 1:
                time.sleep(config.hang_seconds)  # a blocking call that never times out by itself
            return {"n": n}

        return dict(recorded(ctx, body))


app = App()
register(app, MixConfig.from_env())
