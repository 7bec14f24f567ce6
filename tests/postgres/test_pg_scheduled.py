"""Scheduled jobs on PostgreSQL: a job due later waits outside the ready index (migration 0005), so an
acquire's cost does not grow with the jobs scheduled in its queue, and the backend makes it ready
(jobs_promote) by the time it is due (see conveyor.backends._promotion)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _pg import T0, acquire, at, complete, insert, make_job

from conveyor.backends._promotion import PROMOTE_BATCH, PROMOTE_EVERY
from conveyor.backends.base import JobGetParams, QueuesStatsParams
from conveyor.backends.postgres import PostgresBackend

Conn = psycopg.Connection[tuple[Any, ...]]


def _states(admin: Conn) -> dict[str, int]:
    return dict(admin.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())


def _acquire_buffers(pg: PostgresBackend, admin: Conn, queue: str, now: str) -> int:
    """Shared buffers one jobs_acquire of ``queue`` reads, from EXPLAIN (ANALYZE, BUFFERS), rolled back."""
    statement = pg._q["jobs_acquire"]
    args = {"queue": queue, "limit": 100, "visibility_timeout": 30.0, "worker_id": "w", "now": now}
    with admin.transaction(force_rollback=True):
        (plan,) = admin.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", args).fetchone()
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def test_a_job_due_later_is_scheduled_and_reads_as_pending(pg: PostgresBackend, admin: Conn) -> None:
    later, now_ = insert(pg, make_job(run_at=at(60)), make_job(run_at=T0))
    assert _states(admin) == {"scheduled": 1, "pending": 1}
    job = pg.job_get(JobGetParams(later))
    assert job is not None and job.state == "pending"
    (stats,) = pg.queues_stats(QueuesStatsParams(now=T0))
    assert (stats.pending, stats.scheduled) == (1, 1)
    # Due but not yet promoted, it counts as ready already (the stats read run_at, not the index).
    (stats,) = pg.queues_stats(QueuesStatsParams(now=at(61)))
    assert (stats.pending, stats.scheduled) == (2, 0)
    assert [d.id for d in acquire(pg, now=T0)] == [now_]
    assert acquire(pg, now=at(59)) == []
    assert [d.id for d in acquire(pg, now=at(60))] == [later]


def test_an_idle_acquire_reads_as_little_with_50000_scheduled_jobs(pg: PostgresBackend, admin: Conn) -> None:
    insert(pg, *[make_job(queue="q", run_at=at(86_400 + i)) for i in range(50_000)])
    admin.execute("VACUUM ANALYZE jobs")
    # Before migration 0005 the same acquire walked every scheduled entry of the ready index (~360
    # pages for 50,000; 7,146 and 85 ms for 1,000,000).
    assert _acquire_buffers(pg, admin, "q", T0.isoformat()) < 20
    insert(pg, *[make_job(queue="q") for _ in range(10)])
    assert len(acquire(pg, queue="q", limit=100)) == 10


def test_a_job_scheduled_by_another_process_is_acquired_within_the_promotion_interval(
    pg: PostgresBackend, postgres_database: str
) -> None:
    producer = PostgresBackend(postgres_database)
    try:
        # Known to the worker's first promotion: acquired at its run_at exactly.
        (early,) = insert(producer, make_job(run_at=at(5)))
        assert acquire(pg, now=T0) == []
        # Written after it, due before the worker's next promotion: up to PROMOTE_EVERY late.
        (late,) = insert(producer, make_job(run_at=at(0.2)), now=at(0.1))
        assert acquire(pg, now=at(0.5)) == []
        assert [d.id for d in acquire(pg, now=T0 + PROMOTE_EVERY)] == [late]
        assert acquire(pg, now=at(4.9)) == []
        assert [d.id for d in acquire(pg, now=at(5))] == [early]
    finally:
        producer.close()


def test_a_retry_with_backoff_is_scheduled_and_acquired_when_due(pg: PostgresBackend, admin: Conn) -> None:
    from conveyor.backends.base import ErrorInfo, JobsRetryParams, RetryItem

    (job_id,) = insert(pg, make_job())
    (delivery,) = acquire(pg)
    error = ErrorInfo("Boom", "boom")
    assert pg.jobs_retry_many(JobsRetryParams([RetryItem(job_id, delivery.receipt, at(0.3), error)], at(0.1))) == 1
    assert _states(admin) == {"scheduled": 1}
    assert acquire(pg, now=at(0.2)) == []
    (again,) = acquire(pg, now=at(0.3))
    assert (again.id, again.attempts) == (job_id, 1)


def test_a_backlog_larger_than_one_promotion_is_acquired_in_full(pg: PostgresBackend) -> None:
    count = PROMOTE_BATCH * 2 + 500
    insert(pg, *[make_job(run_at=at(10)) for _ in range(count)])
    got = 0
    while batch := acquire(pg, limit=PROMOTE_BATCH, now=at(10)):
        got += len(batch)
        complete(pg, *batch, now=at(10))
    assert got == count


def test_scheduling_wakes_no_one_and_the_promotion_wakes_the_queue(pg: PostgresBackend) -> None:
    listener = pg.listen(["q"])
    try:
        insert(pg, make_job(queue="q", run_at=at(30)))
        assert listener.wait(0.3) is False
        assert acquire(pg, queue="q", now=at(30)) != []  # promotes, then acquires
        assert listener.wait(5) is True
    finally:
        listener.close()


@pytest.mark.parametrize("due", [True, False])
def test_the_migration_schedules_what_an_older_release_left_pending_for_later(
    postgres_database: str, admin: Conn, monkeypatch: pytest.MonkeyPatch, due: bool
) -> None:
    from conveyor.backends._sql import load_migrations

    migrations = load_migrations("conveyor.backends.postgres")
    before = [m for m in migrations if m.name < "0005"]
    old = PostgresBackend(postgres_database)
    try:
        monkeypatch.setattr("conveyor.backends.postgres._backend.load_migrations", lambda _package: before)
        old.migrate()
    finally:
        old.close()
    offset = "-1 minute" if due else "1 hour"
    admin.execute(
        """INSERT INTO jobs (id, queue, task, payload, headers, priority, run_at, enqueued_at, max_attempts,
                             max_deliveries)
           VALUES (gen_random_uuid(), 'q', 't', %s, '{}', 0, now() + %s::interval, now(), 5, 10)""",
        (json.dumps({}), offset),
    )
    monkeypatch.undo()
    new = PostgresBackend(postgres_database)
    try:
        assert new.migrate()[0] == "0005_scheduled.sql"
        assert _states(admin) == {"pending" if due else "scheduled": 1}
        (wall,) = admin.execute("SELECT now()").fetchone()
        assert len(acquire(new, queue="q", now=wall + timedelta(hours=2))) == 1
    finally:
        new.close()


def test_an_acquire_without_promote_leaves_due_scheduled_jobs_for_the_next(pg: PostgresBackend) -> None:
    from conveyor.backends.base import JobsAcquireParams

    (job_id,) = insert(pg, make_job(run_at=at(10)))
    quick = JobsAcquireParams(queue="default", limit=10, visibility_timeout=30.0, worker_id="w", now=at(10))
    assert pg.jobs_acquire(replace(quick, promote=False)) == []
    assert [d.id for d in pg.jobs_acquire(quick)] == [job_id]


def test_what_a_producer_remembers_of_scheduled_queues_is_bounded() -> None:
    from conveyor.backends._promotion import MAX_QUEUES, Promotions

    promotions = Promotions()
    promotions.promoted("worked", T0, (0, 0, None))
    assert not promotions.due("worked", at(0.5))
    for i in range(MAX_QUEUES * 3):
        promotions.scheduled_many({f"tenant-{i}": at(60)})
    assert len(promotions._written) <= MAX_QUEUES
    # Forgetting is safe: every queue promotes at its next acquire.
    assert promotions.due("worked", at(0.5))
