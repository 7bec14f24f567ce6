"""The stall watch: a thread that keeps a worker's leases while its event loop is blocked.

An ``async def`` handler that makes a blocking call (``time.sleep``, a blocking HTTP client, a long
computation) holds the event loop, and the heartbeat, which runs there, extends no lease meanwhile. Once
the loop had been blocked for longer than a lease, every job the worker held (buffered, running in the
other slots, finished with its outcome not yet written) was rescued and ran again elsewhere, though one
handler was at fault: an async handler sleeping 10 s beside 3 s leases made 15 of 59 other jobs run twice.

This thread sees a loop that ran none of its ticks for ``STALLED_AFTER`` seconds (or one heartbeat's
interval, if shorter), names what blocks it
(the job whose handler run holds the loop, and the line it is at), and while the stall lasts extends
the leases of every other job the worker holds, at the heartbeat's pace. The blocking job's lease is not
extended: a handler that keeps its worker's heartbeat from running loses its lease as before, is rescued,
and poison protection counts it. A stall longer than twice the longest lease held (at least
``KEEP_AT_LEAST`` seconds) is taken for a wedged worker: the thread stops keeping leases, says so once,
and the jobs go to other workers when their leases run out. Nothing in a process can end a blocked
call; the worker is left as it is (a supervisor or an operator decides), as before.

A ``def`` handler that holds the GIL (a C extension that never releases it) blocks this thread too:
that case is unchanged. A process that is stopped (SIGSTOP) stops this thread with the loop: that is not a
stall (see ``_watch``)."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime

from conveyor.backends.base import Delivery, LeasesExtendParams
from conveyor.worker.executor import Executor
from conveyor.worker.heartbeat import Heartbeat

log = logging.getLogger("conveyor.worker")


class StallWatch:
    """Watches one worker's event loop from a thread of its own (see the module docs)."""

    #: How often the loop ticks and the thread looks (seconds; more often for short leases, see period).
    CHECK = 0.25
    #: A loop that ran no tick for this long is blocked.
    STALLED_AFTER = 1.0
    #: Leases are kept through a stall for at least this long (and twice the longest lease held).
    KEEP_AT_LEAST = 60.0

    def __init__(self, heartbeat: Heartbeat, executor: Executor, clock: Callable[[], datetime]) -> None:
        self.heartbeat = heartbeat
        self.executor = executor
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._ticked = time.monotonic()
        self._next_tick = self.CHECK  # the period the loop's next tick was set with
        self._tick_handle: asyncio.TimerHandle | None = None
        self._stopped = threading.Event()
        # The stall under way: when the loop last ticked before it, and the delivery whose run blocks it.
        self._since: float | None = None
        self._blocker: Delivery | None = None
        self._kept_at = 0.0
        self._gave_up = False
        self._failed = False
        # When this thread last found that it had not run either (see _watch): the loop's ticks count from then.
        self._resumed = 0.0

    def start(self) -> None:
        """Start ticking on the running loop and watching from a thread (call on the loop's thread)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._tick()
        threading.Thread(target=self._watch, name="conveyor-stall-watch", daemon=True).start()

    def stop(self) -> None:
        """Stop (on the loop's thread). A round under way ends by itself: the thread is not waited for."""
        self._stopped.set()
        if self._tick_handle is not None:
            self._tick_handle.cancel()

    def stalled_after(self) -> float:
        """A loop that ran no tick for this long is blocked: ``STALLED_AFTER``, or one heartbeat's interval
        if shorter (short leases are kept from a shorter stall on: one missed heartbeat)."""
        return min(self.STALLED_AFTER, self.heartbeat.beat_interval())

    def period(self) -> float:
        """How often the loop ticks and the thread looks: well within a stall. At ``CHECK`` beside the 0.2 s
        stall of leases under 0.75 s, an idle loop was taken for blocked from the start, by no one."""
        return min(self.CHECK, self.stalled_after() / 3)

    def _tick(self) -> None:
        assert self._loop is not None
        self._ticked = time.monotonic()
        self._next_tick = self.period()
        self._tick_handle = self._loop.call_later(self._next_tick, self._tick)

    def _watch(self) -> None:
        looked, cpu = time.monotonic(), time.process_time()
        while not self._stopped.wait(self.period()):
            now, used = time.monotonic(), time.process_time()
            if now - looked > self.stalled_after() and used - cpu < (now - looked) / 2 and self._since is None:
                # This thread did not run either, and neither did the process much: it was stopped (SIGSTOP,
                # SIGTSTP, a paused container) or starved of CPU, not its loop blocked. After a SIGCONT this
                # thread often ran before the loop, and logged a stall that never was (and "runs again" a tick
                # later). A handler's C call that held the GIL meanwhile used the CPU: that stall is reported.
                self._resumed = now
            looked, cpu = now, used
            try:
                self.check(now)
            except Exception:  # a bug here must not end the watch; the loop's own heartbeat is unaffected
                log.exception("the stall watch failed")

    def check(self, now: float) -> None:
        """One look at the loop: start, keep or end a stall."""
        # The next tick may have been set before the first short lease came: it is waited for.
        if now - max(self._ticked, self._resumed) < max(self.stalled_after(), 2 * self._next_tick):
            if self._since is not None:
                log.warning("the event loop runs again after %.1f s blocked", now - self._since)
                self._since = None
            return
        if self._since is None:
            self._begin(now)
        assert self._since is not None
        held = list(self.heartbeat.registry.held.values())
        keep_for = max(self.KEEP_AT_LEAST, 2 * max((h.visibility_timeout for h in held), default=0.0))
        if now - self._since > keep_for:
            if not self._gave_up:
                self._gave_up = True
                log.error(
                    "the event loop has been blocked for %.0f s: the worker no longer keeps the leases of the %d "
                    "job(s) it holds; other workers will run them when their leases run out",
                    now - self._since,
                    len(held),
                )
            return
        if now - max(self._kept_at, self.heartbeat.last) < self.heartbeat.beat_interval():
            return
        self._kept_at = now
        self._keep()

    def _begin(self, now: float) -> None:
        self._since = max(self._ticked, self._resumed)
        self._gave_up = self._failed = False
        self._kept_at = self.heartbeat.last
        assert self._loop is not None
        self._blocker = self.executor.run_of(asyncio.current_task(self._loop))
        where = _where(self._loop_thread)
        if self._blocker is None:
            log.warning(
                "the event loop has been blocked for %.1f s%s; the worker keeps its jobs' leases meanwhile",
                now - self._since,
                where,
            )
            return
        log.warning(
            "the event loop has been blocked for %.1f s by the handler of job %s (%s)%s: an async def handler "
            "must not make blocking calls (make it a def task, or await asyncio.to_thread(...)); the worker "
            "keeps its other jobs' leases meanwhile, not this one's",
            now - self._since,
            self._blocker.id,
            self._blocker.task,
            where,
        )

    def _keep(self) -> None:
        backend = self.heartbeat.calls.backend
        for seconds, refs in self.heartbeat.leases(but=self._blocker).items():
            try:
                backend.leases_extend_many(LeasesExtendParams(refs, seconds, self.clock(), wait=False))
            except Exception as exc:  # the next round tries again; the heartbeat marks lost leases later
                if not self._failed:
                    self._failed = True
                    log.warning("the stall watch could not extend leases: %s", exc)


def _where(thread: int) -> str:
    """`` at FILE:LINE in FUNCTION``: the innermost Python frame of ``thread`` now ('' if none)."""
    frame = sys._current_frames().get(thread)
    if frame is None:
        return ""
    return f" at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
