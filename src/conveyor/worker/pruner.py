"""The pruner loop: enforces archive retention and drops expired keys, in bounded batches."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime

from conveyor._app import App
from conveyor._queue import QueuePolicy
from conveyor.backends.base import ArchivePruneParams, KeysPruneParams
from conveyor.worker._shared import BackendCalls, log


class Pruner:
    """Every ``interval`` seconds deletes archived rows past their queue's retention and expired
    idempotency/processed keys, ``batch`` rows per statement with a pause between statements, so that
    pruning a large backlog never holds locks or I/O long enough to stall the workers."""

    def __init__(
        self,
        app: App,
        calls: BackendCalls,
        clock: Callable[[], datetime],
        interval: float = 60.0,
        batch: int = 10_000,
        pause: float = 0.05,
    ) -> None:
        self.app = app
        self.calls = calls
        self.clock = clock
        self.interval = interval
        self.batch = batch
        self.pause = pause
        self._stop = asyncio.Event()

    def params(self, now: datetime) -> ArchivePruneParams:
        defaults = QueuePolicy("*")
        return ArchivePruneParams(
            now=now,
            default_before=now - defaults.retention,
            default_dead_before=now - defaults.dead_retention,
            before={q: now - p.retention for q, p in self.app.queues.items()},
            dead_before={q: now - p.dead_retention for q, p in self.app.queues.items()},
            limit=self.batch,
        )

    async def run_once(self) -> int:
        """Prune until nothing is left past retention; return how many rows and keys went."""
        total = 0
        while not self._stop.is_set():
            deleted = await self.calls.call(
                self.calls.backend.archive_prune, self.params(self.clock()), give_up=self._stop.is_set, what="prune"
            )
            total += deleted
            if deleted < self.batch:
                break
            await asyncio.sleep(self.pause)
        while not self._stop.is_set():
            deleted = await self.calls.call(
                self.calls.backend.keys_prune,
                KeysPruneParams(self.clock(), self.batch),
                give_up=self._stop.is_set,
                what="prune keys",
            )
            total += deleted
            if deleted < self.batch:
                break
            await asyncio.sleep(self.pause)
        if total:
            log.info("pruned %d archived row(s) and expired key(s)", total)
        return total

    async def run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval)
            if self._stop.is_set():
                return
            try:
                await self.run_once()
            except Exception:
                log.exception("pruning failed")

    def stop(self) -> None:
        self._stop.set()
