"""The pruner loop: enforces archive retention and drops expired keys, in bounded batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from conveyor._catalogue import Catalogue
from conveyor._queue import QueueOptions
from conveyor.backends.base import ArchivePruneParams, KeysPruneParams, WorkersPruneParams
from conveyor.worker._calls import BackendCalls
from conveyor.worker._service import Service

log = logging.getLogger("conveyor.worker")

#: Registry rows of workers not seen for this long are deleted (they died without removing them).
WORKERS_FORGET_AFTER = timedelta(hours=1)


class Pruner(Service):
    """Every ``interval`` seconds deletes archived rows past their queue's retention and expired
    idempotency/processed keys, ``batch`` rows per statement with a pause between statements, so that
    pruning a large backlog never holds locks or I/O long enough to stall the workers."""

    name = "pruner"

    def __init__(
        self,
        catalogue: Catalogue,
        calls: BackendCalls,
        clock: Callable[[], datetime],
        interval: float = 60.0,
        batch: int = 10_000,
        pause: float = 0.05,
    ) -> None:
        super().__init__()
        self.catalogue = catalogue
        self.calls = calls
        self.clock = clock
        self.interval = interval
        self.batch = batch
        self.pause = pause

    def params(self, now: datetime) -> ArchivePruneParams:
        defaults = QueueOptions("*")
        queues = self.catalogue.queues
        return ArchivePruneParams(
            now=now,
            default_before=now - defaults.retention,
            default_dead_before=now - defaults.dead_retention,
            before={q: now - o.retention for q, o in queues.items()},
            dead_before={q: now - o.dead_retention for q, o in queues.items()},
            limit=self.batch,
        )

    async def run_once(self) -> int:
        """Prune until nothing is left past retention; return how many rows and keys went."""
        backend = self.calls.backend
        total = await self._until_done(lambda: backend.archive_prune(self.params(self.clock())))
        total += await self._until_done(lambda: backend.keys_prune(KeysPruneParams(self.clock(), self.batch)))
        # Workers that died without leaving the registry; not counted in what was pruned.
        gone = WorkersPruneParams(self.clock() - WORKERS_FORGET_AFTER)
        await self.calls.call(backend.workers_prune, gone, give_up=lambda: self.stopping, what="prune")
        if total:
            log.info("pruned %d archived row(s) and expired key(s)", total)
        return total

    async def _until_done(self, prune: Callable[[], int]) -> int:
        """Prune in batches, with a pause between them, until a batch comes back short."""
        total = 0
        while not self.stopping:
            deleted = await self.calls.call(lambda _: prune(), None, give_up=lambda: self.stopping, what="prune")
            total += deleted
            if deleted < self.batch:
                break
            await asyncio.sleep(self.pause)
        return total
