"""The DLQ: listing dead letters, replaying and purging them, and the audit trail of both."""

from __future__ import annotations

import json

from _factory import acquire, at, complete, dead, get, ids, insert, live_ids, make_dead, new_job

from conveyor._ids import uuid7
from conveyor.backends.base import (
    AuditInsertParams,
    AuditListParams,
    Backend,
    DeadListParams,
    DeadPurgeParams,
    DeadReplayParams,
    ErrorInfo,
    JobGetParams,
)


def _replay(backend: Backend, *dead_ids: object, now_s: float = 100, actor: str = "alice") -> list[object]:
    pairs = [(dead_id, uuid7()) for dead_id in dead_ids]
    return list(
        backend.dead_replay_many(
            DeadReplayParams(replays=pairs, actor=actor, reason="fixed the bug", now=at(now_s))  # type: ignore[arg-type]
        )
    )


def test_dead_list_shows_unreplayed_dead_letters_newest_first(backend: Backend) -> None:
    jobs = [new_job("q") for _ in range(3)]
    insert(backend, *jobs)
    deliveries = acquire(backend, queue="q", limit=3)
    for n, delivery in enumerate(deliveries):
        assert dead(backend, delivery, now=at(n)) == 1

    listed = backend.dead_list(DeadListParams())

    assert ids(listed) == [jobs[2].id, jobs[1].id, jobs[0].id]
    assert {r.state for r in listed} == {"dead"}
    assert listed[0].payload == jobs[2].payload
    assert listed[0].error_type == "RuntimeError"
    assert listed[0].finished_at == at(2)


def test_dead_list_filters_and_pages(backend: Backend) -> None:
    in_a = make_dead(backend, 2, queue="a", task="t.one")
    in_b = make_dead(backend, 1, queue="b", task="t.two")
    insert(backend, new_job("a", task="t.one"))
    (other,) = acquire(backend, queue="a")
    dead(backend, other, now=at(5), error=ErrorInfo(type="KeyError", message="missing"))

    assert set(ids(backend.dead_list(DeadListParams(queue="a")))) == {*in_a, other.id}
    assert ids(backend.dead_list(DeadListParams(task="t.two"))) == in_b
    assert ids(backend.dead_list(DeadListParams(error_type="KeyError"))) == [other.id]
    assert ids(backend.dead_list(DeadListParams(queue="a", error_type="RuntimeError"))) != []

    everything = ids(backend.dead_list(DeadListParams()))
    assert len(everything) == 4
    page1 = ids(backend.dead_list(DeadListParams(limit=3)))
    page2 = ids(backend.dead_list(DeadListParams(limit=3, offset=3)))
    assert page1 + page2 == everything


