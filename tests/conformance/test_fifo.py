"""Per-key FIFO: at most one job per ordering key in flight, in enqueue order."""

from __future__ import annotations

from _factory import acquire, at, complete, dead, ids, insert, new_job, retry

from conveyor.backends.base import Backend, JobsReleaseParams, JobsRescueParams, LeaseRef


def test_only_the_head_of_each_key_is_handed_out(backend: Backend) -> None:
    a1, a2, a3 = (new_job(ordering_key="a") for _ in range(3))
    b1, b2 = (new_job(ordering_key="b") for _ in range(2))
    free1, free2 = new_job(), new_job()
    insert(backend, a1, b1, free1, a2, b2, a3, free2)

    deliveries = acquire(backend, limit=10)

    assert set(ids(deliveries)) == {a1.id, b1.id, free1.id, free2.id}
    assert acquire(backend, limit=10) == []


def test_the_next_job_of_a_key_runs_once_the_head_completes(backend: Backend) -> None:
    first, second, third = (new_job(ordering_key="k") for _ in range(3))
    insert(backend, first, second, third)

    order = []
    for step in range(3):
        (delivery,) = acquire(backend, limit=10, now=at(step))
        order.append(delivery.id)
        assert acquire(backend, limit=10, now=at(step)) == []
        assert complete(backend, delivery, now=at(step)) == 1

    assert order == [first.id, second.id, third.id]


def test_a_retrying_head_blocks_its_key(backend: Backend) -> None:
    head, behind = new_job(ordering_key="k"), new_job(ordering_key="k")
    insert(backend, head, behind)
    (delivery,) = acquire(backend)
    assert retry(backend, delivery, run_at=at(100), now=at(1)) == 1

    # The head waits to retry; the job behind it must not overtake it.
    assert acquire(backend, now=at(50)) == []

    (again,) = acquire(backend, now=at(100))
    assert again.id == head.id
    assert complete(backend, again, now=at(101)) == 1
    assert ids(acquire(backend, now=at(102))) == [behind.id]


def test_a_dead_lettered_head_unblocks_its_key(backend: Backend) -> None:
    head, behind = new_job(ordering_key="k"), new_job(ordering_key="k")
    insert(backend, head, behind)
    (delivery,) = acquire(backend)

    assert dead(backend, delivery, now=at(1)) == 1

    assert ids(acquire(backend, now=at(2))) == [behind.id]


def test_the_head_rule_follows_enqueue_order_not_priority(backend: Backend) -> None:
    early_low = new_job(ordering_key="k", priority=0)
    late_high = new_job(ordering_key="k", priority=9)
    insert(backend, early_low, late_high)

    assert ids(acquire(backend, limit=10)) == [early_low.id]


def test_a_scheduled_head_blocks_ready_jobs_behind_it(backend: Backend) -> None:
    head = new_job(ordering_key="k", run_at=at(60))
    behind = new_job(ordering_key="k", run_at=at(0))
    insert(backend, head, behind)

    assert acquire(backend, now=at(10)) == []
    assert ids(acquire(backend, now=at(60))) == [head.id]


def test_released_and_rescued_heads_keep_their_place(backend: Backend) -> None:
    head, behind = new_job(ordering_key="k"), new_job(ordering_key="k")
    insert(backend, head, behind)

    (delivery,) = acquire(backend, visibility_timeout=10)
    backend.jobs_release_many(JobsReleaseParams(items=[LeaseRef(id=delivery.id, receipt=delivery.receipt)], now=at(1)))
    (delivery,) = acquire(backend, now=at(2), visibility_timeout=10)
    assert delivery.id == head.id

    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(20))) == 1
    assert ids(acquire(backend, now=at(21))) == [head.id]


def test_keys_are_scoped_per_queue(backend: Backend) -> None:
    in_a = new_job("queue-a", ordering_key="shared")
    in_b = new_job("queue-b", ordering_key="shared")
    insert(backend, in_a, in_b)

    assert ids(acquire(backend, queue="queue-a")) == [in_a.id]
    assert ids(acquire(backend, queue="queue-b")) == [in_b.id]


def test_a_smaller_id_committed_late_waits_for_the_job_in_flight(backend: Backend) -> None:
    # Ids are minted before commit: the earlier-minted job of a key may commit after a later one
    # was already handed out. It must not run beside it.
    minted_first, minted_second = new_job(ordering_key="k"), new_job(ordering_key="k")
    insert(backend, minted_second)
    (running,) = acquire(backend)
    insert(backend, minted_first)

    assert acquire(backend, now=at(1)) == []

    assert complete(backend, running, now=at(2)) == 1
    assert ids(acquire(backend, now=at(3))) == [minted_first.id]
