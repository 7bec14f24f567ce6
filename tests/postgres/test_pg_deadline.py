"""A server that stops answering without closing its connections (its host gone in a failover, a network
or a proxy that drops every byte: the proxy's ``swallowing`` and ``strand()``) is a lost server after
``statement_deadline``: calls raise BackendUnavailable saying so, a worker goes on once the server answers
again, and a listener reconnects.

Before the deadline each of them waited on its socket for as long as it stayed open (two hours of TCP
keepalive on a real network; for ever through the proxy here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

import psycopg
import pytest
from tests.chaos._lapse import through_proxy, worker_goes_on_after_a_lapse

from conveyor import App
from conveyor._errors import BackendUnavailable
from conveyor.backends.postgres import PostgresBackend, _listener
from conveyor.worker import Worker

DEADLINE = 2.0


def test_a_worker_goes_on_after_its_server_stopped_answering(postgres_database: str) -> None:
    # Before: the worker's acquire waited for an answer for ever, and the last five jobs never ran.
    done = worker_goes_on_after_a_lapse(postgres_database, partial(PostgresBackend, statement_deadline=DEADLINE), 3.0)
    assert sorted(set(done)) == list(range(10))


def test_a_call_with_no_answer_raises_backend_unavailable_after_the_deadline(postgres_database: str) -> None:
    with App(postgres_database, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    with through_proxy(postgres_database, 5432) as (proxy, url):
        backend = PostgresBackend(url, statement_deadline=DEADLINE)
        with App(url, backend=backend) as app:
            assert app.admin.queues() == []
            proxy.swallowing = True
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match=r"no answer to \w+ within 2s \(statement_deadline\)"):
                app.admin.queues()
            assert DEADLINE - 0.1 < time.monotonic() - started < DEADLINE + 5
            proxy.swallowing = False
            assert app.admin.queues() == []  # the cut connection was dropped; the next call is answered


def test_no_deadline_waits_as_long_as_the_statement_takes(postgres_database: str) -> None:
    """A deadline cuts only what is past it: a statement slower than nothing but quicker than the deadline
    is answered, and ``statement_deadline=None`` keeps none."""
    backend = PostgresBackend(postgres_database, statement_deadline=None)
    try:
        assert backend.statement_deadline is None
        with backend._connection("sleep") as conn:
            assert conn.execute("SELECT pg_sleep(1.2), 1").fetchone() == ("", 1)
    finally:
        backend.close()
    backend = PostgresBackend(postgres_database, statement_deadline=DEADLINE)
    try:
        with backend._connection("sleep") as conn:
            assert conn.execute("SELECT pg_sleep(1.2), 1").fetchone() == ("", 1)
        with pytest.raises(BackendUnavailable, match="no answer to sleep within 2s"), backend._connection("sleep") as c:
            c.execute("SELECT pg_sleep(30)")
    finally:
        backend.close()


def test_a_listener_whose_server_stopped_answering_reconnects(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_listener, "CHECK_AFTER", 0.0)  # every wait asks first
    with App(postgres_database, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    with through_proxy(postgres_database, 5432) as (proxy, url), App(postgres_database) as producer:
        send = producer.task(queue="q", name="t")(lambda: None)
        backend = PostgresBackend(url, statement_deadline=DEADLINE)
        listener = backend.listen(["q"])
        try:
            send.delay()
            assert _woken(listener)
            assert proxy.strand() >= 1  # the listener's connection (and the pools'): their server gone without a word
            send.delay()  # its notification is lost
            started = time.monotonic()
            assert not listener.wait(0.5)  # the check finds no answer: cut
            assert DEADLINE - 0.1 < time.monotonic() - started < DEADLINE + 5
            assert listener.wait(0.5)  # reconnected: told to look (notifications may have been missed)
            send.delay()
            # Before: the stranded connection never delivered a notification again.
            assert _woken(listener)
        finally:
            listener.close()
            backend.close()


def _woken(listener: _listener.PostgresListener) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if listener.wait(0.5):
            return True
    return False


def test_a_statement_cut_at_its_deadline_does_not_go_on_on_the_server(postgres_database: str) -> None:
    """The server gives up a statement whose connection the deadline cut: one waiting on a lock held longer
    than the deadline no longer waits on, to run once the lock is let go with no one to read its answer (a
    worker's acquire so orphaned leased jobs to no one: they ran again only once their leases ran out)."""
    with App(postgres_database, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    backend = PostgresBackend(postgres_database, statement_deadline=1)
    try:
        with psycopg.connect(postgres_database) as locker:
            locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            cut = pytest.raises(BackendUnavailable, match="no answer to count within 1s")
            with cut, backend._connection("count") as c:
                c.execute("SELECT count(*) FROM jobs")
            waiting = None
            until = time.monotonic() + 5
            while waiting != 0 and time.monotonic() < until:
                time.sleep(0.2)
                # Before: the cut statement waited on the lock for as long as it was held.
                (waiting,) = locker.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone() or (None,)
            assert waiting == 0
    finally:
        backend.close()


def test_a_worker_whose_statements_waited_on_a_lock_past_the_deadline_goes_on_at_once(postgres_database: str) -> None:
    """The jobs table locked for longer than the deadline (a DDL, a VACUUM FULL) while a worker drains a
    queue: its statements are cut and retried, and once the lock is let go the rest run at once. Before, each
    cut acquire went on on the server, leased jobs to no one once the lock went, and they waited for their
    leases to run out (30 s)."""
    with App(postgres_database, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    done: list[int] = []
    app = App(postgres_database, backend=PostgresBackend(postgres_database, statement_deadline=1))

    @app.task(queue="q", name="t")
    def t(i: int) -> None:
        time.sleep(0.1)
        done.append(i)

    worker = Worker(app, queues=["q"], concurrency=2, poll_interval=0.2, heartbeat_interval=0.5)
    runner = threading.Thread(target=worker.run_sync, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        with App(postgres_database) as producer, psycopg.connect(postgres_database) as locker:
            send = producer.task(queue="q", name="t")(lambda i: None)
            for i in range(40):
                send.delay(i=i)
            _until(lambda: len(done) >= 3)
            locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            time.sleep(4)  # the worker's acquires, finishes and heartbeats wait on the lock, and are cut
            locker.rollback()
            started = time.monotonic()
            _until(lambda: len(set(done)) >= 40, timeout=90)
            assert time.monotonic() - started < 15
    finally:
        worker.stop()
        runner.join(timeout=30)
        app.close()
    assert sorted(set(done)) == list(range(40))


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)
