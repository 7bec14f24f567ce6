"""Insert and acquire: what a job looks like when stored, and in which order it is handed out."""

from __future__ import annotations

import json
from dataclasses import replace
from uuid import UUID

import pytest
from _factory import T0, VT, acquire, at, complete, get, ids, insert, live_ids, new_job

from conveyor._ids import uuid7
from conveyor.backends.base import Backend, JobGetParams, JobsListParams


def test_insert_returns_ids_in_order_and_stores_every_field(backend: Backend) -> None:
    first = new_job(
        "emails",
        task="emails.send",
        payload=json.dumps({"to": "a@example.com"}),
        headers=json.dumps({"schema_version": 2, "tenant": "acme"}),
        priority=7,
        run_at=at(5),
        expires_at=at(3600),
        max_attempts=3,
        max_deliveries=4,
        idempotency_key="k-1",
        ordering_key="customer-9",
    )
    second = new_job("emails")

    assert insert(backend, first, second, now=T0) == [first.id, second.id]

    record = get(backend, first.id)
    assert record.queue == "emails"
    assert record.task == "emails.send"
    assert json.loads(record.payload) == {"to": "a@example.com"}
    assert json.loads(record.headers) == {"schema_version": 2, "tenant": "acme"}
    assert record.state == "pending"
    assert record.priority == 7
    assert record.run_at == at(5)
    assert record.enqueued_at == T0
    assert record.expires_at == at(3600)
    assert (record.attempts, record.deliveries) == (0, 0)
    assert (record.max_attempts, record.max_deliveries) == (3, 4)
    assert record.idempotency_key == "k-1"
    assert record.ordering_key == "customer-9"
    assert record.replay_of is None
    assert record.first_started_at is None and record.started_at is None
    assert record.lease_expires_at is None and record.worker_id is None
    assert record.finished_at is None and record.result is None


def test_insert_of_nothing_is_a_no_op(backend: Backend) -> None:
    assert insert(backend) == []
    assert live_ids(backend) == []


def test_job_get_of_an_unknown_id_is_none(backend: Backend) -> None:
    assert backend.job_get(JobGetParams(id=uuid7())) is None


def test_acquire_leases_the_job_and_hands_out_a_receipt(backend: Backend) -> None:
    job = new_job()
    insert(backend, job)

    (delivery,) = acquire(backend, now=at(1), visibility_timeout=VT, worker_id="w-7")

    assert delivery.id == job.id
    assert delivery.queue == job.queue and delivery.task == job.task
    assert delivery.payload == job.payload and delivery.headers == job.headers
    assert (delivery.deliveries, delivery.attempts, delivery.rescues) == (0, 0, 0)  # a lease is not a delivery
    assert delivery.receipt
    assert delivery.lease_expires_at == at(1 + VT)
    assert delivery.enqueued_at == T0
    record = get(backend, job.id)
    assert record.state == "processing"
    assert record.deliveries == 0
    assert record.worker_id == "w-7"
    assert record.started_at == at(1)
    assert record.first_started_at == at(1)
    assert record.lease_expires_at == at(1 + VT)


def test_acquire_orders_by_priority_then_run_at_then_id(backend: Backend) -> None:
    low_early = new_job(priority=0, run_at=at(-10))
    high_late = new_job(priority=5, run_at=at(-1))
    high_early = new_job(priority=5, run_at=at(-5))
    tie_a = new_job(priority=1, run_at=at(-3))
    tie_b = new_job(priority=1, run_at=at(-3))
    # Insert out of order so that insertion order cannot explain the result.
    insert(backend, tie_b, low_early, high_late, tie_a, high_early)

    deliveries = acquire(backend, limit=10)

    assert ids(deliveries) == [high_early.id, high_late.id, tie_a.id, tie_b.id, low_early.id]


def test_acquire_respects_the_limit_and_never_hands_out_a_job_twice(backend: Backend) -> None:
    jobs = [new_job() for _ in range(7)]
    insert(backend, *jobs)

    first = acquire(backend, limit=3)
    second = acquire(backend, limit=3)
    third = acquire(backend, limit=3)
    fourth = acquire(backend, limit=3)

    assert ids(first) == [j.id for j in jobs[:3]]
    assert ids(second) == [j.id for j in jobs[3:6]]
    assert ids(third) == [jobs[6].id]
    assert fourth == []


def test_acquire_on_an_empty_queue_returns_nothing(backend: Backend) -> None:
    assert acquire(backend, queue="nothing-here") == []


def test_scheduled_jobs_wait_for_their_run_at(backend: Backend) -> None:
    later = new_job(run_at=at(60))
    insert(backend, later)

    assert acquire(backend, now=at(59)) == []
    assert ids(acquire(backend, now=at(60))) == [later.id]


def test_acquire_only_reads_the_named_queue(backend: Backend) -> None:
    mine, other = new_job("mine"), new_job("other")
    insert(backend, mine, other)

    assert ids(acquire(backend, queue="mine")) == [mine.id]
    assert get(backend, other.id).state == "pending"


