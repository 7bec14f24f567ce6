"""Leases and receipts: a stale receipt (an earlier delivery's) changes nothing."""

from __future__ import annotations

import pytest
from _factory import VT, acquire, at, complete, dead, get, insert, new_job, retry

from conveyor.backends.base import (
    Backend,
    Delivery,
    JobsReleaseParams,
    JobsRescueParams,
    LeaseRef,
    LeasesExtendParams,
)


def _redelivered(backend: Backend) -> tuple[Delivery, Delivery]:
    """A job delivered, its lease lost (rescued), then delivered again: (stale, current)."""
    insert(backend, new_job())
    (stale,) = acquire(backend, visibility_timeout=VT)
    assert backend.jobs_rescue_expired(JobsRescueParams(now=at(VT + 1))) == 1
    (current,) = acquire(backend, now=at(VT + 2), worker_id="worker-2")
    assert current.id == stale.id and current.receipt != stale.receipt
    return stale, current


def _extend(backend: Backend, *deliveries: Delivery, now_s: float, vt: float = VT, wait: bool = True) -> list[object]:
    return list(
        backend.leases_extend_many(
            LeasesExtendParams(
                items=[LeaseRef(id=d.id, receipt=d.receipt) for d in deliveries],
                visibility_timeout=vt,
                now=at(now_s),
                wait=wait,
            )
        )
    )


# The heartbeat's form (wait=False, which skips rows other transactions hold locked) and ctx.extend's
# agree when nothing is locked (tests/postgres/test_pg_session_settings.py has the locked row).
WAITS = pytest.mark.parametrize("wait", [True, False], ids=["wait", "skip_locked"])


@WAITS
def test_extend_pushes_the_lease_of_held_deliveries(backend: Backend, wait: bool) -> None:
    insert(backend, new_job(), new_job())
    a, b = acquire(backend, limit=2, visibility_timeout=VT)

    extended = _extend(backend, a, b, now_s=10, vt=120, wait=wait)

    assert set(extended) == {a.id, b.id}
    assert get(backend, a.id).lease_expires_at == at(130)
    assert get(backend, b.id).lease_expires_at == at(130)


@WAITS
def test_extend_with_a_stale_receipt_is_refused_and_changes_nothing(backend: Backend, wait: bool) -> None:
    stale, current = _redelivered(backend)
    lease_before = get(backend, current.id).lease_expires_at

    assert _extend(backend, stale, now_s=VT + 3, vt=600, wait=wait) == []
    assert get(backend, current.id).lease_expires_at == lease_before
    assert _extend(backend, current, now_s=VT + 3, vt=600, wait=wait) == [current.id]


@WAITS
def test_extend_of_a_finished_job_reports_the_lease_lost(backend: Backend, wait: bool) -> None:
    insert(backend, new_job(), new_job())
    done, held = acquire(backend, limit=2)
    assert complete(backend, done) == 1

    assert _extend(backend, done, held, now_s=5, wait=wait) == [held.id]


def test_finish_with_a_stale_receipt_is_skipped(backend: Backend) -> None:
    stale, current = _redelivered(backend)

    assert complete(backend, stale, now=at(VT + 3)) == 0
    record = get(backend, current.id)
    assert record.state == "processing"
    assert record.worker_id == "worker-2"

    assert complete(backend, current, now=at(VT + 4)) == 1
    assert get(backend, current.id).state == "completed"


def test_dead_letter_with_a_stale_receipt_is_skipped(backend: Backend) -> None:
    stale, current = _redelivered(backend)

    assert dead(backend, stale, now=at(VT + 3)) == 0
    assert get(backend, current.id).state == "processing"


def test_retry_with_a_stale_receipt_is_skipped(backend: Backend) -> None:
    stale, current = _redelivered(backend)

    assert retry(backend, stale, run_at=at(999), now=at(VT + 3)) == 0
    record = get(backend, current.id)
    assert record.state == "processing"
    assert record.attempts == 0
    assert record.run_at != at(999)


def test_release_with_a_stale_receipt_is_skipped(backend: Backend) -> None:
    stale, current = _redelivered(backend)

    released = backend.jobs_release_many(
        JobsReleaseParams(items=[LeaseRef(id=stale.id, receipt=stale.receipt)], now=at(VT + 3))
    )

    assert released == 0
    record = get(backend, current.id)
    assert record.state == "processing"
    assert (record.deliveries, record.rescues) == (0, 1)


def test_a_receipt_acts_only_once(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)

    assert complete(backend, delivery, now=at(1)) == 1
    assert complete(backend, delivery, now=at(2)) == 0
    assert dead(backend, delivery, now=at(3)) == 0
    record = get(backend, delivery.id)
    assert record.state == "completed"
    assert record.finished_at == at(1)


def test_a_retried_delivery_cannot_act_again(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    assert retry(backend, delivery, run_at=at(10)) == 1

    assert complete(backend, delivery, now=at(1)) == 0
    assert _extend(backend, delivery, now_s=1) == []
    assert get(backend, delivery.id).state == "pending"
