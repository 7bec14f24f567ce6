"""An idempotency key held by an application's open transaction (a transactional enqueue not committed yet)
against a live `conveyor serve`: the send with that key waits on its own, every other send is answered at once.

Before: the group's insert waited on the uncommitted key, and with one group at a time every other send of the
process (other keys, other queues, other producers) waited with it, as long as the transaction stayed open."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from tests.conftest import mysql_connect
from tests.http.conftest import Server, serving

from conveyor import App

QUICK = 4.0  # seconds an unrelated send may take while the key is held (before the fix: 7-30 s, or for ever)


@pytest.fixture(params=["postgres", "mysql"])
def held_db(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("postgres_database" if request.param == "postgres" else "mysql_database"))


@pytest.fixture
def held_server(held_db: str, tmp_path: Path) -> Iterator[Server]:
    with serving(held_db, tmp_path) as server:
        yield server


def _open(db: str) -> Any:
    """An application's own connection, its transaction left open by the send."""
    return psycopg.connect(db) if db.startswith("postgresql") else mysql_connect(db, autocommit=False)


def _hold(db: str, key: str) -> Any:
    conn = _open(db)
    with App(db) as app:
        app.send("t", {"n": "held"}, queue="burst", idempotency_key=key, conn=conn)
    return conn


def _post(server: Server, body: dict[str, object]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with server.client("producer") as c:
        response = c.post("/v1/queues/burst/jobs", json=body)
    return response, time.monotonic() - started


def _others(server: Server, pool: ThreadPoolExecutor, quick: float = QUICK) -> list[tuple[httpx.Response, float]]:
    """Sends unrelated to the held key (no key, another key): each answered 202 within ``quick`` seconds."""
    bodies: list[dict[str, object]] = [{"task": "t", "payload": {"n": i}} for i in range(5)]
    bodies.append({"task": "t", "payload": {"n": "free"}, "idempotency_key": "free"})
    answers = list(pool.map(lambda b: _post(server, b), bodies))
    for response, took in answers:
        assert response.status_code == 202, response.text
        assert took < quick, f"a send unrelated to the held key took {took:.1f}s"
    return answers


def _waiting(future: Future[tuple[httpx.Response, float]], db: str, deadline: float = 10.0) -> None:
    """Wait until the held key's send waits in the database (its request still unanswered). MariaDB's
    INNODB_TRX did not always list the waiting transaction; its PROCESSLIST shows the waiting insert."""
    postgres = db.startswith("postgresql")
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        if postgres
        else "SELECT count(*) FROM information_schema.PROCESSLIST WHERE info LIKE 'INSERT INTO idempotency_keys%'"
    )
    end = time.monotonic() + deadline
    conn = psycopg.connect(db, autocommit=True) if postgres else mysql_connect(db)
    try:
        while True:
            if postgres:
                row = conn.execute(query).fetchone()
            else:
                with conn.cursor() as cur:
                    cur.execute(query)
                    row = cur.fetchone()
            if row is not None and row[0] >= 1:
                return
            assert not future.done(), future.result()[0].text
            assert time.monotonic() < end, "the held key's send never waited on the key"
            time.sleep(0.05)
    finally:
        conn.close()


def _count(db: str) -> int:
    with App(db) as app:
        return sum(q.pending for q in app.admin.queues())


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_a_held_key_stalls_only_its_own_send(held_server: Server, held_db: str, end: str) -> None:
    holder = _hold(held_db, "K")
    try:
        with ThreadPoolExecutor(8) as pool:
            keyed = pool.submit(_post, held_server, {"task": "t", "payload": {"n": "held"}, "idempotency_key": "K"})
            _waiting(keyed, held_db)
            others = _others(held_server, pool)  # before: each waited for the holder (stuck behind its group)
            assert not keyed.done(), keyed.result()[0].text  # a 202 only once the key's holder has committed
            getattr(holder, end)()
            response, _ = keyed.result(timeout=30)
    finally:
        holder.close()
    assert response.status_code == 202, response.text
    answer = response.json()
    with App(held_db) as app:
        stored = app.job(answer["id"])
        assert stored.payload == {"n": "held"}
    assert answer["duplicate"] is (end == "commit")
    # The holder's job or the send's, never both; and each other send once.
    assert _count(held_db) == 1 + len(others)
    assert len({r.json()["id"] for r, _ in others} | {answer["id"]}) == 1 + len(others)


