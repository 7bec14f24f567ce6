"""The MySQL backend's connection pool: a connection the server closed while it sat idle is not used; a write with a
lock wait of its own gives its connection back with the pool's."""

from __future__ import annotations

import time

import pytest
from tests.conftest import mysql_connect

from conveyor import App, BackendError
from conveyor.backends.mysql._connection import CHECK_IDLE_AFTER_S, LOCK_WAIT_TIMEOUT_S, Cursor, Pool
from conveyor.backends.mysql._url import connect_kwargs


def _kill_sessions(server_url: str, database_url: str) -> int:
    database = database_url.rpartition("/")[2]
    with mysql_connect(server_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM information_schema.PROCESSLIST WHERE db = %s", (database,))
        sessions = [row[0] for row in cur.fetchall()]
        for session in sessions:
            cur.execute("KILL CONNECTION %s", (session,))
    return len(sessions)


def test_a_connection_the_server_closed_while_idle_is_replaced(mysql_server_url: str, mysql_database: str) -> None:
    # What a server restart or wait_timeout (8 hours by default) does to an application's idle pool:
    # before, the next send on each pooled connection failed as "MySQL unavailable".
    app = App(mysql_database)
    try:
        app.admin.migrate()
        app.send("t", {})
        assert _kill_sessions(mysql_server_url, mysql_database) >= 1
        time.sleep(CHECK_IDLE_AFTER_S + 0.2)
        app.send("t", {})
        assert [q.pending for q in app.admin.queues()] == [2]
    finally:
        app.close()


def _session(cur: Cursor) -> tuple[int, int]:
    cur.execute("SELECT CONNECTION_ID() AS id, @@SESSION.innodb_lock_wait_timeout AS wait")
    row = cur.fetchone()
    assert row is not None
    return int(row["id"]), int(row["wait"])


def test_a_write_with_its_own_lock_wait_that_the_server_refuses_keeps_its_connection(mysql_database: str) -> None:
    # Before: any failure of a write with a lock wait of its own (a batch of keyed jobs whose key another payload
    # had: 409 over HTTP) closed its pooled connection, and the next write opened a new one.
    pool = Pool(connect_kwargs(mysql_database))
    try:
        pool.write("setup", lambda cur: cur.execute("CREATE TABLE t (id INT PRIMARY KEY)"))
        before = pool.read("session", _session)

        def duplicate(cur: Cursor) -> None:
            cur.execute("INSERT INTO t VALUES (1)")
            cur.execute("INSERT INTO t VALUES (1)")

        with pytest.raises(BackendError, match="Duplicate entry"):
            pool.write("duplicate", duplicate, lock_wait=0)
        assert pool.read("session", _session) == before == (before[0], LOCK_WAIT_TIMEOUT_S)
        assert pool.read("count", lambda cur: cur.execute("SELECT * FROM t")) == 0  # rolled back
    finally:
        pool.close()


def test_a_write_with_its_own_lock_wait_whose_connection_dies_after_its_commit_returns(
    mysql_server_url: str, mysql_database: str
) -> None:
    # Before: the session's lock wait was put back after the COMMIT, and the connection lost in between made the
    # committed write raise "MySQL unavailable": a client then sent again what was written.
    pool = Pool(connect_kwargs(mysql_database))
    try:
        pool.write("setup", lambda cur: cur.execute("CREATE TABLE t (id INT PRIMARY KEY)"))

        def insert_then_lose_the_connection(cur: Cursor) -> str:
            cur.execute("INSERT INTO t VALUES (1)")
            conn, (session, _) = cur.connection, _session(cur)
            commit = conn.commit

            def commit_then_killed() -> None:
                commit()
                with mysql_connect(mysql_server_url) as killer, killer.cursor() as other:
                    other.execute("KILL CONNECTION %s", (session,))

            conn.commit = commit_then_killed  # type: ignore[method-assign]
            return "written"

        assert pool.write("insert", insert_then_lose_the_connection, lock_wait=0) == "written"
        assert pool.read("count", lambda cur: cur.execute("SELECT * FROM t")) == 1
        assert pool.read("session", _session)[1] == LOCK_WAIT_TIMEOUT_S  # a new connection, the pool's wait
    finally:
        pool.close()
