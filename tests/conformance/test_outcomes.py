"""Outcomes of a delivery: finish (completed, dead, expired, cancelled), retry, release, rescue."""

from __future__ import annotations

import json

import pytest
from _factory import VT, acquire, at, complete, dead, get, ids, insert, live_ids, new_job, retry

from conveyor import ConfigurationError
from conveyor.backends.base import (
    Backend,
    ErrorInfo,
    Finish,
    JobsFinishParams,
    JobsReleaseParams,
    JobsRescueParams,
    JobsRetryParams,
    JobsStartParams,
    LeaseRef,
    RetryItem,
)


def test_completed_job_moves_to_the_archive_with_its_result(backend: Backend) -> None:
    job = new_job()
    insert(backend, job)
    (delivery,) = acquire(backend, now=at(1), worker_id="w-1")

    assert complete(backend, delivery, now=at(2), result=json.dumps({"sum": 3})) == 1

    assert live_ids(backend) == []
    record = get(backend, job.id)
    assert record.state == "completed"
    assert json.loads(record.result or "null") == {"sum": 3}
    assert record.finished_at == at(2)
    assert record.attempts == 1
    assert record.deliveries == 1
    assert record.started_at == at(1)
    assert record.worker_id == "w-1"
    assert record.payload == job.payload


def test_dead_letter_keeps_reason_and_error(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    error = ErrorInfo(type="ValueError", message="bad input", traceback="Traceback (most recent call last)")

    assert dead(backend, delivery, now=at(3), reason="dead_on", error=error) == 1

    record = get(backend, delivery.id)
    assert record.state == "dead"
    assert record.reason == "dead_on"
    assert record.error_type == "ValueError"
    assert record.error_message == "bad input"
    assert record.traceback == "Traceback (most recent call last)"
    assert record.finished_at == at(3)
    assert record.attempts == 1


def test_finish_without_running_does_not_count_an_attempt(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)

    applied = backend.jobs_finish_many(
        JobsFinishParams(
            items=[
                Finish(
                    id=delivery.id,
                    receipt=delivery.receipt,
                    state="dead",
                    reason="max_deliveries_exceeded",
                    ran=False,
                )
            ],
            now=at(1),
        )
    )

    assert applied == 1
    record = get(backend, delivery.id)
    assert (record.state, record.reason) == ("dead", "max_deliveries_exceeded")
    assert record.attempts == 0
    assert record.deliveries == 0  # it did not run: no start to count


@pytest.mark.parametrize("state", ["expired", "cancelled"])
def test_other_terminal_states_are_archived(backend: Backend, state: str) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)

    applied = backend.jobs_finish_many(
        JobsFinishParams(
            items=[Finish(id=delivery.id, receipt=delivery.receipt, state=state, ran=False)],  # type: ignore[arg-type]
            now=at(1),
        )
    )

    assert applied == 1
    assert get(backend, delivery.id).state == state
    assert live_ids(backend) == []


def test_a_batch_finish_counts_only_what_applied(backend: Backend) -> None:
    insert(backend, *[new_job() for _ in range(4)])
    a, b, c, d = acquire(backend, limit=4)
    assert complete(backend, a) == 1  # a is already archived: naming it again is stale

    items = [
        Finish(id=a.id, receipt=a.receipt, state="completed"),
        Finish(id=b.id, receipt=b.receipt, state="completed"),
        Finish(id=c.id, receipt="not-a-receipt", state="completed"),
        Finish(id=d.id, receipt=d.receipt, state="dead", reason="rejected"),
    ]
    assert backend.jobs_finish_many(JobsFinishParams(items=items, now=at(1))) == 2

    assert get(backend, b.id).state == "completed"
    assert get(backend, c.id).state == "processing"
    assert get(backend, d.id).state == "dead"
    assert live_ids(backend) == [c.id]


def test_finish_of_nothing_applies_nothing(backend: Backend) -> None:
    assert backend.jobs_finish_many(JobsFinishParams(items=[], now=at(0))) == 0


def test_retry_returns_the_job_to_pending_with_the_attempt_counted(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)

    assert retry(backend, delivery, run_at=at(60), now=at(1)) == 1

    record = get(backend, delivery.id)
    assert record.state == "pending"
    assert record.attempts == 1
    assert record.deliveries == 1
    assert record.run_at == at(60)
    assert (record.error_type, record.error_message, record.traceback) == ("IOError", "flaky", "tb")