def test_dead_list_excludes_other_terminal_states(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    complete(backend, delivery)

    assert backend.dead_list(DeadListParams()) == []


def test_replay_re_enqueues_with_fresh_attempts_and_links_both_rows(backend: Backend) -> None:
    original = new_job(
        "billing",
        task="billing.charge",
        priority=3,
        idempotency_key="charge-1",
        ordering_key="cust-1",
        max_attempts=4,
        max_deliveries=6,
        headers=json.dumps({"tenant": "acme"}),
    )
    insert(backend, original)
    (delivery,) = acquire(backend, queue="billing")
    dead(backend, delivery, now=at(1))
    new_id = uuid7()

    replayed = backend.dead_replay_many(
        DeadReplayParams(replays=[(original.id, new_id)], actor="alice", reason="fixed", now=at(100))
    )

    assert replayed == [(original.id, new_id)]
    fresh = get(backend, new_id)
    assert fresh.state == "pending"
    assert (fresh.attempts, fresh.deliveries) == (0, 0)
    assert fresh.replay_of == original.id
    assert fresh.run_at == at(100)
    assert (fresh.queue, fresh.task, fresh.payload) == ("billing", "billing.charge", original.payload)
    assert json.loads(fresh.headers) == {"tenant": "acme"}
    assert fresh.priority == 3
    assert (fresh.idempotency_key, fresh.ordering_key) == ("charge-1", "cust-1")
    assert (fresh.max_attempts, fresh.max_deliveries) == (4, 6)

    dead_row = get(backend, original.id)
    assert dead_row.state == "dead"
    assert dead_row.replayed_by == new_id
    assert backend.dead_list(DeadListParams()) == []
    assert ids(acquire(backend, queue="billing", now=at(100))) == [new_id]


def _dead_with_key(backend: Backend, key: str, dedup_until_s: float, now_s: float = 1) -> object:
    job = new_job("q", idempotency_key=key, dedup_until=at(dedup_until_s))
    insert(backend, job, now=at(now_s - 1))
    (delivery,) = acquire(backend, queue="q", now=at(now_s))
    dead(backend, delivery, now=at(now_s))
    return job.id


def _send_key(backend: Backend, key: str, now_s: float) -> tuple[object, object]:
    """Send a job with ``key``; return (the id the send answered, the new job's own id)."""
    job = new_job("q", idempotency_key=key, dedup_until=at(now_s + 50_000))
    (answered,) = insert(backend, job, now=at(now_s))
    return answered, job.id


def test_a_replay_takes_over_its_dead_letters_idempotency_key_until_the_window_ends(backend: Backend) -> None:
    # A hostile sweep: after a replay, a resend with the dead letter's key answered the dead letter,
    # not the live replay (as if the work were over for good while it was running again).
    original = _dead_with_key(backend, "K", dedup_until_s=3600)
    assert _send_key(backend, "K", now_s=2)[0] == original

    ((_, replay),) = _replay(backend, original, now_s=100)  # type: ignore[misc]
    assert _send_key(backend, "K", now_s=101)[0] == replay
    assert live_ids(backend, queue="q") == [replay]
    # Named again, the replayed dead letter is skipped and takes nothing back.
    assert _replay(backend, original, now_s=102) == []
    assert _send_key(backend, "K", now_s=103)[0] == replay

    # The replay's own dead letter hands the key on to its replay.
    (delivery,) = acquire(backend, queue="q", now=at(104))
    dead(backend, delivery, now=at(105))
    ((_, second),) = _replay(backend, replay, now_s=106)  # type: ignore[misc]
    assert _send_key(backend, "K", now_s=107)[0] == second

    # The window still ends when the original's did: then a send takes the key.
    answered, own = _send_key(backend, "K", now_s=3601)
    assert answered == own


def test_a_replay_leaves_a_key_another_job_took_after_the_window(backend: Backend) -> None:
    original = _dead_with_key(backend, "K", dedup_until_s=50)
    answered, successor = _send_key(backend, "K", now_s=60)
    assert answered == successor

    ((dead_id, _),) = _replay(backend, original, now_s=100)  # type: ignore[misc]
    assert dead_id == original
    assert _send_key(backend, "K", now_s=101)[0] == successor


def test_replay_skips_ids_that_are_not_unreplayed_dead_letters(backend: Backend) -> None:
    (dead_id,) = make_dead(backend, 1)
    insert(backend, new_job(), new_job())
    done, live = acquire(backend, limit=2)
    complete(backend, done)

    first = _replay(backend, dead_id, done.id, live.id, uuid7())
    again = _replay(backend, dead_id)

    assert [pair[0] for pair in first] == [dead_id]  # type: ignore[index]
    assert again == []
    assert get(backend, done.id).state == "completed"
    assert get(backend, live.id).state == "processing"
    assert len(live_ids(backend)) == 2  # the processing job and the one replay


def test_replay_writes_one_audit_row(backend: Backend) -> None:
    dead_ids = make_dead(backend, 3)

    replayed = _replay(backend, *dead_ids, now_s=50, actor="alice")

    assert len(replayed) == 3
    (entry,) = backend.audit_list(AuditListParams())
    assert entry.actor == "alice"
    assert entry.reason == "fixed the bug"
    assert entry.at == at(50)
    assert entry.action == "replay"
    assert set(entry.job_ids) == set(dead_ids)
    json.loads(entry.details)


def test_purge_deletes_dead_letters_for_good_and_is_audited(backend: Backend) -> None:
    dead_ids = make_dead(backend, 3)
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    complete(backend, delivery)

    purged = backend.dead_purge_many(
        DeadPurgeParams(ids=[dead_ids[0], dead_ids[1], delivery.id], actor="bob", reason="gdpr", now=at(10))
    )

    assert purged == 2
    assert backend.job_get(JobGetParams(id=dead_ids[0])) is None
    assert backend.job_get(JobGetParams(id=dead_ids[1])) is None
    assert get(backend, delivery.id).state == "completed"
    assert ids(backend.dead_list(DeadListParams())) == [dead_ids[2]]
    (entry,) = backend.audit_list(AuditListParams())
    assert (entry.actor, entry.action, entry.reason) == ("bob", "purge", "gdpr")
    assert set(entry.job_ids) == {dead_ids[0], dead_ids[1]}
    assert entry.at == at(10)


def test_audit_list_is_newest_first_and_limited(backend: Backend) -> None:
    dead_ids = make_dead(backend, 2)
    _replay(backend, dead_ids[0], now_s=1, actor="first")
    backend.dead_purge_many(DeadPurgeParams(ids=[dead_ids[1]], actor="second", reason="r", now=at(2)))

    entries = backend.audit_list(AuditListParams())
    assert [e.actor for e in entries] == ["second", "first"]
    assert [e.actor for e in backend.audit_list(AuditListParams(limit=1))] == ["second"]
    assert entries[0].at == at(2) and entries[1].at == at(1)


def test_audit_list_of_one_job_finds_its_actions_however_many_came_after(backend: Backend) -> None:
    dead_ids = make_dead(backend, 3)
    _replay(backend, dead_ids[0], dead_ids[1], now_s=1, actor="first")
    backend.dead_purge_many(DeadPurgeParams(ids=[dead_ids[1]], actor="second", reason="r", now=at(2)))
    for n in range(1_100):  # more than the last 1,000 actions the dashboard's job page read
        backend.audit_insert(AuditInsertParams("ops", "schedule_pause", "", at(3 + n), (), "{}"))

    assert [e.actor for e in backend.audit_list(AuditListParams(limit=1000, job_id=dead_ids[1]))] == ["second", "first"]
    assert [e.actor for e in backend.audit_list(AuditListParams(limit=1, job_id=dead_ids[1]))] == ["second"]
    assert [e.actor for e in backend.audit_list(AuditListParams(job_id=dead_ids[0]))] == ["first"]
    assert backend.audit_list(AuditListParams(job_id=dead_ids[2])) == []
    assert backend.audit_list(AuditListParams(job_id=uuid7())) == []
    assert len(backend.audit_list(AuditListParams(limit=2000))) == 1_102  # no job: every action
