"""The kit users test their own tasks with.

``App("memory://")`` (or ``App(backend=MemoryBackend())``) gives an in-process queue: the SQLite engine on a
private in-memory database, so the kit runs the very SQL a SQLite deployment runs. Then, in a test::

    job = send_welcome.delay(user_id=1)
    assert_enqueued(app, send_welcome, user_id=1)
    result = drain(app)                       # runs every job inline, retries included
    assert result.completed == 1

``drain`` and ``run_job`` run jobs through the real worker code (the same outcome policy, backoff and
dead-lettering as production); instead of sleeping through backoff delays they move their clock forward
to the next scheduled job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor._app import App
from conveyor._clock import host_now
from conveyor._job import JobStatus
from conveyor._limits import MAX_SECONDS
from conveyor._task import Task
from conveyor.backends.base import JobRecord, JobsListParams
from conveyor.backends.sqlite import MemoryBackend
from conveyor.worker._config import WorkerConfig
from conveyor.worker._loops import build_loops

__all__ = ["DrainResult", "MemoryBackend", "assert_enqueued", "drain", "enqueued", "run_job"]


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a drain ran: counts by outcome (``retried`` counts attempts that were retried)."""

    started: int
    completed: int
    retried: int
    dead: int
    expired: int


def enqueued(app: App, task: str | Task[Any, Any] | None = None, *, queue: str | None = None) -> list[JobRecord]:
    """Live (pending or processing) jobs, optionally of one task and/or queue, in enqueue order."""
    name = task.name if isinstance(task, Task) else task
    rows: list[JobRecord] = []
    after = None
    while True:
        page = app.backend.jobs_list(JobsListParams(queue=queue, after=after, limit=1000))
        rows.extend(r for r in page if name is None or r.task == name)
        if len(page) < 1000:
            return rows
        after = page[-1].id


def assert_enqueued(
    app: App,
    task: str | Task[Any, Any],
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    count: int | None = None,
    **fields: Any,
) -> list[JobRecord]:
    """Assert that jobs for ``task`` are enqueued whose payload contains ``payload`` / ``fields``.

    ``count`` asserts how many match (default: at least one). Returns the matching jobs."""
    import json

    expected = {**(payload or {}), **fields}
    matching = [r for r in enqueued(app, task, queue=queue) if _contains(json.loads(r.payload), expected)]
    name = task.name if isinstance(task, Task) else task
    if count is None and not matching:
        raise AssertionError(f"no job enqueued for {name} with payload containing {expected!r}")
    if count is not None and len(matching) != count:
        raise AssertionError(f"expected {count} job(s) for {name} with {expected!r}, found {len(matching)}")
    return matching


def _contains(payload: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    return all(key in payload and payload[key] == value for key, value in expected.items())


def drain(app: App, queues: Sequence[str] | None = None, *, max_jobs: int = 100_000) -> DrainResult:
    """Run every job of ``queues`` (default: all declared) inline until none is left, retries included.

    Time jumps forward to each scheduled job instead of sleeping; a job due in the last century a datetime
    holds (parked for good: ``run_at`` near the latest time a job may carry) is left pending. Raises
    RuntimeError past ``max_jobs`` starts (a job that retries forever)."""
    return asyncio.run(_drain(app, queues, max_jobs, None))


def run_job(
    app: App, task: str | Task[Any, Any], payload: Mapping[str, Any] | None = None, **envelope: Any
) -> JobStatus:
    """Send one job and run it (and its retries) through the real policy; return its final status."""
    job = app.send(task, payload, **envelope)
    queue = job.status().queue
    asyncio.run(_drain(app, [queue], 10_000, job.id))
    return job.status()


#: ``drain`` leaves pending the jobs due after this time: its clock cannot move there and still lease a job (a
#: lease may last ``MAX_SECONDS``). A job due then is parked for good (``run_at=_message.LATEST``, say); moving the
#: clock to it failed the drain ("not a visibility timeout").
_HORIZON = datetime.max.replace(tzinfo=UTC) - timedelta(seconds=MAX_SECONDS, days=1)


class _Clock:
    """Real time plus an offset that only grows: what ``drain`` uses to skip backoff delays."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return host_now() + self.offset


async def _drain(app: App, queues: Sequence[str] | None, max_jobs: int, until: Any) -> DrainResult:
    lanes = list(queues) if queues else app.catalogue.declared_queues()
    clock = _Clock()
    # The worker's own loops, driven a round at a time: one slot, a buffer of 100, long leases.
    config = WorkerConfig(concurrency=1, prefetch=100, visibility_timeout=3600, worker_id="conveyor.testing")
    loops = build_loops(app.catalogue, app.producer, app.backend, config, lanes, clock, db_threads=1)
    counters = loops.counters
    try:
        while counters.started + counters.expired + counters.dead <= max_jobs:
            if until is not None and app.handle(until).status().done:
                break
            ran = 0
            await loops.fetcher.run_once()
            for delivery in loops.buffer.drain():
                await loops.executor.process(delivery)
                ran += 1
            await loops.completer.run_once()
            if ran:
                continue
            upcoming = [
                r.run_at for q in lanes for r in enqueued(app, queue=q) if r.state == "pending" and r.run_at <= _HORIZON
            ]
            if not upcoming:
                break
            # Nothing is ready: move the clock to the next scheduled job rather than sleep.
            clock.offset += max(min(upcoming) - clock(), timedelta(0))
        else:
            raise RuntimeError(f"drain ran more than {max_jobs} jobs; is a job retrying forever?")
    finally:
        loops.calls.shutdown()
    return DrainResult(counters.started, counters.completed, counters.retried, counters.dead, counters.expired)
