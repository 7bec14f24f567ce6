"""Entry points for the multi-process tests; importable by name so that ``spawn`` children find them."""

from __future__ import annotations

from datetime import datetime
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

from conveyor.backends import open_backend
from conveyor.backends.base import Finish, JobsAcquireParams, JobsFinishParams


def drain(url: str, queue: str, now: datetime, worker_id: str, barrier: Barrier, results: Queue[Any]) -> None:
    """Acquire and complete jobs of ``queue`` at ``now`` in small batches until none are left;
    put the ids seen."""
    backend = open_backend(url)
    seen: list[str] = []
    try:
        barrier.wait(timeout=60)
        while True:
            batch = backend.jobs_acquire(
                JobsAcquireParams(queue=queue, limit=3, visibility_timeout=300, worker_id=worker_id, now=now)
            )
            if not batch:
                break
            seen.extend(str(d.id) for d in batch)
            backend.jobs_finish_many(
                JobsFinishParams(items=[Finish(id=d.id, receipt=d.receipt, state="completed") for d in batch], now=now)
            )
    finally:
        backend.close()
        results.put((worker_id, seen))


def migrate(url: str, worker_id: str, barrier: Barrier, results: Queue[Any]) -> None:
    """Call migrate() once, as close as possible to the other processes; put what it applied."""
    backend = open_backend(url)
    outcome: list[str] | str
    try:
        barrier.wait(timeout=60)
        outcome = backend.migrate()
    except Exception as exc:
        # Reported as a value so that the test fails with the error instead of timing out.
        outcome = f"error: {exc!r}"
    finally:
        backend.close()
    results.put((worker_id, outcome))
