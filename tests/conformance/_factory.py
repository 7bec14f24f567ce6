"""Helpers for the conformance suite: a job factory, a fixed clock and thin calls on the seam.

Every helper goes through the ``Backend`` Protocol only, so each test runs unchanged on every
engine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from conveyor._ids import uuid7
from conveyor.backends.base import (
    Backend,
    Delivery,
    ErrorInfo,
    Finish,
    JobGetParams,
    JobRecord,
    JobsAcquireParams,
    JobsFinishParams,
    JobsInsertParams,
    JobsListParams,
    JobsRetryParams,
    NewJob,
    RetryItem,
)

#: The suite's fixed "now": every test passes times explicitly, none reads the wall clock.
T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
VT = 30.0  # a visibility timeout in seconds


def at(seconds: float) -> datetime:
    """``T0`` plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def new_job(queue: str = "default", **overrides: Any) -> NewJob:
    """A ready job with sensible defaults and a fresh UUIDv7 (so creation order is id order)."""
    job = NewJob(
        id=uuid7(),
        queue=queue,
        task="tasks.add",
        payload=json.dumps({"x": 1}),
        headers=json.dumps({"schema_version": 1}),
        priority=0,
        run_at=T0,
        max_attempts=5,
        max_deliveries=10,
    )
    return replace(job, **overrides)


def insert(backend: Backend, *jobs: NewJob, now: datetime = T0) -> list[UUID]:
    return backend.jobs_insert_many(JobsInsertParams(jobs=list(jobs), now=now))


def acquire(
    backend: Backend,
    queue: str = "default",
    limit: int = 10,
    now: datetime = T0,
    visibility_timeout: float = VT,
    worker_id: str = "worker-1",
    start: int | None = None,
) -> list[Delivery]:
    """Lease up to ``limit`` jobs; by default all of them are started too (counted as delivered),
    as a worker with that many idle slots does. ``start=0`` only leases them (a prefetch)."""
    return backend.jobs_acquire(
        JobsAcquireParams(
            queue=queue,
            limit=limit,
            visibility_timeout=visibility_timeout,
            worker_id=worker_id,
            now=now,
            start=limit if start is None else start,
        )
    )


def complete(backend: Backend, *deliveries: Delivery, now: datetime = T0, result: str | None = None) -> int:
    return backend.jobs_finish_many(
        JobsFinishParams(
            items=[Finish(id=d.id, receipt=d.receipt, state="completed", result=result) for d in deliveries],
            now=now,
        )
    )


def dead(
    backend: Backend,
    *deliveries: Delivery,
    now: datetime = T0,
    reason: str = "max_attempts_exceeded",
    error: ErrorInfo | None = None,
) -> int:
    error = error or ErrorInfo(type="RuntimeError", message="boom", traceback="Traceback ...")
    return backend.jobs_finish_many(
        JobsFinishParams(
            items=[Finish(id=d.id, receipt=d.receipt, state="dead", reason=reason, error=error) for d in deliveries],
            now=now,
        )
    )


def retry(backend: Backend, delivery: Delivery, run_at: datetime, now: datetime = T0) -> int:
    return backend.jobs_retry_many(
        JobsRetryParams(
            items=[
                RetryItem(
                    id=delivery.id,
                    receipt=delivery.receipt,
                    run_at=run_at,
                    error=ErrorInfo(type="IOError", message="flaky", traceback="tb"),
                )
            ],
            now=now,
        )
    )


def get(backend: Backend, job_id: UUID) -> JobRecord:
    """The job's record; fails the test if the job does not exist."""
    record = backend.job_get(JobGetParams(id=job_id))
    assert record is not None, f"job {job_id} not found"
    return record


def live_ids(backend: Backend, queue: str | None = None) -> list[UUID]:
    return [r.id for r in backend.jobs_list(JobsListParams(queue=queue))]


def ids(items: Sequence[Delivery | JobRecord]) -> list[UUID]:
    return [item.id for item in items]


def make_dead(backend: Backend, count: int, queue: str = "default", **overrides: Any) -> list[UUID]:
    """Insert ``count`` jobs into ``queue`` and dead-letter them all at ``T0``; return their ids."""
    jobs = [new_job(queue, **overrides) for _ in range(count)]
    insert(backend, *jobs)
    deliveries = acquire(backend, queue=queue, limit=count)
    assert len(deliveries) == count
    assert dead(backend, *deliveries) == count
    return [job.id for job in jobs]
