"""A MySQL server that stops answering without closing its connections is a lost server after
``statement_deadline`` (see tests/postgres/test_pg_deadline.py): a call raises BackendUnavailable saying
so, and a worker goes on once the server answers again. Before, each waited on its socket for ever."""

from __future__ import annotations

import time
from functools import partial

import pytest
from tests.chaos._lapse import through_proxy, worker_goes_on_after_a_lapse

from conveyor import App
from conveyor._errors import BackendUnavailable
from conveyor.backends import _deadline
from conveyor.backends.mysql import MysqlBackend, _connection
from conveyor.backends.mysql._connection import Cursor

DEADLINE = 2.0


def test_a_call_with_no_answer_raises_backend_unavailable_after_the_deadline(mysql_database: str) -> None:
    with App(mysql_database, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    with (
        through_proxy(mysql_database, 3306) as (proxy, url),
        App(url, backend=MysqlBackend(url, statement_deadline=DEADLINE)) as app,
    ):
        assert app.admin.queues() == []
        proxy.strand()  # the pool's idle connection: its server gone without a word
        proxy.swallowing = True  # and no new connection answers either, for now
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match=r"no answer to \w+ within 2s \(statement_deadline\)"):
            app.admin.queues()
        assert DEADLINE - 0.1 < time.monotonic() - started < DEADLINE + 15
        proxy.swallowing = False
        assert app.admin.queues() == []  # the cut connection was dropped; a new one is answered


def test_a_worker_goes_on_after_its_server_stopped_answering(mysql_database: str) -> None:
    # Before (statement_deadline=None): the last five jobs never ran.
    done = worker_goes_on_after_a_lapse(mysql_database, partial(MysqlBackend, statement_deadline=DEADLINE), 3.0)
    assert sorted(set(done)) == list(range(10))


def test_a_connection_cut_as_its_call_ended_is_not_given_back(mysql_database: str) -> None:
    """The watch thread may cut a connection just after the server's last answer came, before the call
    stopped watching it: the call has its answer, but its connection is dead and must not be handed to the
    next call (given back less than a second ago, it would not even be pinged)."""
    backend = MysqlBackend(mysql_database, statement_deadline=1)
    try:

        def work(cur: Cursor) -> int:
            conn = cur.connection
            commit = conn.commit
            (watch,) = [w for w in _deadline._watcher._watched if w.fd == conn._sock.fileno()]

            def commit_then_cut() -> None:
                commit()  # answered in time; the deadline comes before the call stops watching
                while not watch.fired:
                    time.sleep(0.05)

            conn.commit = commit_then_cut  # type: ignore[method-assign]
            cur.execute("SELECT 1 AS one")
            return int(cur.fetchone()["one"])

        assert backend._pool.read("first", work) == 1
        # Before: the cut connection went back to the pool and this unrelated call failed on it.
        assert backend._pool.read("second", lambda cur: cur.execute("SELECT 2")) == 1
    finally:
        backend.close()


def test_a_ping_cut_as_it_was_answered_is_no_answer(mysql_database: str) -> None:
    """The idle check's ping likewise: answered, then cut before it stopped watching, its connection is dead."""
    backend = MysqlBackend(mysql_database, statement_deadline=1)
    try:
        conn = backend._pool.open()
        ping = conn.ping

        def ping_then_cut(reconnect: bool = True) -> None:
            ping(reconnect=reconnect)
            (watch,) = [w for w in _deadline._watcher._watched if w.fd == conn._sock.fileno()]
            while not watch.fired:
                time.sleep(0.05)

        conn.ping = ping_then_cut  # type: ignore[method-assign]
        # Before: True, and the pool handed the dead connection to the call that asked for one.
        assert _connection._answers(conn, 1) is False
        conn.close()
    finally:
        backend.close()
