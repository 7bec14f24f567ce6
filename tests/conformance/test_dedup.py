"""Producer-side deduplication: an idempotency key is held for its dedup window, per queue."""

from __future__ import annotations

import json

import pytest
from _factory import T0, acquire, at, complete, get, insert, live_ids, new_job

from conveyor._errors import IdempotencyConflict
from conveyor.backends.base import Backend, JobsInsertParams


def test_a_duplicate_inside_the_window_returns_the_holder_and_inserts_nothing(backend: Backend) -> None:
    original = new_job(idempotency_key="order-42", dedup_until=at(3600))
    insert(backend, original, now=T0)

    duplicate = new_job(idempotency_key="order-42", dedup_until=at(7200))
    assert insert(backend, duplicate, now=at(60)) == [original.id]

    assert live_ids(backend) == [original.id]
    assert get(backend, original.id).enqueued_at == T0


def test_duplicates_within_one_batch_collapse_to_the_first(backend: Backend) -> None:
    first = new_job(idempotency_key="k", dedup_until=at(3600))
    second = new_job(idempotency_key="k", dedup_until=at(3600))
    other = new_job(idempotency_key="other", dedup_until=at(3600))

    assert insert(backend, first, second, other) == [first.id, first.id, other.id]
    assert live_ids(backend) == [first.id, other.id]


def test_after_the_window_the_key_is_taken_by_the_new_job(backend: Backend) -> None:
    original = new_job(idempotency_key="k", dedup_until=at(100))
    insert(backend, original, now=T0)

    successor = new_job(idempotency_key="k", dedup_until=at(500))
    assert insert(backend, successor, now=at(101)) == [successor.id]
    assert set(live_ids(backend)) == {original.id, successor.id}

    # The successor now holds the key for its own window.
    late = new_job(idempotency_key="k", dedup_until=at(900))
    assert insert(backend, late, now=at(200)) == [successor.id]


def test_keys_are_scoped_per_queue(backend: Backend) -> None:
    in_a = new_job("a", idempotency_key="k", dedup_until=at(3600))
    in_b = new_job("b", idempotency_key="k", dedup_until=at(3600))

    assert insert(backend, in_a, in_b) == [in_a.id, in_b.id]
    assert live_ids(backend, queue="a") == [in_a.id]
    assert live_ids(backend, queue="b") == [in_b.id]


def test_the_key_stays_held_after_its_job_finished(backend: Backend) -> None:
    original = new_job(idempotency_key="k", dedup_until=at(3600))
    insert(backend, original)
    (delivery,) = acquire(backend)
    assert complete(backend, delivery, now=at(1)) == 1

    assert insert(backend, new_job(idempotency_key="k", dedup_until=at(7200)), now=at(2)) == [original.id]
    assert live_ids(backend) == []
    assert get(backend, original.id).state == "completed"


def test_jobs_without_a_key_are_never_deduplicated(backend: Backend) -> None:
    a, b = new_job(payload='{"same": 1}'), new_job(payload='{"same": 1}')

    assert insert(backend, a, b) == [a.id, b.id]
    assert live_ids(backend) == [a.id, b.id]


def test_a_strict_insert_refuses_a_key_held_by_another_payload_and_writes_nothing(backend: Backend) -> None:
    held = new_job(idempotency_key="k", dedup_until=at(3600))
    insert(backend, held)
    fresh = new_job()
    changed = new_job(idempotency_key="k", dedup_until=at(3600), payload=json.dumps({"x": 2}))
    with pytest.raises(IdempotencyConflict, match="'k'"):
        backend.jobs_insert_many(JobsInsertParams([fresh, changed], T0, strict_keys=True))
    # Within one batch too: the second job of a key, with another payload, refuses the first.
    first = new_job(idempotency_key="twin", dedup_until=at(3600))
    other = new_job(idempotency_key="twin", dedup_until=at(3600), task="tasks.other")
    with pytest.raises(IdempotencyConflict):
        backend.jobs_insert_many(JobsInsertParams([first, other], T0, strict_keys=True))
    assert live_ids(backend) == [held.id]
    # The same job again (payload equal as JSON) is a resend: the holder's id, the rest written.
    again = new_job(idempotency_key="k", dedup_until=at(3600), payload='{ "x" : 1.0 }')
    assert backend.jobs_insert_many(JobsInsertParams([fresh, again], T0, strict_keys=True)) == [fresh.id, held.id]
    assert live_ids(backend) == [held.id, fresh.id]
    # A large float: PostgreSQL's jsonb gives it back as an integer's digits; a resend is still the
    # same job (a sweep found a retried send of {"x": 1e23} refused with 409 on PostgreSQL only).
    big = new_job(idempotency_key="big", dedup_until=at(3600), payload='{"x":1e23,"y":1.5e300}')
    insert(backend, big)
    resent = new_job(idempotency_key="big", dedup_until=at(3600), payload='{"x":1e23,"y":1.5e300}')
    assert backend.jobs_insert_many(JobsInsertParams([resent], T0, strict_keys=True)) == [big.id]
    bigger = new_job(idempotency_key="big", dedup_until=at(3600), payload='{"x":1e24,"y":1.5e300}')
    with pytest.raises(IdempotencyConflict):
        backend.jobs_insert_many(JobsInsertParams([bigger], T0, strict_keys=True))
