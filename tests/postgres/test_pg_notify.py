"""NOTIFY wakes idle listeners at once, and a listener survives its server going away."""

from __future__ import annotations

import threading
import time

import psycopg
from _pg import acquire, complete, insert, make_job
from tests.conftest import terminate_other_sessions

from conveyor.backends.postgres import PostgresBackend


def test_an_insert_from_another_connection_wakes_a_waiting_listener_promptly(
    pg: PostgresBackend, postgres_database: str
) -> None:
    producer = PostgresBackend(postgres_database)
    listener = pg.listen(["emails"])
    try:
        latencies = []
        for _ in range(5):
            sent_at: list[float] = []

            def send(sent_at: list[float] = sent_at) -> None:
                time.sleep(0.05)
                sent_at.append(time.perf_counter())
                insert(producer, make_job("emails"))

            thread = threading.Thread(target=send)
            thread.start()
            assert listener.wait(10) is True
            woke = time.perf_counter()
            thread.join()
            latencies.append(woke - sent_at[0])
        latencies.sort()
        print(f"NOTIFY pickup latency (send call start to wake): median {latencies[2] * 1000:.1f} ms")
        # Pickup must not depend on a polling interval; generous bound for a loaded CI machine.
        assert latencies[2] < 0.5
    finally:
        listener.close()
        producer.close()


def test_a_listener_ignores_other_queues_and_one_statement_notifies_once(pg: PostgresBackend) -> None:
    listener = pg.listen(["a"])
    try:
        insert(pg, make_job("b"))
        assert listener.wait(0.3) is False
        insert(pg, *[make_job("a") for _ in range(50)], make_job("b"))
        assert listener.wait(5) is True
        # Fifty jobs in one statement are one notification: nothing is left to wake on.
        assert listener.wait(0.2) is False
    finally:
        listener.close()


def test_ending_a_job_with_an_ordering_key_wakes_its_queue(pg: PostgresBackend) -> None:
    # The next job of the key becomes ready when the one before it ends, and no insert tells the
    # idle workers: the finish does (on both ways of running it), and only for keyed jobs.
    insert(pg, make_job("k", ordering_key="user-1"), make_job("k", ordering_key="user-1"), make_job("k"))
    listener = pg.listen(["k"])
    try:
        first, plain = acquire(pg, "k", limit=10)  # the second keyed job waits for the first
        assert first.ordering_key == "user-1" and plain.ordering_key is None
        assert listener.wait(0.2) is False
        assert complete(pg, plain) == 1
        assert listener.wait(0.3) is False
        assert complete(pg, first) == 1
        assert listener.wait(5) is True
        assert [d.ordering_key for d in acquire(pg, "k")] == ["user-1"]
    finally:
        listener.close()


def test_a_listener_survives_the_server_dropping_its_connection(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    listener = pg.listen(["q"])
    try:
        assert terminate_other_sessions(admin) >= 1
        # The wait that notices the loss returns instead of raising...
        started = time.monotonic()
        assert listener.wait(2) is False
        assert time.monotonic() - started < 3
        # ...the next one reconnects and reports a (possibly spurious) wake-up, since
        # notifications sent meanwhile were lost...
        assert listener.wait(2) is True
        # ...and notifications flow again.
        insert(pg, make_job("q"))
        assert listener.wait(5) is True
    finally:
        listener.close()


def test_a_closed_listener_returns_at_once(pg: PostgresBackend) -> None:
    listener = pg.listen(["q"])
    listener.close()
    started = time.monotonic()
    assert listener.wait(5) is False
    assert time.monotonic() - started < 1
