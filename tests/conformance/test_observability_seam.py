"""What operators watch, on every engine: per-queue counters kept with the outcomes (exact, never
lowered by retention, replay or purge), the worker registry with in-flight jobs, and alert states
whose changes are a compare-and-set."""

from __future__ import annotations

from datetime import timedelta

from _factory import T0, acquire, at, complete, dead, insert, make_dead, new_job
from tests.conftest import driver_connection

from conveyor._ids import uuid7
from conveyor.backends.base import (
    AlertsSetParams,
    AlertState,
    ArchivePruneParams,
    Backend,
    DatabaseHealthParams,
    DeadPurgeParams,
    DeadReplayParams,
    Finish,
    JobsFinishParams,
    QueuesStatsParams,
    QueueStats,
    TaskTotals,
    TaskTotalsParams,
    WorkerInfo,
    WorkersBeatParams,
    WorkersListParams,
    WorkersPruneParams,
    WorkersRemoveParams,
)


def _stats(backend: Backend) -> dict[str, QueueStats]:
    return {s.queue: s for s in backend.queues_stats(QueuesStatsParams(now=at(60)))}


def test_counters_count_each_outcome_once_per_queue_and_task(backend: Backend) -> None:
    insert(backend, *[new_job("q") for _ in range(5)], new_job("q", task="tasks.other"), new_job("r"))
    d = acquire(backend, queue="q", limit=6)
    complete(backend, d[0], d[1])
    dead(backend, d[2])
    backend.jobs_finish_many(JobsFinishParams([Finish(d[3].id, d[3].receipt, "expired", ran=False)], now=at(1)))
    # A stale or repeated outcome is not counted again.
    assert complete(backend, d[0], now=at(2)) == 0
    other = next(x for x in d if x.task == "tasks.other")
    complete(backend, other, now=at(3))

    q = _stats(backend)["q"]
    assert (q.completed, q.dead, q.dead_total, q.expired, q.cancelled) == (3, 1, 1, 1, 0)
    assert q.processing == 1 and q.enqueued == 6
    assert _stats(backend)["r"].enqueued == 1
    totals = backend.task_totals(TaskTotalsParams())
    assert totals == [
        TaskTotals("q", "tasks.add", completed=2, dead=1, expired=1, cancelled=0),
        TaskTotals("q", "tasks.other", completed=1, dead=0, expired=0, cancelled=0),
    ]
    assert backend.task_totals(TaskTotalsParams(queue="r")) == []


def test_totals_survive_retention_but_the_dlq_depth_follows_replay_and_purge(backend: Backend) -> None:
    dead_ids = make_dead(backend, 3, queue="q")
    insert(backend, new_job("q"))
    complete(backend, *acquire(backend, queue="q"))

    backend.dead_replay_many(DeadReplayParams([(dead_ids[0], uuid7())], "ops", "fixed", at(1)))
    backend.dead_purge_many(DeadPurgeParams([dead_ids[1]], "ops", "gone", at(1)))
    after_actions = _stats(backend)["q"]
    assert (after_actions.dead, after_actions.dead_total, after_actions.completed) == (1, 3, 1)
    assert after_actions.pending == 1  # the replay is a new job
    assert after_actions.enqueued == 5

    far = T0 + timedelta(days=400)
    while backend.archive_prune(ArchivePruneParams(far, far, far)):
        pass
    pruned = _stats(backend)["q"]
    assert (pruned.dead, pruned.dead_total, pruned.completed) == (0, 3, 1)


def _worker(worker_id: str, queues: tuple[str, ...] = ("q",)) -> WorkerInfo:
    return WorkerInfo(worker_id, "host-a", 4242, queues, 10, started_at=at(0), last_seen=at(0))