def test_a_key_held_past_the_wait_is_answered_409_key_in_use_and_nothing_is_written(
    held_server: Server, held_db: str
) -> None:
    holder = _hold(held_db, "K")
    try:
        response, took = _post(held_server, {"task": "t", "payload": {"n": "held"}, "idempotency_key": "K"})
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "key_in_use"
        assert "'K'" in error["message"] and "not committed" in error["message"]
        assert int(response.headers["retry-after"]) >= 1
        assert took < 30
        holder.commit()
    finally:
        holder.close()
    retried, _ = _post(held_server, {"task": "t", "payload": {"n": "held"}, "idempotency_key": "K"})
    assert retried.status_code == 202 and retried.json()["duplicate"] is True, retried.text
    assert _count(held_db) == 1


def test_many_held_keys_never_stall_unrelated_sends(held_server: Server, held_db: str) -> None:
    # More held keys than the service waits on at once: the rest are answered 409 at once, the others 202.
    # Each held key in a group costs the bisection a lock wait (0.1 s) per level: 8 at once may take
    # ~1.5 s of the group lane, so the bound here is looser than with one held key.
    holders = [_hold(held_db, f"K{i}") for i in range(8)]
    try:
        with ThreadPoolExecutor(16) as pool:
            keyed = [
                pool.submit(_post, held_server, {"task": "t", "payload": {"n": "held"}, "idempotency_key": f"K{i}"})
                for i in range(8)
            ]
            time.sleep(0.5)
            others = _others(held_server, pool, quick=3 * QUICK)
            for holder in holders:
                holder.commit()
            answers = [f.result(timeout=30)[0] for f in keyed]
    finally:
        for holder in holders:
            holder.close()
    codes = sorted(a.status_code for a in answers)
    assert set(codes) <= {202, 409}, [a.text for a in answers]
    for answer in answers:
        if answer.status_code == 202:
            assert answer.json()["duplicate"] is True
        else:
            assert answer.json()["error"]["code"] == "key_in_use"
    assert _count(held_db) == 8 + len(others)


