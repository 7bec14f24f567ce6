"""Helpers for the PostgreSQL-specific tests: a fixed clock, a job factory, thin seam calls."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from conveyor._ids import uuid7
from conveyor.backends.base import (
    Backend,
    Delivery,
    Finish,
    JobsAcquireParams,
    JobsFinishParams,
    JobsInsertParams,
    JobsListParams,
    NewJob,
)

#: A fixed "now" far from the wall clock, so rows it stamps land in the DEFAULT archive partition.
T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def make_job(queue: str = "default", **overrides: Any) -> NewJob:
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
    backend: Backend, queue: str = "default", limit: int = 10, now: datetime = T0, worker_id: str = "w"
) -> list[Delivery]:
    return backend.jobs_acquire(
        JobsAcquireParams(queue=queue, limit=limit, visibility_timeout=30.0, worker_id=worker_id, now=now)
    )


def complete(backend: Backend, *deliveries: Delivery, now: datetime = T0) -> int:
    items = [Finish(id=d.id, receipt=d.receipt, state="completed") for d in deliveries]
    return backend.jobs_finish_many(JobsFinishParams(items=items, now=now))


def live_ids(backend: Backend, queue: str | None = None) -> list[UUID]:
    return [r.id for r in backend.jobs_list(JobsListParams(queue=queue))]
