"""Group commit against a live `conveyor serve`: concurrent single-job requests share transactions, every
202 is durable, and one bad request in a group fails only itself."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql
from tests.http.conftest import Server, make_tokens, start, stop

from conveyor import App

N = 200


async def _burst(server: Server, bodies: list[dict[str, object]], role: str = "producer") -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    headers = {"Authorization": f"Bearer {server.tokens[role]}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, limits=limits, timeout=60) as client:
        return await asyncio.gather(*(client.post("/v1/queues/burst/jobs", json=b) for b in bodies))


def _transactions(db: str, ids: list[str]) -> int:
    """How many transactions inserted these jobs: distinct xmin on PostgreSQL (the inserting
    transaction's id); distinct enqueued_at on SQLite (one timestamp per insert call)."""
    if db.startswith("postgresql"):
        with psycopg.connect(db) as conn:
            query = "SELECT count(DISTINCT xmin::text) FROM jobs WHERE id = ANY(%s::uuid[])"
            row = conn.execute(query, [ids]).fetchone()
            assert row is not None
            return int(row[0])
    with App(db) as app:
        return len({app.job(i).enqueued_at for i in ids})


def test_concurrent_requests_share_transactions_and_every_202_is_durable(server: Server) -> None:
    responses = asyncio.run(_burst(server, [{"task": "t", "payload": {"n": i}} for i in range(N)]))
    assert [r.status_code for r in responses] == [202] * N
    ids = [r.json()["id"] for r in responses]
    with App(server.db) as app:  # a fresh connection: what the service answered 202 for is committed
        assert sorted(app.job(i).payload["n"] for i in ids) == list(range(N))
    transactions = _transactions(server.db, ids)
    assert 1 <= transactions < N / 2, transactions


def test_one_bad_request_never_fails_the_others(server: Server) -> None:
    with server.client("producer") as c:
        first = c.post("/v1/queues/burst/jobs", json={"task": "t", "payload": {"k": 0}, "idempotency_key": "held"})
        assert first.status_code == 202
    bodies: list[dict[str, object]] = []
    for i in range(N):
        if i % 10 == 3:
            bodies.append({"task": "t", "priority": "urgent"})  # 400
        elif i % 10 == 6:
            bodies.append({"task": "t", "payload": {"k": i}, "idempotency_key": "held"})  # 409: another payload
        elif i % 10 == 9:
            bodies.append({"task": "t", "payload": {"blob": "x" * 300_000}})  # 413
        else:
            bodies.append({"task": "t", "payload": {"n": i}})
    responses = asyncio.run(_burst(server, bodies))
    expected = {3: 400, 6: 409, 9: 413}
    assert [r.status_code for r in responses] == [expected.get(i % 10, 202) for i in range(N)]
    good = [r.json()["id"] for r in responses if r.status_code == 202]
    with App(server.db) as app:
        stats = {q.queue: q.pending for q in app.admin.queues()}
        assert stats == {"burst": len(good) + 1}  # the good ones and the first holder of "held", nothing else
        assert all(app.job(i).state == "pending" for i in good)


def test_a_request_whose_text_the_database_cannot_hold_fails_alone(
    postgres_database_in: Callable[[str], str], tmp_path: Path
) -> None:
    # A LATIN1 database holds 'é' but not '€': those requests get a 400, the rest of their groups 202.
    db = postgres_database_in("LATIN1")
    tokens = make_tokens(db)
    server = start(db, tmp_path)
    server.tokens = tokens
    bodies: list[dict[str, object]] = [
        {"task": "t", "payload": {"price": "5 €" if i % 10 == 4 else "café", "n": i}} for i in range(N)
    ]
    try:
        responses = asyncio.run(_burst(server, bodies))
        # Text in a filter is the caller's too: a 400 naming the character, not a 500.
        with server.client("admin") as c:
            listed = c.get("/v1/dead-letters", params={"task": "t€"})
    finally:
        stop(server)
    assert [r.status_code for r in responses] == [400 if i % 10 == 4 else 202 for i in range(N)]
    assert "cannot store U+20AC EURO SIGN" in responses[4].json()["error"]["message"]
    assert listed.status_code == 400, listed.text
    assert "cannot store U+20AC EURO SIGN" in listed.json()["error"]["message"]
    with App(db) as app:
        assert sum(q.pending for q in app.admin.queues()) == N - N // 10


def test_without_group_commit_each_request_is_its_own_transaction(postgres_database: str, tmp_path: Path) -> None:
    tokens = make_tokens(postgres_database)
    server = start(postgres_database, tmp_path, "--no-group-commit")
    server.tokens = tokens
    try:
        responses = asyncio.run(_burst(server, [{"task": "t", "payload": {"n": i}} for i in range(50)]))
    finally:
        stop(server)
    assert [r.status_code for r in responses] == [202] * 50
    assert _transactions(postgres_database, [r.json()["id"] for r in responses]) == 50


@pytest.mark.parametrize("workers", [2])
def test_group_commit_with_several_processes(postgres_database: str, tmp_path: Path, workers: int) -> None:
    tokens = make_tokens(postgres_database)
    server = start(postgres_database, tmp_path, "--workers", str(workers))
    server.tokens = tokens
    try:
        responses = asyncio.run(_burst(server, [{"task": "t", "payload": {"n": i}} for i in range(N)]))
    finally:
        stop(server)
    assert [r.status_code for r in responses] == [202] * N
    ids = [r.json()["id"] for r in responses]
    assert _transactions(postgres_database, ids) < N / 2
    with App(postgres_database) as app:
        assert sum(q.pending for q in app.admin.queues()) == N


def test_a_group_longer_than_the_statement_timeout_is_split_not_refused_whole(
    postgres_database: str, tmp_path: Path
) -> None:
    # Each job costs 5 ms to insert (a heavy trigger of the user's) and the database cancels statements
    # past 300 ms: a group of ~200 is cancelled, one of ~50 is not. Before: every request of the
    # cancelled group got a 503, and so did their retries, grouped again as large.
    tokens = make_tokens(postgres_database)
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM pg_sleep(0.005); RETURN NULL; END $$; "
            "CREATE TRIGGER slow_row AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION slow_row()"
        )
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET statement_timeout = '300ms'").format(sql.Identifier(conn.info.dbname))
        )
    server = start(postgres_database, tmp_path)
    server.tokens = tokens
    try:
        responses = asyncio.run(_burst(server, [{"task": "t", "payload": {"n": i}} for i in range(N)]))
    finally:
        stop(server)
    assert [r.status_code for r in responses] == [202] * N, {r.status_code: r.text for r in responses}
    with App(postgres_database) as app:
        assert sum(q.pending for q in app.admin.queues()) == N


