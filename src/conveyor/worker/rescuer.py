"""The rescue loop: returns jobs whose lease expired (their worker died or hung) to pending."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime

from conveyor._errors import StatementCancelled
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
            params = JobsRescueParams(self.clock(), limit)
            try:
                n = await self.calls.call(
                    self.calls.backend.jobs_rescue_expired,
                    params,
                    give_up=lambda: self.stopping,
                    what="rescue",
                    splits=limit > 1,
                )
            except StatementCancelled as exc:
                # Past the database's statement_timeout: fewer rows a statement (one row alone is
                # retried like an unavailable database). Before, the same statement was retried forever.
                if limit <= 1:  # given up (stopping)
                    raise
                log.warning("rescue: the database cancelled a rescue of %d (%s); trying %d", limit, exc, limit // 2)
                limit //= 2
                continue
            total += n
            if n < params.limit:
                break
        if total:
            self.counters.rescued += total
            log.info("rescued %d job(s) with expired leases", total)
        return total
