"""A batch sent on the caller's own connection is all or nothing, whatever row fails."""

from __future__ import annotations

import math

import psycopg
import pytest
from tests.conftest import driver_connection

from conveyor import App, Message, PayloadError


@pytest.mark.parametrize("autocommit", [False, True], ids=["transaction", "autocommit"])
def test_a_bad_row_leaves_no_idempotency_key_claimed(database_url: str, autocommit: bool) -> None:
    # Found by a hostile sweep: on SQLite the keys of the rows ahead of a bad one were claimed as
    # the rows were built, so after the caller's commit (or at once in autocommit mode) the key
    # answered a job that was never stored, for the whole dedup window: the order was lost.
    app = App(database_url, migrate=True)
    try:
        app.send("warm-up", {})  # migrated before the caller's connection opens
        with driver_connection(database_url, autocommit) as conn:
            with pytest.raises(PayloadError, match="not JSON-serialisable"):
                app.send_many(
                    [
                        Message("t", {"o": 7}, idempotency_key="order-7"),
                        Message("t", {"o": 8}, idempotency_key="order-8"),
                        Message("t", {"x": math.nan}),
                    ],
                    conn=conn,
                )
            if not autocommit:
                if isinstance(conn, psycopg.Connection):
                    conn.rollback()  # PostgreSQL: nothing was sent, the transaction is still good
                else:
                    conn.commit()  # SQLite, MySQL: the caller's other work commits; none of the batch
        job = app.send("t", {"o": 7}, idempotency_key="order-7")
        assert job.status().state == "pending"
        assert app.send("t", {"o": 8}, idempotency_key="order-8").status().state == "pending"
    finally:
        app.close()


def test_the_callers_earlier_writes_survive_a_refused_batch(sqlite_url: str) -> None:
    # The batch's writes are rolled back to a savepoint: what the caller wrote before it stays in
    # the caller's transaction, and commits with it.
    app = App(sqlite_url, migrate=True)
    try:
        app.send("warm-up", {})
        with driver_connection(sqlite_url, autocommit=False) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER)")
            conn.execute("INSERT INTO orders VALUES (1)")
            kept = app.send("t", {"o": 1}, conn=conn)
            with pytest.raises(PayloadError):
                app.send_many([Message("t", {"o": 2}, idempotency_key="k2"), Message("t", {"x": math.inf})], conn=conn)
            conn.commit()
            assert conn.execute("SELECT id FROM orders").fetchall() == [(1,)]
        assert kept.status().state == "pending"
        assert app.send("t", {"o": 2}, idempotency_key="k2").status().state == "pending"
        assert sum(s.pending for s in app.admin.queues()) == 3  # warm-up, kept, k2 (sent after)
    finally:
        app.close()
