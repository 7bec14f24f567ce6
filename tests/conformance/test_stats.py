"""Queue statistics: depth by state, DLQ depth and the age of the oldest ready job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from _factory import acquire, at, complete, insert, make_dead, new_job

from conveyor._ids import uuid7
from conveyor.backends.base import (
    Backend,
    DeadReplayParams,
    Finish,
    JobsFinishParams,
    QueuesStatsParams,
    QueueStats,
)


def _stats(backend: Backend, now_s: float) -> dict[str, QueueStats]:
    return {s.queue: s for s in backend.queues_stats(QueuesStatsParams(now=at(now_s)))}


def test_counts_every_state_per_queue(backend: Backend) -> None:
    insert(
        backend,
        new_job("q", run_at=at(-30)),  # ready, the oldest
        new_job("q", run_at=at(-10)),  # ready
        new_job("q", run_at=at(-50)),  # will be processing
        new_job("q", run_at=at(-50)),  # will be completed
        new_job("q", run_at=at(-50)),  # will be expired
        new_job("q", run_at=at(-50)),  # will be cancelled
        new_job("q", run_at=at(3600)),  # scheduled
        new_job("other", run_at=at(-5)),
    )
    processing, done, expired, cancelled = acquire(backend, queue="q", limit=4, now=at(-15))
    backend.jobs_finish_many(
        JobsFinishParams(
            items=[
                Finish(id=done.id, receipt=done.receipt, state="completed"),
                Finish(id=expired.id, receipt=expired.receipt, state="expired", ran=False),
                Finish(id=cancelled.id, receipt=cancelled.receipt, state="cancelled", ran=False),
            ],
            now=at(-14),
        )
    )
    make_dead(backend, 2, queue="q", run_at=at(-40))

    stats = _stats(backend, 0)

    q = stats["q"]
    assert (q.pending, q.scheduled, q.processing) == (2, 1, 1)
    assert (q.completed, q.dead, q.expired, q.cancelled) == (1, 2, 1, 1)
    assert q.oldest_pending_age == 30.0
    other = stats["other"]
    assert (other.pending, other.scheduled, other.processing, other.completed, other.dead) == (1, 0, 0, 0, 0)
    assert other.oldest_pending_age == 5.0
    assert processing.id not in {done.id, expired.id, cancelled.id}


def test_scheduled_jobs_become_pending_as_time_passes(backend: Backend) -> None:
    insert(backend, new_job("q", run_at=at(60)))

    before, after = _stats(backend, 59)["q"], _stats(backend, 70)["q"]

    assert (before.pending, before.scheduled, before.oldest_pending_age) == (0, 1, None)
    assert (after.pending, after.scheduled, after.oldest_pending_age) == (1, 0, 10.0)


def test_a_queue_with_only_history_is_listed_with_zero_depth(backend: Backend) -> None:
    insert(backend, new_job("done"))
    (delivery,) = acquire(backend, queue="done")
    complete(backend, delivery)

    stats = _stats(backend, 1)["done"]

    assert (stats.pending, stats.scheduled, stats.processing, stats.completed) == (0, 0, 0, 1)
    assert stats.oldest_pending_age is None


def test_dlq_depth_excludes_replayed_dead_letters(backend: Backend) -> None:
    dead_ids = make_dead(backend, 3, queue="q")
    replays: list[tuple[UUID, UUID]] = [(dead_ids[0], uuid7())]
    backend.dead_replay_many(DeadReplayParams(replays=replays, actor="ops", reason="retry", now=at(1)))

    q = _stats(backend, 2)["q"]

    assert q.dead == 2
    assert q.pending == 1  # the replay


def test_no_queues_no_stats(backend: Backend) -> None:
    assert backend.queues_stats(QueuesStatsParams(now=at(0))) == []


def test_the_database_clock_is_the_servers_where_it_has_one(backend: Backend) -> None:
    # Apps keep the server's time when their host's clock is off (conveyor._clock.DatabaseClock).
    now = backend.database_now()
    if backend.engine in ("postgres", "mysql"):
        assert now is not None and abs(now - datetime.now(UTC)) < timedelta(seconds=60)
    else:  # a SQLite file is read by this host's clock
        assert now is None
