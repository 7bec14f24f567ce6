"""The relay run as users run it, ``conveyor worker APP --queues outbox``, in real processes on PostgreSQL: a burst
arrives complete; a relay SIGKILLed mid-burst and restarted loses nothing (duplicates counted, same message_id);
SIGTERM stops it at once and cleanly, its broker connection closed."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest
from tests.e2e._support import Proc, Procs, conveyor_argv, wait_until

from conveyor import App, Message
from conveyor.backends.base import QueuesStatsParams
from conveyor.relay import TASK_NAME, Relay

from .conftest import Broker

APP_PATH = "tests.relay.relay_app:app"


@pytest.fixture
def producer(postgres_database: str, broker: Broker) -> Iterator[tuple[App, Relay]]:
    app = App(postgres_database, migrate=True)
    try:
        yield app, Relay(app, broker.url, exchange=broker.exchange)
    finally:
        app.close()


def _enqueue(app: App, broker: Broker, n: int) -> set[str]:
    """``n`` relay jobs in one round trip (what ``Relay.publish`` enqueues, batched); their message ids."""
    messages = [
        Message(task=TASK_NAME, queue="outbox", payload={"routing_key": broker.key, "body": {"n": i}}) for i in range(n)
    ]
    return {str(job.id) for job in app.send_many(messages)}


def _relay_worker(procs: Procs, db: str, broker: Broker, *args: str, env: dict[str, str] | None = None) -> Proc:
    argv = conveyor_argv(db, "-v", "worker", APP_PATH, "--queues", "outbox", "--visibility-timeout", "2", *args)
    return procs.start(
        "relay", argv, env={"RELAY_AMQP_URL": broker.url, "RELAY_EXCHANGE": broker.exchange, **(env or {})}
    )


def _all_arrived(broker: Broker, ids: set[str]) -> int:
    """Drain the broker's queue: every message of ``ids`` must be there (at least once); how many came twice."""
    got = broker.drain()
    counts = broker.ids()
    assert set(counts) == ids, f"lost: {len(ids - set(counts))}"
    duplicates = sum(c - 1 for c in counts.values())
    assert len(got) == len(ids) + duplicates
    return duplicates


def _live(app: App) -> int:
    stats = app.backend.queues_stats(QueuesStatsParams(app.clock.now()))
    return sum(s.pending + s.scheduled + s.processing for s in stats)


@pytest.mark.timeout(120)
def test_a_burst_of_500_arrives_complete(
    postgres_database: str, producer: tuple[App, Relay], broker: Broker, procs: Procs
) -> None:
    app, _ = producer
    ids = _enqueue(app, broker, 500)
    started = time.monotonic()
    worker = _relay_worker(procs, postgres_database, broker, "--burst", "--concurrency", "10")
    assert worker.wait(90) == 0, worker.output()
    seconds = time.monotonic() - started
    got = broker.drain()
    assert {r.message_id for r in got} == ids
    assert len(got) == 500  # no duplicate without a crash
    assert sorted(json.loads(r.body)["n"] for r in got) == list(range(500))
    assert _live(app) == 0
    print(f"500 messages relayed in {seconds:.2f}s by one process with 10 slots (start-up included)")


@pytest.mark.timeout(180)
def test_a_relay_killed_mid_burst_and_restarted_loses_nothing(
    postgres_database: str, producer: tuple[App, Relay], broker: Broker, procs: Procs
) -> None:
    app, _ = producer
    total = 3000
    ids = _enqueue(app, broker, total)
    first = _relay_worker(procs, postgres_database, broker, "--concurrency", "10")
    wait_until(lambda: broker.depth() >= 300, 60, "300 messages at the broker", interval=0.02)
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    at_kill = broker.depth()
    assert at_kill < total, "the kill came after the burst: it proves nothing"
    # The restarted relay rescues the leases the killed one held (2 s) and publishes the rest.
    second = _relay_worker(procs, postgres_database, broker, "--burst", "--concurrency", "10")
    assert second.wait(120) == 0, second.output()
    duplicates = _all_arrived(broker, ids)
    assert _live(app) == 0
    print(f"killed at {at_kill}/{total} published; after the restart every message arrived, {duplicates} twice")


@pytest.mark.timeout(60)
def test_sigterm_stops_the_relay_promptly_and_without_noise(
    postgres_database: str, producer: tuple[App, Relay], broker: Broker, procs: Procs
) -> None:
    """The worker has no stop hook for handlers: the relay closes its connection when the event loop shuts
    down. In development mode (ResourceWarnings shown, asyncio's debug checks) the stop leaves no warning, no
    "Task was destroyed", no "Event loop is closed"."""
    _, relay = producer
    ids = {str(relay.publish(broker.key, {"n": n}).id) for n in range(20)}
    worker = _relay_worker(procs, postgres_database, broker, env={"PYTHONDEVMODE": "1"})
    wait_until(lambda: broker.depth() >= 20, 30, "20 messages at the broker")
    worker.signal(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(15) == 0, worker.output()
    assert time.monotonic() - started < 10
    output = worker.output()
    for noise in ("Warning", "Task was destroyed", "Event loop is closed", "Traceback", "Unclosed", "ERROR"):
        assert noise not in output, output
    assert {r.message_id for r in broker.drain()} == ids