def _raw_send(server: Server, queue: str) -> socket.socket:
    body = json.dumps({"task": "t", "payload": {}}).encode()
    head = (
        f"POST /v1/queues/{queue}/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.tokens['producer']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    sock.sendall(head.encode() + body)
    return sock


def _answer(sock: socket.socket) -> bytes:
    sock.settimeout(60)
    received = b""
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_a_job_whose_request_was_cut_off_while_it_waited_for_a_group_is_not_inserted(
    postgres_database: str, tmp_path: Path
) -> None:
    # One insert hangs on a lock; three requests wait for the next group; SIGTERM. At the end of the graceful wait
    # all four are answered 503 stopping. Before: once the lock went, the three waiting jobs were inserted anyway,
    # so a client retrying its 503 (no idempotency key) enqueued its job twice.
    tokens = make_tokens(postgres_database)
    server = start(postgres_database, tmp_path)
    server.tokens = tokens
    lock = psycopg.connect(postgres_database)
    try:
        lock.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        under_way = _raw_send(server, "under-way")
        deadline = time.monotonic() + 20
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT%'"
        # Another session: pg_stat_activity is read once per transaction, and the lock's stays open.
        with psycopg.connect(postgres_database, autocommit=True) as watch:
            while watch.execute(query).fetchone() != (1,):
                assert time.monotonic() < deadline, "the first insert never waited on the lock"
                time.sleep(0.05)
        waiting = [_raw_send(server, "waiting") for _ in range(3)]
        time.sleep(1.0)  # read, authenticated and handed to the group commit, behind the hanging insert
        server.proc.terminate()
        answers = []
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_answer, sock) for sock in [under_way, *waiting]]
            deadline = time.monotonic() + 60
            while not all(f.done() for f in futures):
                assert time.monotonic() < deadline, "no answer"
                time.sleep(0.1)
            answers = [f.result() for f in futures]
            lock.rollback()  # the hanging insert goes on, while the process ends
        server.proc.wait(timeout=60)
    finally:
        lock.close()
        stop(server)
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "stopping", answer
    with psycopg.connect(postgres_database) as conn:
        counts = dict(conn.execute("SELECT queue, count(*) FROM jobs GROUP BY queue").fetchall())
    assert counts.get("waiting", 0) == 0, counts  # before: 3
    assert counts.get("under-way", 0) <= 1  # its insert was under way: it may or may not have taken effect
