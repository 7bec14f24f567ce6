"""NOTIFY wakes idle listeners at once, and a listener survives its server going away."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
from _pg import insert, make_job, terminate_other_sessions

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


# The worker's listener waits on its event loop (PostgresLoopListener, from LoopStatements.listen):
# the same promises, as coroutines.


def test_a_loop_listener_reports_its_first_connection_then_wakes_on_its_queues_only(pg: PostgresBackend) -> None:
    async def scenario() -> None:
        statements = pg.loop_statements()
        listener = statements.listen(["a"])
        try:
            # Connecting is a wake-up: jobs inserted before its LISTEN sent it no notification.
            assert await listener.wait(5) is True
            assert await listener.wait(0.2) is False
            await asyncio.to_thread(insert, pg, make_job("b"))
            assert await listener.wait(0.3) is False
            sent = time.perf_counter()
            await asyncio.to_thread(insert, pg, *[make_job("a") for _ in range(50)], make_job("b"))
            assert await listener.wait(5) is True
            assert time.perf_counter() - sent < 0.5  # woken, not timed out
            # Three statements' notifications arrived before the wait: one wake-up, then nothing.
            for _ in range(3):
                await asyncio.to_thread(insert, pg, make_job("a"))
            await asyncio.sleep(0.1)
            assert await listener.wait(5) is True
            assert await listener.wait(0.2) is False
        finally:
            statements.close()
        # Closed with its statements: a later wait is never woken, and yields to the loop meanwhile
        # (a fetcher waiting in a loop must not spin on it).
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(tick())
        await asyncio.to_thread(insert, pg, make_job("a"))
        assert await listener.wait(0.3) is False
        ticking.cancel()
        assert ticks >= 10

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_loop_listener_survives_the_server_dropping_its_connection(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    async def scenario() -> None:
        statements = pg.loop_statements()
        listener = statements.listen(["q"])
        try:
            assert await listener.wait(5) is True
            assert await asyncio.to_thread(terminate_other_sessions, admin) >= 1
            # The wait that notices the loss returns instead of raising...
            started = time.monotonic()
            assert await listener.wait(2) is False
            assert time.monotonic() - started < 3
            # ...the next one reconnects and reports a wake-up (notifications sent meanwhile were lost)...
            assert await listener.wait(2) is True
            # ...and notifications flow again.
            await asyncio.to_thread(insert, pg, make_job("q"))
            assert await listener.wait(5) is True
        finally:
            statements.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))

