"""The rescue loop: returns jobs whose lease expired (their worker died or hung) to pending."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime

from conveyor.backends.base import JobsRescueParams
from conveyor.worker._calls import BackendCalls
from conveyor.worker._service import Service
from conveyor.worker._state import Counters

log = logging.getLogger("conveyor.worker")


class Rescuer(Service):
    """Every ``interval`` seconds (jittered, so that many workers do not all rescue at once).

    A round is skipped while ``ready()`` is false: the worker passes "my completer has nothing left to
    write", because after a database outage longer than a lease this worker's own finished jobs have
    expired leases too, and rescuing them before their acks land would run them a second time."""

    name = "rescuer"

    def __init__(
        self,
        calls: BackendCalls,
        counters: Counters,
        clock: Callable[[], datetime],
        interval: float = 5.0,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__()
        self.calls = calls
        self.counters = counters
        self.clock = clock
        self.interval = interval
        self.ready = ready

    def next_interval(self) -> float:
        return self.interval * random.uniform(0.5, 1.5)

    async def run_once(self) -> int:
        """Rescue expired leases now; return how many jobs went back to pending."""
        if not self.ready():
            return 0
        total = 0
        limit = JobsRescueParams(self.clock()).limit  # the default
        while True:
            n, limit = await self.calls.call_limited(
                self.calls.backend.jobs_rescue_expired,
                limit,
                lambda rows: JobsRescueParams(self.clock(), rows),
                give_up=lambda: self.stopping,
                what="rescue",
            )
            total += n
            if n < limit:
                break
        if total:
            self.counters.rescued += total
            log.info("rescued %d job(s) with expired leases", total)
        return total