def test_a_retried_job_runs_again_at_its_run_at(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    retry(backend, delivery, run_at=at(60), now=at(1))

    assert acquire(backend, now=at(59)) == []
    (again,) = acquire(backend, now=at(60))

    assert again.id == delivery.id
    assert (again.attempts, again.deliveries) == (1, 1)  # the retry counted the first start
    assert again.receipt != delivery.receipt
    assert get(backend, again.id).first_started_at == at(0)
    assert complete(backend, again, now=at(61)) == 1
    assert get(backend, again.id).attempts == 2


def test_release_hands_back_leased_jobs_uncounted(backend: Backend) -> None:
    insert(backend, new_job(), new_job())
    a, b = acquire(backend, limit=2)

    released = backend.jobs_release_many(JobsReleaseParams(items=[LeaseRef(id=a.id, receipt=a.receipt)], now=at(1)))

    assert released == 1
    record = get(backend, a.id)
    assert record.state == "pending"
    assert (record.deliveries, record.attempts) == (0, 0)
    assert record.lease_expires_at is None and record.started_at is None and record.first_started_at is None
    assert get(backend, b.id).state == "processing"
    # Released jobs are ready again at once, and the old receipt no longer acts.
    (again,) = acquire(backend, now=at(1))
    assert again.id == a.id and again.deliveries == 0
    assert complete(backend, a, now=at(2)) == 0
    assert complete(backend, again, now=at(2)) == 1
    assert get(backend, a.id).deliveries == 1


# The heartbeat's form of the count (wait=False: a row another transaction holds locked is skipped)
# agrees with the suspect's when nothing is locked (tests/postgres/test_pg_session_settings.py has the lock).
@pytest.mark.parametrize("wait", [True, False], ids=["wait", "skip_locked"])
def test_a_lease_is_not_a_delivery_an_outcome_counts_its_start(backend: Backend, wait: bool) -> None:
    insert(backend, *(new_job() for _ in range(4)))
    done, failed, started, held = acquire(backend, limit=4, now=at(1))
    assert [d.deliveries for d in (done, failed, started, held)] == [0, 0, 0, 0]

    assert complete(backend, done, now=at(2)) == 1
    assert retry(backend, failed, run_at=at(5), now=at(2)) == 1
    # A start counted early (a suspect before it runs, or a heartbeat) is not counted again by its outcome.
    refs = [LeaseRef(started.id, started.receipt), LeaseRef(held.id, "not-the-receipt")]
    assert backend.jobs_start_many(JobsStartParams(items=refs, now=at(2), wait=wait)) == [started.id]
    assert get(backend, started.id).deliveries == 1
    finish = Finish(started.id, started.receipt, "completed", counted=True)
    assert backend.jobs_finish_many(JobsFinishParams([finish], now=at(3))) == 1

    assert [(get(backend, d.id).deliveries, get(backend, d.id).attempts) for d in (done, failed, started, held)] == [
        (1, 1),
        (1, 1),
        (1, 1),
        (0, 0),
    ]
    # A finish that did not run (poison protection, TTL) counts no start either.
    expired = Finish(held.id, held.receipt, "expired", reason="expired", ran=False)
    assert backend.jobs_finish_many(JobsFinishParams([expired], now=at(3))) == 1
    assert (get(backend, held.id).deliveries, get(backend, held.id).attempts) == (0, 0)


def test_a_worker_dying_charges_none_of_the_jobs_it_held_and_rescue_makes_them_suspects(backend: Backend) -> None:
    insert(backend, *(new_job() for _ in range(4)))
    leased = acquire(backend, limit=4, now=at(0), visibility_timeout=10)
    assert [d.rescues for d in leased] == [0, 0, 0, 0]
    # The worker counted the start of the job it ran (a suspect, or running long), then died.
    assert backend.jobs_start_many(JobsStartParams([LeaseRef(leased[0].id, leased[0].receipt)], now=at(1)))
    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(11))) == 4
    assert [get(backend, d.id).deliveries for d in leased] == [1, 0, 0, 0]
    again = acquire(backend, limit=4, now=at(12))
    assert sorted((d.id, d.deliveries, d.rescues) for d in again) == sorted(
        (d.id, 1 if d.id == leased[0].id else 0, 1) for d in leased
    )


def test_rescue_returns_expired_leases_and_keeps_the_delivery_count(backend: Backend) -> None:
    insert(backend, new_job(), new_job())
    (short,) = acquire(backend, limit=1, visibility_timeout=10)
    (long,) = acquire(backend, limit=1, visibility_timeout=100)

    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(5))) == 0
    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(11))) == 1

    rescued = get(backend, short.id)
    assert rescued.state == "pending"
    assert (rescued.deliveries, rescued.attempts) == (0, 0)
    assert get(backend, long.id).state == "processing"
    (again,) = acquire(backend, now=at(12))
    assert (again.id, again.deliveries, again.rescues) == (short.id, 0, 1)