def test_workers_report_themselves_with_the_jobs_they_hold(backend: Backend) -> None:
    backend.workers_beat(WorkersBeatParams(_worker("host-a:1", ("q", "r")), now=at(0)))
    backend.workers_beat(WorkersBeatParams(_worker("host-a:2"), now=at(0)))
    insert(backend, new_job("q"), new_job("q"), new_job("q"))
    held = acquire(backend, queue="q", limit=2, worker_id="host-a:1")
    complete(backend, held[1])
    backend.workers_beat(WorkersBeatParams(_worker("host-a:1", ("q",)), now=at(10)))

    one, two = backend.workers_list(WorkersListParams())
    assert (one.id, one.queues, one.last_seen, one.started_at, one.in_flight) == (
        "host-a:1",
        ("q",),
        at(10),
        at(0),
        (held[0].id,),
    )
    assert (two.id, two.in_flight, two.pid, two.host, two.concurrency) == ("host-a:2", (), 4242, "host-a", 10)
    assert [w.id for w in backend.workers_list(WorkersListParams(seen_after=at(5)))] == ["host-a:1"]

    assert backend.workers_prune(WorkersPruneParams(before=at(5))) == 1
    assert backend.workers_remove(WorkersRemoveParams("host-a:1")) is True
    assert backend.workers_remove(WorkersRemoveParams("host-a:1")) is False
    assert backend.workers_list(WorkersListParams()) == []


def _alert(state: str, value: float, queue: str | None = "q", since: float = 0) -> AlertState:
    return AlertState("dlq_depth", queue, state, at(since), value, 0.0, f"{value} dead letters")  # type: ignore[arg-type]


def test_alert_state_changes_once_and_values_refresh(backend: Backend) -> None:
    # Resolved with no alert stored: nothing to write, nothing to notify.
    assert backend.alerts_set(AlertsSetParams([_alert("resolved", 0)], now=at(0))) == []
    assert backend.alerts_list() == []

    fired = backend.alerts_set(AlertsSetParams([_alert("firing", 2, since=1), _alert("firing", 1, None, 1)], at(1)))
    assert len(fired) == 2
    # The same change again (a second evaluator) changes nothing; the value is refreshed.
    assert backend.alerts_set(AlertsSetParams([_alert("firing", 5, since=2)], now=at(2))) == []
    stored = {a.queue: a for a in backend.alerts_list()}
    assert (stored["q"].state, stored["q"].value, stored["q"].since) == ("firing", 5, at(1))
    assert stored[None].rule == "dlq_depth"

    resolved = backend.alerts_set(AlertsSetParams([_alert("resolved", 0, since=3)], now=at(3)))
    assert [a.state for a in resolved] == ["resolved"]
    assert backend.alerts_set(AlertsSetParams([_alert("resolved", 0, since=4)], now=at(4))) == []
    stored = {a.queue: a for a in backend.alerts_list()}
    assert (stored["q"].state, stored["q"].since, stored["q"].message) == ("resolved", at(3), "0 dead letters")


def test_database_health_reports_what_the_engine_has(backend: Backend) -> None:
    health = backend.database_health(DatabaseHealthParams(now=T0 + timedelta(days=36500)))
    if backend.engine == "postgres":
        assert health.jobs_dead_tuples is not None and health.jobs_dead_tuples >= 0
        # No other session of this test's database is in a transaction: 0 (the test's "now" is far
        # ahead of the wall clock, so an open one would show as decades old).
        assert health.oldest_transaction_age == 0
    elif backend.engine == "mysql":  # InnoDB counts no dead rows per table
        assert (health.oldest_transaction_age, health.jobs_dead_tuples) == (0, None)
    else:
        assert (health.oldest_transaction_age, health.jobs_dead_tuples) == (None, None)


def test_database_health_sees_another_sessions_open_transaction(backend: Backend, database_url: str) -> None:
    # An application's session left in a transaction that read the jobs table holds back the cleanup of
    # every row deleted since (vacuum, InnoDB's purge): the long_transaction alert reads this age.
    if backend.engine == "sqlite":
        return  # one file, no server: nothing to report (see the test above)
    insert(backend, new_job("q"))
    with driver_connection(database_url) as conn:
        if backend.engine == "postgres":
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT count(*) FROM jobs").fetchall()
        else:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                cur.execute("SELECT count(*) FROM jobs")
                cur.fetchall()
        health = backend.database_health(DatabaseHealthParams(now=T0 + timedelta(days=36500)))
        conn.rollback()
    assert health.oldest_transaction_age is not None and health.oldest_transaction_age > 3600
