"""The presence loop: the worker's row in the worker registry (who drains what, seen when)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from datetime import datetime

from conveyor._errors import BackendCorrupt
from conveyor.backends.base import WorkerInfo, WorkersBeatParams, WorkersRemoveParams
from conveyor.worker._calls import BackendCalls
from conveyor.worker._service import Service

log = logging.getLogger("conveyor.worker")


class Presence(Service):
    """Every ``interval`` seconds (and at once when started) writes this worker's row: id, host, pid,
    queues, concurrency, when it started and ``last_seen = now``. ``app.admin.workers()`` lists the
    rows with the jobs each worker holds leases on; a worker that stops cleanly deletes its row
    (:meth:`leave`), one that dies is listed as not alive once it misses three rounds, and the pruner
    deletes it after an hour.

    A round that fails is logged and retried at the next: the registry is for operators, and a worker
    must never stop working because it could not say that it works."""

    name = "presence"
    run_first = True
    max_failures = 1_000_000

    def __init__(
        self,
        calls: BackendCalls,
        worker_id: str,
        queues: Sequence[str],
        concurrency: int,
        clock: Callable[[], datetime],
        interval: float = 10.0,
    ) -> None:
        super().__init__()
        self.calls = calls
        self.clock = clock
        self.interval = interval
        self.info = WorkerInfo(
            id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(queues),
            concurrency=concurrency,
            started_at=clock(),
            last_seen=clock(),
        )

    async def run_once(self) -> int:
        """Write this worker's row; return 1."""
        await self.calls.once(self.calls.backend.workers_beat, WorkersBeatParams(self.info, self.clock()))
        return 1

    async def leave(self) -> None:
        """Delete this worker's row (a clean stop); a failure only leaves it to go stale, unless the
        database is damaged (raised: the worker then exits ``EXIT_DAMAGED``)."""
        try:
            await self.calls.once(self.calls.backend.workers_remove, WorkersRemoveParams(self.info.id))
        except BackendCorrupt:
            raise
        except Exception as exc:  # the row then goes stale and is pruned; stopping must go on
            log.warning("could not remove worker %s from the registry: %s", self.info.id, exc)
