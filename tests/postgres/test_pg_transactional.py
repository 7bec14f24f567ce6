"""Enqueueing on the caller's own psycopg connection: the caller's commit or rollback decides."""

from __future__ import annotations

import psycopg
from _pg import T0, acquire, live_ids, make_job

from conveyor.backends.base import JobsInsertParams
from conveyor.backends.postgres import PostgresBackend


def _send(pg: PostgresBackend, conn: psycopg.Connection[tuple[object, ...]], queue: str) -> None:
    job = make_job(queue)
    assert pg.jobs_insert_many(JobsInsertParams(jobs=[job], now=T0, conn=conn)) == [job.id]


def test_rollback_leaves_no_job_and_no_notification(pg: PostgresBackend, postgres_database: str) -> None:
    listener = pg.listen(["outbox"])
    try:
        with psycopg.connect(postgres_database) as conn:
            conn.execute("CREATE TABLE orders (id int)")
            conn.execute("INSERT INTO orders VALUES (1)")
            _send(pg, conn, "outbox")
            conn.rollback()
        assert live_ids(pg, "outbox") == []
        # NOTIFY is transactional too: a rolled-back enqueue wakes nobody.
        assert listener.wait(0.3) is False
    finally:
        listener.close()


def test_commit_leaves_one_job_visible_only_after_commit(pg: PostgresBackend, postgres_database: str) -> None:
    listener = pg.listen(["outbox"])
    try:
        with psycopg.connect(postgres_database) as conn:
            _send(pg, conn, "outbox")
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # not committed by us
            assert live_ids(pg, "outbox") == []
            assert listener.wait(0.2) is False
            conn.commit()
        assert listener.wait(5) is True
        assert len(acquire(pg, "outbox")) == 1
    finally:
        listener.close()


def test_the_business_write_and_the_job_commit_together(pg: PostgresBackend, postgres_database: str) -> None:
    with psycopg.connect(postgres_database) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (7)")
            _send(pg, conn, "outbox")
        row = conn.execute("SELECT count(*) FROM orders").fetchone()
        assert row == (1,)
    assert len(live_ids(pg, "outbox")) == 1
