"""Where the engines used to disagree: each test is a minimal operation sequence that the property
tests (``test_properties.py``) found answered differently by two engines, pinned as a plain example."""

from __future__ import annotations

from datetime import timedelta

from _factory import T0, VT, acquire, at, complete, get, insert, make_dead, new_job, retry

from conveyor._ids import uuid7
from conveyor.backends.base import (
    Backend,
    DeadReplayParams,
    ErrorInfo,
    Finish,
    JobGetParams,
    JobsFinishParams,
    JobsRescueParams,
    JobsRetryParams,
    JobsStartParams,
    KeysPruneParams,
    LeaseRef,
    LeasesExtendParams,
    ProcessedKeyClaimParams,
    QueueLoadParams,
    RetryItem,
    Schedule,
    SchedulesUpsertParams,
)


def test_an_archived_job_has_no_lease(backend: Backend) -> None:
    """PostgreSQL archived the last delivery's lease_expires_at; it is for live processing jobs only."""
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    assert complete(backend, delivery, now=at(1)) == 1
    assert get(backend, delivery.id).lease_expires_at is None


def test_retry_and_rescue_keep_the_worker_of_the_last_delivery(backend: Backend) -> None:
    """PostgreSQL cleared worker_id on retry and rescue (not on SQLite); like started_at, it names
    the last delivery's worker until the next delivery. Release, which hands back a job that never
    started, clears both."""
    retried, rescued = new_job(), new_job()
    insert(backend, retried, rescued)
    first, second = acquire(backend, limit=2, worker_id="w-9")
    assert retry(backend, first, run_at=at(60), now=at(1)) == 1
    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(VT + 1))) == 1
    for job in (retried, rescued):
        record = get(backend, job.id)
        assert (record.state, record.worker_id, record.lease_expires_at) == ("pending", "w-9", None)
    assert second.id == rescued.id


def test_a_key_that_expires_exactly_now_is_pruned_now(backend: Backend) -> None:
    """A key is taken over by a claim once ``expires_at <= now``; SQLite pruned it a microsecond later."""
    insert(backend, new_job(idempotency_key="order-1", dedup_until=at(10)))
    assert backend.processed_keys_claim(ProcessedKeyClaimParams(key="mail-1", expires_at=at(10), now=T0))
    assert backend.keys_prune(KeysPruneParams(now=at(10))) == 2


def test_start_and_extend_answer_each_held_delivery_in_the_callers_order(backend: Backend) -> None:
    """PostgreSQL answered in its own order; SQLite also answered for an item whose receipt was not
    held when another item named the same job with its current receipt."""
    insert(backend, new_job(), new_job())
    a, b = acquire(backend, limit=2)
    refs = [LeaseRef(b.id, b.receipt), LeaseRef(a.id, "0" * 32), LeaseRef(a.id, a.receipt)]
    assert backend.jobs_start_many(JobsStartParams(items=refs, now=at(1))) == [b.id, a.id]
    extended = backend.leases_extend_many(LeasesExtendParams(items=refs, visibility_timeout=60, now=at(2)))
    assert extended == [b.id, a.id]
    assert get(backend, a.id).deliveries == 1


def test_an_outcome_applies_after_a_stale_one_for_the_same_job_in_its_batch(backend: Backend) -> None:
    """SQLite kept the first item per job of a batch, so a late outcome of an earlier delivery
    placed first made the current delivery's outcome count as stale."""
    insert(backend, new_job(), new_job())
    stale_a, stale_b = acquire(backend, limit=2)
    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(VT + 1))) == 2
    a, b = acquire(backend, limit=2, now=at(VT + 2))
    error = ErrorInfo("IOError", "flaky")
    retries = [RetryItem(stale_a.id, stale_a.receipt, at(99), error), RetryItem(a.id, a.receipt, at(99), error)]
    assert backend.jobs_retry_many(JobsRetryParams(items=retries, now=at(VT + 3))) == 1
    finishes = [Finish(stale_b.id, stale_b.receipt, "dead"), Finish(b.id, b.receipt, "completed")]
    assert backend.jobs_finish_many(JobsFinishParams(items=finishes, now=at(VT + 3))) == 1
    assert (get(backend, a.id).state, get(backend, a.id).run_at) == ("pending", at(99))
    assert get(backend, b.id).state == "completed"


def test_a_lease_holds_until_exactly_now_plus_its_visibility_timeout(backend: Backend) -> None:
    """SQLite added the timeout to REAL seconds in SQL: the sum could round below the exact end, and
    rescue took the lease back at the instant it should still hold (found with 0.1 s and a clock
    that is not on a whole second)."""
    for k in range(1, 40):
        now = at(10 * k + k * 0.000777)
        vt = (0.1, 0.3, 0.7, 1.1, 2.2)[k % 5]
        insert(backend, new_job(queue=f"q{k}"), now=now)
        (delivery,) = acquire(backend, queue=f"q{k}", now=now, visibility_timeout=vt)
        end = now + timedelta(seconds=vt)
        assert delivery.lease_expires_at == end
        assert backend.jobs_rescue_expired(JobsRescueParams(now=end)) == 0, (k, vt)
        assert backend.jobs_rescue_expired(JobsRescueParams(now=end + timedelta(microseconds=1))) == 1


def test_queue_load_counts_a_job_finished_at_the_windows_very_start(backend: Backend) -> None:
    """The window is [now - window, now]; SQLite subtracted REAL seconds, which could round past it."""
    counted = 0
    for k in range(1, 40):
        finished = at(10 * k + k * 0.000777)
        insert(backend, new_job(queue="load"), now=finished)
        (delivery,) = acquire(backend, queue="load", now=finished)
        assert complete(backend, delivery, now=finished) == 1
        load = backend.queue_load(QueueLoadParams("load", now=finished + timedelta(seconds=0.1), window=0.1))
        counted += load.drained
    assert counted == 39


def test_the_last_schedule_of_one_name_in_an_upsert_wins(backend: Backend) -> None:
    """SQLite upserted them one by one, so the second was an update of the first and kept its pause."""
    first = Schedule("nightly", "* * * * *", "t.a", "q", "{}", at(60), paused=True)
    last = Schedule("nightly", "*/5 * * * *", "t.b", "q", "{}", at(300), paused=False)
    backend.schedules_upsert(SchedulesUpsertParams([first, last]))
    (stored,) = backend.schedules_list()
    assert (stored.cron, stored.task, stored.paused, stored.next_run_at) == ("*/5 * * * *", "t.b", False, at(300))


def test_a_dead_letter_named_twice_is_replayed_once_as_its_first_pair_says(backend: Backend) -> None:
    """PostgreSQL answered a pair given twice twice, and picked any of several pairs of one letter."""
    (dead_id,) = make_dead(backend, 1)
    first, second = (dead_id, uuid7()), (dead_id, uuid7())
    params = DeadReplayParams([first, first, second], actor="ops", reason="fixed", now=at(5))
    assert backend.dead_replay_many(params) == [first]
    assert get(backend, dead_id).replayed_by == first[1]
    assert get(backend, first[1]).replay_of == dead_id
    assert backend.job_get(JobGetParams(id=second[1])) is None
