"""Statements longer than the server's ``max_allowed_packet``: refused as statements (BackendError), so
that a producer is told so and a worker splits its batch, rather than read as a server gone away."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from tests.conftest import mysql_connect

from conveyor import App, BackendError, BackendUnavailable, Message, Worker
from conveyor._errors import PayloadTooLarge


@pytest.fixture
def app(mysql_database: str) -> Iterator[App]:
    a = App(mysql_database, migrate=True, max_payload_bytes=2**30)
    yield a
    a.close()


def _max_packet(url: str) -> int:
    with mysql_connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@max_allowed_packet")
        return int(cur.fetchone()[0])


def test_a_payload_past_max_allowed_packet_is_refused_not_unavailable(app: App, mysql_database: str) -> None:
    # Twice the limit: just past it, the server answers error 1153; further past, it resets the connection.
    too_large = "x" * (2 * _max_packet(mysql_database))
    with pytest.raises(BackendError, match="max_allowed_packet") as raised:
        app.send("t", {"blob": too_large})
    assert not isinstance(raised.value, BackendUnavailable)
    assert app.admin.queues() == []
    app.send("t", {"blob": "small"})  # the pool's connection was kept and still works
    assert [q.pending for q in app.admin.queues()] == [1]


def test_a_job_too_large_for_the_server_is_refused_naming_its_field_and_place(app: App, mysql_database: str) -> None:
    # Just past the limit, one job of three. Before, the refusal named a statement ("a value is too large for
    # this server"), and was no PayloadError: the HTTP API answered 503 with Retry-After to a request that
    # no retry can get past.
    too_large = "x" * _max_packet(mysql_database)
    batch = [Message(task="t", payload={"n": 1}), Message(task="t", payload={"blob": too_large}), Message(task="t")]
    with pytest.raises(PayloadTooLarge, match=r"^payload is [0-9,]+ bytes of JSON \(job 1 of the batch\)") as raised:
        app.send_many(batch)
    assert isinstance(raised.value, BackendError) and not isinstance(raised.value, BackendUnavailable)
    assert "max_allowed_packet" in str(raised.value)
    with pytest.raises(PayloadTooLarge, match=r"^headers is "):
        app.send("t", {}, headers={"blob": too_large})
    assert app.admin.queues() == []


def test_a_callers_connection_is_checked_against_its_own_server(app: App, mysql_database: str) -> None:
    too_large = "x" * (2 * _max_packet(mysql_database))
    with mysql_connect(mysql_database) as conn:
        conn.autocommit(False)
        with pytest.raises(BackendError, match="max_allowed_packet"):
            app.send("t", {"blob": too_large}, conn=conn)
        app.send("t", {"blob": "small"}, conn=conn)  # the transaction goes on
        conn.commit()
    assert [q.pending for q in app.admin.queues()] == [1]


def test_a_finish_batch_past_max_allowed_packet_is_split_and_written(app: App, mysql_database: str) -> None:
    # Each result is under the 1 MiB result limit; together they are past the server's packet limit,
    # and the worker's completer writes them in one batch. Before, the server closed the connection on
    # the statement, the worker took it for an outage and retried the same batch for ever.
    result = "r" * (1024 * 1024 - 64)
    count = 2 * _max_packet(mysql_database) // len(result)

    @app.task(queue="big")
    def big() -> str:
        return result

    app.send_many([Message(task=big.name, queue="big") for _ in range(count)])
    worker = Worker(app, burst=False, concurrency=count, poll_interval=0.02)

    async def run() -> None:
        task = asyncio.create_task(worker.run())
        try:
            for _ in range(1500):
                if worker.counters.completed == count:
                    return
                await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(run())
    [stats] = app.admin.queues()
    assert (stats.completed, stats.pending, stats.processing) == (count, 0, 0)
    assert worker.counters.completed == count


def test_a_batch_of_small_jobs_fits_a_server_whose_packet_is_smaller_than_pymysqls_fold(
    app: App, mysql_database: str
) -> None:
    # PyMySQL folds an INSERT's rows into statements of up to 1,024,000 bytes. Under a server whose
    # max_allowed_packet is smaller (256 KiB here: MySQL's minimum is 1 KiB, and 1 MiB was its default before
    # 5.6.6), 20 jobs of 20 kB each made one 400 kB statement, refused as "a value is too large for this
    # server", though each job fits. The limit is the one the connection read from its server: set here for
    # the caller's connection, so that the shared server's global setting is left alone.
    from conveyor.backends.mysql._connection import _PACKET_LIMITS

    with mysql_connect(mysql_database) as conn:
        conn.autocommit(False)
        _PACKET_LIMITS[conn] = 256 * 1024
        jobs = app.send_many([Message(task="t", payload={"blob": "x" * 20_000}) for _ in range(20)], conn=conn)
        conn.commit()
    assert len(jobs) == 20
    assert [q.pending for q in app.admin.queues()] == [20]