def _post_batch(server: Server, body: dict[str, object]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with server.client("producer") as c:
        response = c.post("/v1/queues/burst/jobs:batch", json=body)
    return response, time.monotonic() - started


def _keyed_batch(n: object, payload: object = "held") -> dict[str, object]:
    return {
        "jobs": [{"task": "t", "payload": {"n": n}}, {"task": "t", "payload": {"n": payload}, "idempotency_key": "K"}]
    }


@pytest.mark.parametrize("path", ["batch", "no-group-commit"])
def test_sends_of_a_held_key_outside_the_group_commit_never_stall_unrelated_sends(
    held_db: str, tmp_path: Path, path: str
) -> None:
    # More sends of the held key than the service has threads for its blocking calls (6 on two cores): before, each
    # waited for the holder in one of them (PostgreSQL: as long as it stayed open; MariaDB: 30 s), and every other
    # request of the process (its token read, its admission, the group inserts) queued behind them.
    with serving(held_db, tmp_path, *(["--no-group-commit"] if path == "no-group-commit" else [])) as server:
        holder = _hold(held_db, "K")
        try:
            with ThreadPoolExecutor(20) as pool:
                if path == "batch":
                    keyed = [pool.submit(_post_batch, server, _keyed_batch(f"b{i}")) for i in range(8)]
                else:
                    keyed = [
                        pool.submit(_post, server, {"task": "t", "payload": {"n": "held"}, "idempotency_key": "K"})
                        for _ in range(8)
                    ]
                time.sleep(0.5)
                others = _others(server, pool, quick=3 * QUICK)
                holder.commit()
                answers = [f.result(timeout=30)[0] for f in keyed]
        finally:
            holder.close()
    stored = 0
    for answer in answers:
        if answer.status_code == 202:
            jobs = answer.json()["jobs"] if path == "batch" else [answer.json()]
            assert jobs[-1]["duplicate"] is True, answer.text
            stored += len(jobs) - 1
        else:
            assert answer.status_code == 409 and answer.json()["error"]["code"] == "key_in_use", answer.text
            assert int(answer.headers["retry-after"]) >= 1
    # Nothing of a batch answered 409 was written; the held key's job once.
    assert _count(held_db) == 1 + len(others) + stored


def test_a_stop_while_sends_wait_for_a_held_key_answers_each_and_writes_nothing_twice(
    held_db: str, tmp_path: Path
) -> None:
    with serving(held_db, tmp_path) as server:
        holder = _hold(held_db, "K")
        try:
            with ThreadPoolExecutor(8) as pool:
                single = {"task": "t", "payload": {"n": "held"}, "idempotency_key": "K"}
                sends = [pool.submit(_post, server, single) for _ in range(3)]
                sends += [pool.submit(_post_batch, server, _keyed_batch(f"b{i}")) for i in range(3)]
                time.sleep(0.7)
                server.proc.terminate()
                answers = [f.result(timeout=40)[0] for f in sends]
                server.proc.wait(timeout=40)
            holder.commit()
        finally:
            holder.close()
    # Each answered (the holder stayed open past the waits: 409, nothing of the request written), none hung.
    for answer in answers:
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "key_in_use", answer.text
    assert _count(held_db) == 1


def test_a_held_key_committed_with_another_payload_is_a_conflict(held_server: Server, held_db: str) -> None:
    holder = _hold(held_db, "K")
    try:
        with ThreadPoolExecutor(2) as pool:
            other = {"task": "t", "payload": {"n": "other"}, "idempotency_key": "K"}
            single = pool.submit(_post, held_server, other)
            batch = pool.submit(_post_batch, held_server, _keyed_batch("b", "other"))
            time.sleep(1.0)
            holder.commit()
            answers = [single.result(timeout=30)[0], batch.result(timeout=30)[0]]
    finally:
        holder.close()
    assert [a.json()["error"]["code"] for a in answers] == ["conflict", "conflict"], [a.text for a in answers]
    assert _count(held_db) == 1


def test_a_storm_of_sends_of_one_held_key_never_stalls_unrelated_sends(held_server: Server, held_db: str) -> None:
    # Clients retrying a held key (409 key_in_use says retry in 2 s) land many sends of it in one group. Before, the
    # group's bisection waited 0.1 s for each part holding the key, down to each send alone: 60 sends of the key
    # cost the group lane ~0.1 s x 120, and every other send of the process waited with it (40 sends: an unrelated
    # send took 8.9 s on PostgreSQL, 4.6 s on MariaDB).
    holder = _hold(held_db, "K")
    single = {"task": "t", "payload": {"n": "held"}, "idempotency_key": "K"}
    limits = httpx.Limits(max_connections=64)
    try:
        with ThreadPoolExecutor(72) as pool, held_server.client("producer", limits=limits) as storm:
            keyed = [pool.submit(storm.post, "/v1/queues/burst/jobs", json=single) for _ in range(60)]
            time.sleep(0.3)
            others = _others(held_server, pool)
            holder.commit()
            answers = [f.result(timeout=30) for f in keyed]
    finally:
        holder.close()
    for answer in answers:
        if answer.status_code == 202:
            assert answer.json()["duplicate"] is True, answer.text
        else:
            assert answer.status_code == 409 and answer.json()["error"]["code"] == "key_in_use", answer.text
    assert _count(held_db) == 1 + len(others)
