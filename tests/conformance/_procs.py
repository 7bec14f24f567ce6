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


def send_until_full(
    url: str, max_depth: int, batch: int, worker_id: str, barrier: Barrier, results: Queue[Any]
) -> None:
    """Send batches of ``batch`` jobs to the queue ``bounded`` (declared with ``max_depth``, every
    priority class refused at the mark) until QueueFull; put how many were accepted."""
    from conveyor import App, Message, QueueFull

    app = App(url)
    app.queue("bounded", max_depth=max_depth, shedding={"low": 1.0, "normal": 1.0, "high": 1.0})
    sent: int | str = 0
    try:
        _ = app.backend  # connected before the start, so that every process starts sending at once
        barrier.wait(timeout=60)
        while True:
            app.send_many([Message("t", {"by": worker_id}, queue="bounded") for _ in range(batch)])
            sent += batch
    except QueueFull:
        pass
    except Exception as exc:
        sent = f"error: {exc!r}"  # reported, so that the test fails with the error instead of timing out
    finally:
        app.close()
    results.put((worker_id, sent))