def test_a_large_batch_inserts_and_acquires_completely(backend: Backend) -> None:
    jobs = [new_job("bulk", payload=json.dumps({"n": n})) for n in range(500)]

    assert insert(backend, *jobs) == [j.id for j in jobs]

    deliveries = acquire(backend, queue="bulk", limit=1000)
    assert ids(deliveries) == [j.id for j in jobs]
    assert [json.loads(d.payload)["n"] for d in deliveries] == list(range(500))


def test_every_delivery_gets_a_fresh_receipt(backend: Backend) -> None:
    from conveyor.backends.base import JobsRescueParams

    insert(backend, new_job(), new_job())
    first_pair = acquire(backend, limit=2, visibility_timeout=VT)
    assert len({d.receipt for d in first_pair}) == 2

    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(VT + 1))) == 2
    second_pair = acquire(backend, limit=2, now=at(VT + 2))

    assert ids(second_pair) == ids(first_pair)
    assert {d.receipt for d in second_pair}.isdisjoint({d.receipt for d in first_pair})
    assert [(d.deliveries, d.rescues) for d in second_pair] == [(0, 1), (0, 1)]


def test_ids_are_returned_as_uuids(backend: Backend) -> None:
    job = new_job()
    (stored,) = insert(backend, job)
    (delivery,) = acquire(backend)
    assert isinstance(stored, UUID) and isinstance(delivery.id, UUID)
    assert delivery.id == job.id


def test_resending_a_job_with_the_same_id_changes_nothing(backend: Backend) -> None:
    job = new_job(payload=json.dumps({"v": 1}))
    insert(backend, job, now=T0)

    resent = replace(job, payload=json.dumps({"v": 2}))
    assert insert(backend, resent, now=at(5)) == [job.id]

    (record,) = backend.jobs_list(JobsListParams())
    assert record.id == job.id
    assert json.loads(record.payload) == {"v": 1}
    assert record.enqueued_at == T0


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("batch", [1, 100])
def test_resending_a_job_after_it_ended_changes_nothing(backend: Backend, keyed: bool, batch: int) -> None:
    # A job id is accepted once, on every engine: a producer that resends a job which has meanwhile
    # run and been archived gets its id back and enqueues nothing (no second run, and the finish of
    # a second copy can never collide with the archived one). batch=100 takes the bulk paths.
    key = {"idempotency_key": "order-7", "dedup_until": at(3600)} if keyed else {}
    job = new_job(**key)
    others = [new_job() for _ in range(batch - 1)]
    insert(backend, job, *others)
    for delivery in acquire(backend, limit=batch):
        complete(backend, delivery, now=at(1))
    assert get(backend, job.id).state == "completed"

    again = [job, *(new_job() for _ in range(batch - 1))]
    assert insert(backend, *again, now=at(2))[0] == job.id

    assert job.id not in live_ids(backend)
    assert len(live_ids(backend)) == batch - 1  # the new jobs of the batch went in
    record = get(backend, job.id)
    assert (record.state, record.deliveries) == ("completed", 1)


@pytest.mark.parametrize("batch", [1, 100])
def test_a_fresh_id_is_inserted_without_looking_in_the_archive(backend: Backend, batch: int) -> None:
    # ``fresh`` promises the id was minted for this send; the job goes in like any other (batch=1 is
    # delay()'s statement, 100 the bulk paths).
    job = new_job(fresh=True)
    assert insert(backend, *[job, *(new_job(fresh=True) for _ in range(batch - 1))])[0] == job.id
    live = live_ids(backend)
    assert len(live) == batch and job.id in live
    (delivery, *_) = acquire(backend, limit=batch)
    assert delivery.id == job.id


def test_a_vacuum_of_the_jobs_table_changes_no_job(backend: Backend) -> None:
    # What an idle worker calls after a burst (PostgreSQL: VACUUM, elsewhere nothing): finished jobs
    # stay archived, pending and leased ones stay as they are and are handed out as before.
    insert(backend, *(new_job() for _ in range(5)))
    first, second, *_ = acquire(backend, limit=3)
    complete(backend, first)
    before = {r.id: (r.state, r.lease_expires_at) for r in backend.jobs_list(JobsListParams())}

    backend.jobs_vacuum()
    backend.jobs_vacuum()  # and again, with nothing left to reclaim

    assert {r.id: (r.state, r.lease_expires_at) for r in backend.jobs_list(JobsListParams())} == before
    assert get(backend, first.id).state == "completed"
    assert complete(backend, second) == 1
    assert len(acquire(backend, limit=10)) == 2


def test_a_forked_backend_is_the_same_database_on_connections_of_its_own(backend: Backend) -> None:
    """What a forked child's App uses in its parent's backend's place (``Backend.forked``)."""
    job = new_job("fork")
    insert(backend, job)
    copy = backend.forked()
    try:
        assert copy.engine == backend.engine
        # A private in-memory database is the child's own copy: the backend itself; else a new one.
        assert (copy is backend) == (backend.engine == "memory")
        assert [d.id for d in acquire(copy, "fork")] == [job.id]
        assert get(backend, job.id).state == "processing"
    finally:
        if copy is not backend:
            copy.close()
