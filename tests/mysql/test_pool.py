"""The MySQL backend's connection pool: a connection the server closed while it sat idle is not used."""

from __future__ import annotations

import time

from tests.conftest import mysql_connect

from conveyor import App
from conveyor.backends.mysql._connection import CHECK_IDLE_AFTER_S


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
