"""The heartbeat loop: extends the leases of every delivery this worker holds."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from functools import partial

from conveyor._task import DEFAULT_VISIBILITY_TIMEOUT
from conveyor.backends.base import Delivery, LeaseRef, LeasesExtendParams
from conveyor.worker._calls import BackendCalls
from conveyor.worker._service import Service
from conveyor.worker._state import Counters, Registry
from conveyor.worker.completer import Completer

log = logging.getLogger("conveyor.worker")


class Heartbeat(Service):
    """Every ``visibility_timeout / 3`` extends the leases of held deliveries (buffered, running, and
    finished with their outcome not yet written).

    Buffered deliveries are extended too: a job waiting in the prefetch buffer behind slow handlers
    must not be rescued and handed to another worker meanwhile. A lease found gone is marked lost,
    so a buffered job is not started and a running one's outcome is known to be stale. The starts of
    jobs found running are handed to the completer to be counted now rather than with their outcome,
    so that the start of a job that runs long is known should this worker die under it."""

    name = "heartbeat"
    #: How often the loop re-reads the registry. The interval depends on what is held, and a
    #: short-lease delivery acquired while the loop slept on a long interval (e.g. the 10 s of an
    #: empty registry) must be extended before its lease runs out, not after the old sleep ends.
    TICK = 0.1

    def __init__(
        self,
        calls: BackendCalls,
        registry: Registry,
        counters: Counters,
        clock: Callable[[], datetime],
        interval: float | None = None,
        completer: Completer | None = None,
    ) -> None:
        super().__init__()
        self.calls = calls
        self.registry = registry
        self.counters = counters
        self.clock = clock
        self.beat = interval
        self.completer = completer
        self._last = time.monotonic()

    def beat_interval(self) -> float:
        """A third of the shortest lease held (or the configured interval)."""
        if self.beat is not None:
            return self.beat
        leases = [h.visibility_timeout for h in self.registry.held.values()]
        return max(0.2, min(leases, default=DEFAULT_VISIBILITY_TIMEOUT) / 3)

    def next_interval(self) -> float:
        return min(self.TICK, self.beat_interval())

    @property
    def last(self) -> float:
        """When the last round was due (``time.monotonic()``)."""
        return self._last

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.beat_interval():
            return False
        self._last = now
        return True

    def leases(self, but: Delivery | None = None) -> dict[float, list[LeaseRef]]:
        """The leases to extend, by visibility timeout: every held delivery's but ``but``'s and those
        found lost. A job whose outcome is queued keeps its lease too: its finish may fail for longer
        than the lease (a statement timeout, a lock) while the database is otherwise there, and a
        lease let go then is rescued, and the job runs again though it completed."""
        groups: dict[float, list[LeaseRef]] = defaultdict(list)
        for held in list(self.registry.held.values()):
            if not held.lost and held.delivery is not but:
                groups[held.visibility_timeout].append(LeaseRef(held.delivery.id, held.delivery.receipt))
        return groups

    async def run_once(self) -> int:
        """Extend every held lease; return how many were extended."""
        groups = self.leases()
        if self.completer is not None:
            for held in list(self.registry.held.values()):
                if held.state == "running" and not held.counted and not held.lost:
                    self.completer.count_start(LeaseRef(held.delivery.id, held.delivery.receipt))
        extended = 0
        for vt, refs in groups.items():
            ids = set(
                await self.calls.call_batch(
                    self.calls.backend.leases_extend_many,
                    refs,
                    partial(LeasesExtendParams, visibility_timeout=vt, now=self.clock(), wait=False),
                    give_up=lambda: self.stopping,
                    what="heartbeat",
                )
            )
            extended += len(ids)
            for ref in refs:
                entry = self.registry.get(ref.id, ref.receipt)
                if ref.id not in ids and entry is not None and entry.state != "finishing":
                    entry.lost = True
                    self.counters.lost_leases += 1
                    log.warning("lease of job %s was lost (expired and rescued)", ref.id)
        return extended
