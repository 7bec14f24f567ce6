"""Keys claimed inside callers' own transactions (``conn=``) at MySQL's default isolation, REPEATABLE
READ: transactions claiming different keys neither wait for nor deadlock each other."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pymysql
import pytest
from tests.conftest import mysql_connect

from conveyor import App
from conveyor.backends.base import ProcessedKeyClaimParams


@pytest.fixture
def app(mysql_database: str) -> Iterator[App]:
    a = App(mysql_database)
    a.admin.migrate()
    yield a
    a.close()


def _transaction(url: str) -> pymysql.connections.Connection[Any]:
    conn = mysql_connect(url)
    conn.autocommit(False)
    with conn.cursor() as cur:
        cur.execute("SELECT @@tx_isolation")
        assert cur.fetchone() == ("REPEATABLE-READ",)
    return conn


def _without_waiting(call: Callable[[], object]) -> object:
    """``call``'s result; fails if it waits for a lock (it would wait for the lock wait timeout)."""
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive(), "it waited for another transaction's lock"
    return outcome[0]


def test_sends_with_different_new_keys_do_not_wait_for_each_other(app: App, mysql_database: str) -> None:
    # Before, the first send's locking read of its missing key took a gap lock: the second waited for
    # the first to commit, and a second send in the first then deadlocked with it.
    app.send("t", {}, idempotency_key="m")  # a key held already, whose gap the new keys fall in
    first, second = _transaction(mysql_database), _transaction(mysql_database)
    try:
        app.send("t", {}, conn=first, idempotency_key="a1")
        _without_waiting(lambda: app.send("t", {}, conn=second, idempotency_key="a2"))
        app.send("t", {}, conn=first, idempotency_key="a3")
        first.commit()
        second.commit()
    finally:
        first.close()
        second.close()
    assert [q.pending for q in app.admin.queues()] == [4]
    assert app.send("t", {}, idempotency_key="a2").id == app.send("t", {}, idempotency_key="a2").id


def test_processed_key_claims_of_different_keys_do_not_wait_for_each_other(app: App, mysql_database: str) -> None:
    now = datetime.now(UTC)

    def claim(key: str, conn: pymysql.connections.Connection[Any]) -> bool:
        return app.backend.processed_keys_claim(ProcessedKeyClaimParams(key, now + timedelta(hours=1), now, conn))

    first, second = _transaction(mysql_database), _transaction(mysql_database)
    try:
        assert claim("effect-1", first)
        assert _without_waiting(lambda: claim("effect-2", second)) is True
        assert claim("effect-3", first)
        first.commit()
        second.commit()
    finally:
        first.close()
        second.close()
    with mysql_connect(mysql_database) as conn:
        assert not claim("effect-2", conn)
