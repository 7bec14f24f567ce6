"""Enqueueing on the caller's own psycopg connection: the caller's commit or rollback decides."""

from __future__ import annotations

import psycopg
import pytest
from _pg import T0, acquire, live_ids, make_job

from conveyor._errors import BackendError, BackendUnavailable
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


def test_a_send_on_a_failed_transaction_is_one_clear_error_and_no_noise(
    pg: PostgresBackend, postgres_database: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A caller's transaction that already failed: every send fails, and a batch big enough for the COPY also left
    psycopg's "error ignored in rollback ... savepoint does not exist" on stderr beside the error (a helper's sweep).
    Now one BackendError says what to do, whatever the batch's size."""
    for n in (1, 200):
        with psycopg.connect(postgres_database) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1 / 0")
            jobs = [make_job("outbox") for _ in range(n)]
            with pytest.raises(BackendError, match=r"has failed .* roll it back") as caught:
                pg.jobs_insert_many(JobsInsertParams(jobs=jobs, now=T0, conn=conn))
            assert not isinstance(caught.value, BackendUnavailable)  # not waited out as an outage
            conn.rollback()
            pg.jobs_insert_many(JobsInsertParams(jobs=jobs, now=T0, conn=conn))  # the next transaction works
            conn.commit()
        assert len(live_ids(pg, "outbox")) == n
        with pg._connection("test") as c:
            c.execute("DELETE FROM jobs")
    err = capfd.readouterr().err
    assert "error ignored" not in err, err
