"""Connection failures surface as BackendUnavailable, other failures as BackendError, and the
backend recovers by itself once the server is back."""

from __future__ import annotations

import errno
import socket
import threading
import time

import psycopg
import pytest
from _pg import acquire, insert, make_job
from tests.conftest import terminate_other_sessions

from conveyor._errors import BackendError, BackendUnavailable
from conveyor.backends import open_backend
from conveyor.backends.base import JobsAcquireParams, QueuesStatsParams
from conveyor.backends.postgres import PostgresBackend


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_a_session_waiting_on_a_lock(admin: psycopg.Connection[tuple[object, ...]]) -> None:
    """Wait until the acquire is blocked on the table lock (a fixed sleep loses the race on a
    loaded machine: the session killed before its statement starts is replaced by the pool)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
        if row is not None and int(str(row[0])) > 0:
            return
        time.sleep(0.02)
    raise AssertionError("the acquire never blocked on the table lock")


def test_a_server_that_is_not_there_raises_backend_unavailable_quickly() -> None:
    started = time.monotonic()
    backend = PostgresBackend(f"postgresql://postgres@127.0.0.1:{_closed_port()}/nope", connect_timeout=1.0)
    try:
        assert time.monotonic() - started < 1  # opening never blocks on the server
        with pytest.raises(BackendUnavailable):
            backend.jobs_acquire(JobsAcquireParams("q", 10, 30.0, "w", make_job().run_at))
        with pytest.raises(BackendUnavailable):
            backend.migrate()
        listener = backend.listen(["q"])  # does not raise either; it just cannot wake
        assert listener.wait(0.1) is False
        listener.close()
    finally:
        backend.close()
    assert time.monotonic() - started < 10


def test_a_listener_that_finds_no_file_descriptor_left_waits_it_out(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A handler that leaked sockets or files until EMFILE: psycopg's connect raises a bare OSError
    # (the selector it waits with). Before, wait() raised it: the worker's fetcher ended with a traceback,
    # and the worker with it, while its pools waited the same EMFILE out as an unreachable server.
    backend = PostgresBackend(postgres_database)
    try:
        listener = backend.listen(["q"])
        connect = psycopg.connect

        def out_of_descriptors(*args: object, **kwargs: object) -> object:
            raise OSError(errno.EMFILE, "Too many open files")

        with psycopg.connect(postgres_database, autocommit=True) as admin:
            assert terminate_other_sessions(admin) > 0
        monkeypatch.setattr(psycopg, "connect", out_of_descriptors)
        assert listener.wait(0.1) is False  # its session is gone
        assert listener.wait(0.1) is False  # no descriptor left to reconnect with
        monkeypatch.setattr(psycopg, "connect", connect)
        assert listener.wait(1.0) is True  # the descriptors are back: it reconnects
        listener.close()
    finally:
        backend.close()


def test_open_backend_builds_a_postgres_backend(postgres_database: str) -> None:
    backend = open_backend(postgres_database)
    try:
        assert backend.engine == "postgres" and backend.notifies is True
    finally:
        backend.close()


def test_other_database_errors_raise_backend_error(pg: PostgresBackend) -> None:
    with pytest.raises(BackendError) as caught:
        insert(pg, make_job(payload="not json"))
    assert not isinstance(caught.value, BackendUnavailable)


def test_the_pool_replaces_connections_killed_by_a_restart(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    insert(pg, make_job())
    assert terminate_other_sessions(admin) >= 1
    # A pooled connection whose server session ended has a readable socket (the server's
    # FATAL message), so it is checked and replaced before use: the next call just works.
    assert pg.queues_stats(QueuesStatsParams(now=make_job().run_at))[0].pending == 1
    # So does one idle for a while.
    terminate_other_sessions(admin)
    time.sleep(1.2)
    assert len(acquire(pg)) == 1


def test_a_session_killed_mid_call_fails_as_unavailable_then_recovers(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]], postgres_database: str
) -> None:
    insert(pg, make_job())
    outcome: list[BaseException | int] = []
    locker = psycopg.connect(postgres_database)
    try:
        # Hold the jobs table so that the acquire below is mid-statement when its session dies.
        locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")

        def blocked_acquire() -> None:
            try:
                outcome.append(len(acquire(pg)))
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=blocked_acquire)
        thread.start()
        _wait_for_a_session_waiting_on_a_lock(admin)
        terminate_other_sessions(admin)
        thread.join(timeout=30)
    finally:
        locker.close()  # killed too; closing it must not try to roll back
    assert len(outcome) == 1 and isinstance(outcome[0], BackendUnavailable), outcome
    assert len(acquire(pg)) == 1


def test_a_connection_is_back_in_its_pool_when_the_call_returns(pg: PostgresBackend) -> None:
    # Returned inline, not through the pool's worker thread: no thread wakes per statement, and the
    # next caller finds it (the hand-off made a sequential producer open 4-6 connections). Its last
    # use is stamped on the way back, so a connection busy within the last second is not checked
    # with an extra round trip.
    for _ in range(50):
        before = time.monotonic()
        insert(pg, make_job())
        for pool in (pg._pool, pg._acks):
            stats = pool.get_stats()
            assert stats["pool_available"] == stats["pool_size"], stats
        assert max(pg._last_used.values()) >= before
    assert pg._pool.get_stats()["pool_size"] <= 2
