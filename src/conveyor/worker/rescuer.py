"""The rescue loop: returns jobs whose lease expired (their worker died or hung) to pending."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from datetime import datetime

from conveyor.backends.base import JobsRescueParams
from conveyor.worker._shared import BackendCalls, Counters, log


class Rescuer:
    """Every ``interval`` seconds (jittered, so that many workers do not all rescue at once).

    A round is skipped while ``ready()`` is false: the worker passes "my completer has nothing left to
    write", because after a database outage longer than a lease this worker's own finished jobs have
    expired leases too, and rescuing them before their acks land would run them a second time."""

    def __init__(
        self,
        calls: BackendCalls,
        counters: Counters,
        clock: Callable[[], datetime],
        interval: float = 5.0,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.ready = ready
        self.calls = calls
        self.counters = counters
        self.clock = clock
        self.interval = interval
        self._stop = asyncio.Event()

    async def run_once(self) -> int:
        """Rescue expired leases now; return how many jobs went back to pending."""
        total = 0
        if not self.ready():
            return 0
        while True:
            n = await self.calls.call(
                self.calls.backend.jobs_rescue_expired,
                JobsRescueParams(self.clock()),
                give_up=self._stop.is_set,
                what="rescue",
            )
            total += n
            if n < JobsRescueParams(self.clock()).limit:
                break
        if total:
            self.counters.rescued += total
            log.info("rescued %d job(s) with expired leases", total)
        return total

    async def run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval * random.uniform(0.5, 1.5))
            if self._stop.is_set():
                return
            try:
                await self.run_once()
            except Exception:
                log.exception("rescue failed")

    def stop(self) -> None:
        self._stop.set()