def test_rescue_respects_its_limit(backend: Backend) -> None:
    insert(backend, *[new_job() for _ in range(5)])
    deliveries = acquire(backend, limit=5, visibility_timeout=VT)

    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(VT + 1), limit=2)) == 2
    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(VT + 1), limit=10)) == 3
    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(VT + 1), limit=10)) == 0
    assert {get(backend, i).state for i in ids(deliveries)} == {"pending"}


def test_an_outcome_named_twice_in_one_batch_applies_once(backend: Backend) -> None:
    insert(backend, new_job(), new_job())
    a, b = acquire(backend, limit=2)

    finished = backend.jobs_finish_many(
        JobsFinishParams(
            items=[
                Finish(id=a.id, receipt=a.receipt, state="completed"),
                Finish(id=a.id, receipt=a.receipt, state="completed"),
            ],
            now=at(1),
        )
    )
    retried = backend.jobs_retry_many(
        JobsRetryParams(
            items=[
                RetryItem(id=b.id, receipt=b.receipt, run_at=at(10), error=ErrorInfo(type="E", message="m")),
                RetryItem(id=b.id, receipt=b.receipt, run_at=at(10), error=ErrorInfo(type="E", message="m")),
            ],
            now=at(1),
        )
    )

    assert (finished, retried) == (1, 1)
    assert get(backend, a.id).state == "completed"
    assert get(backend, b.id).attempts == 1


def test_a_batch_names_each_job_once_and_only_terminal_states(backend: Backend) -> None:
    # The same contract check on every engine, before the database sees anything.
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    with pytest.raises(ConfigurationError, match="not a terminal state"):
        backend.jobs_finish_many(
            JobsFinishParams([Finish(delivery.id, delivery.receipt, "pending")], now=at(1))  # type: ignore[arg-type]
        )
    assert get(backend, delivery.id).state == "processing"
    twice = [
        Finish(delivery.id, delivery.receipt, "completed", result='"first"'),
        Finish(delivery.id, delivery.receipt, "dead", reason="second"),
    ]
    assert backend.jobs_finish_many(JobsFinishParams(twice, now=at(1))) == 1
    record = get(backend, delivery.id)
    assert (record.state, record.result, record.attempts) == ("completed", '"first"', 1)


@pytest.mark.parametrize("mix", ["plain", "results", "mixed"])
def test_each_outcome_of_a_batch_keeps_its_own_fields(backend: Backend, mix: str) -> None:
    # PostgreSQL sends a column whose every item has its default as NULL (_args.finish_args): each
    # combination must still archive every job with exactly its own outcome.
    insert(backend, *[new_job() for _ in range(5)])
    a, b, c, d, e = acquire(backend, limit=5, now=at(1))
    error = ErrorInfo("ValueError", "bad", "Traceback ...")
    items = {
        "plain": [Finish(x.id, x.receipt, "completed") for x in (a, b, c, d, e)],
        "results": [
            Finish(a.id, a.receipt, "completed"),
            Finish(b.id, b.receipt, "completed", result=json.dumps([1])),
            *[Finish(x.id, x.receipt, "completed") for x in (c, d, e)],
        ],
        "mixed": [
            Finish(a.id, a.receipt, "completed"),
            Finish(b.id, b.receipt, "completed", result=json.dumps({"ok": True})),
            Finish(c.id, c.receipt, "dead", reason="permanent_error", error=error),
            Finish(d.id, d.receipt, "expired", reason="expired", ran=False),
            Finish(e.id, e.receipt, "completed", counted=True),
        ],
    }[mix]
    assert backend.jobs_finish_many(JobsFinishParams(items, now=at(2))) == 5
    for item in items:
        record = get(backend, item.id)
        assert (record.state, record.reason, record.error_type, record.error_message, record.traceback) == (
            item.state,
            item.reason,
            item.error.type if item.error else None,
            item.error.message if item.error else None,
            item.error.traceback if item.error else None,
        )
        assert json.loads(record.result or "null") == json.loads(item.result or "null")
        assert record.attempts == (1 if item.ran else 0)
        # counted=True: its start was counted before (jobs_start_many), so the finish does not add it.
        assert record.deliveries == (1 if item.ran and not item.counted else 0)
