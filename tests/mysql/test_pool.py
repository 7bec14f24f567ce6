"""The MySQL backend's pool of connections."""

from __future__ import annotations

import pytest
from tests.conftest import mysql_connect

from conveyor.backends import open_backend
from conveyor.backends.mysql import _connection


def test_an_idle_connection_the_server_closed_is_replaced_not_reported(
    mysql_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the pool handed out a connection whose session the server had ended (its wait_timeout, a
    # restart, a proxy), and the call failed with BackendUnavailable; a producer idle for a night lost
    # its first send of the morning to it.
    backend = open_backend(mysql_database)
    try:
        assert backend.database_now() is not None
        with mysql_connect(mysql_database) as admin, admin.cursor() as cur:
            cur.execute("SELECT id FROM information_schema.PROCESSLIST WHERE db = DATABASE() AND id <> CONNECTION_ID()")
            sessions = [row[0] for row in cur.fetchall()]
            assert sessions, "the backend keeps its connection"
            for session in sessions:
                cur.execute("KILL CONNECTION %s", (session,))
        monkeypatch.setattr(_connection, "IDLE_CHECK_S", 0.0)
        assert backend.database_now() is not None
    finally:
        backend.close()
