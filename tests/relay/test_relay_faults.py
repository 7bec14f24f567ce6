"""The relay through broker faults, in real processes on PostgreSQL: a broker node restarted mid-burst (its own
throwaway node from scripts/ensure_rabbitmq.py, stopped and started again on its ports and data) costs no attempt
beyond the publishes it cut; a SIGTERM while the network swallows every confirm stops the worker within its
graceful timeout, and a new worker publishes what the first could not."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from tests.chaos._proxy import TcpProxy
from tests.e2e._support import Procs, wait_until

from conveyor import App

from .conftest import Broker
from .test_relay_worker import _all_arrived, _enqueue, _live, _relay_worker

ENSURE = Path(__file__).resolve().parents[2] / "scripts" / "ensure_rabbitmq.py"


def _ensure(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ENSURE), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[str, str]]:
    """A broker node of this module's own (URL, directory), which its tests may stop and start again."""
    url, directory = _ensure("--throwaway").split()
    try:
        yield url, directory
    finally:
        _ensure("stop", directory)


def _broker(url: str) -> Broker:
    tag = uuid.uuid4().hex[:12]
    broker = Broker(url, f"conveyor-test-ex-{tag}", f"conveyor-test-q-{tag}", f"key-{tag}")
    broker.declare()
    return broker


def _archived(postgres_database: str) -> tuple[int, int, int]:
    """(jobs archived, dead among them, the most attempts any took)."""
    with psycopg.connect(postgres_database) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'dead'), coalesce(max(attempts), 0) FROM archive"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.timeout(240)
def test_a_broker_restarted_mid_burst_costs_no_attempt_beyond_the_publishes_it_cut(
    postgres_database: str, node: tuple[str, str], procs: Procs
) -> None:
    # Before: while the broker was down every attempt failed at once on its refused connection and the job
    # retried with its backoff (0.2 s here): a restart of ~10 s took jobs through attempt after attempt, and
    # to the dead-letter queue once they had used up their attempts.
    url, directory = node
    broker = _broker(url)
    total = 2000
    with App(postgres_database, migrate=True) as app:
        ids = _enqueue(app, broker, total)
        worker = _relay_worker(
            procs, postgres_database, broker, "--concurrency", "10", env={"RELAY_CONFIRM_TIMEOUT": "30"}
        )
        wait_until(lambda: broker.depth() >= 200, 60, "200 messages at the broker", interval=0.02)
        _ensure("stop", "--keep", directory)
        stopped = time.monotonic()
        _ensure("start", directory)
        outage = time.monotonic() - stopped
        wait_until(lambda: _live(app) == 0, 120, "every relay job finished")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
    duplicates = _all_arrived(broker, ids)
    archived, dead, most_attempts = _archived(postgres_database)
    assert (archived, dead) == (total, 0)
    # A publish in flight when the broker went away fails its attempt (its confirm cannot come); the next
    # attempt waits for the broker instead of failing on its refused connection.
    assert most_attempts <= 2, most_attempts
    print(f"broker down {outage:.1f}s mid-burst: all arrived, {duplicates} twice, at most {most_attempts} attempts")


def _through(proxy: TcpProxy, url: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@pytest.mark.timeout(180)
def test_a_sigterm_while_no_confirm_comes_stops_within_the_graceful_timeout_and_loses_nothing(
    postgres_database: str, node: tuple[str, str], procs: Procs
) -> None:
    url, _ = node
    broker = _broker(url)
    total = 500
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 5672
    with App(postgres_database, migrate=True) as app, TcpProxy(host, port) as proxy:
        ids = _enqueue(app, broker, total)
        proxied = Broker(_through(proxy, url), broker.exchange, broker.queue, broker.key)
        worker = _relay_worker(procs, postgres_database, proxied, "--concurrency", "10", "--graceful-timeout", "3")
        wait_until(lambda: broker.depth() >= 100, 60, "100 messages at the broker", interval=0.02)
        proxy.swallowing = True  # the connection stays open; no confirm comes back any more
        time.sleep(0.5)
        worker.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = worker.wait(30)
        stopped_after = time.monotonic() - signalled
        assert stopped_after < 10, worker.output()
        assert code in (0, 1), worker.output()
        assert "Traceback" not in worker.output()
        proxy.swallowing = False
        # A new worker straight to the broker: the jobs the first held come back (leases of 2 s) and go out.
        second = _relay_worker(procs, postgres_database, broker, "--concurrency", "10")
        wait_until(lambda: _live(app) == 0, 120, "every relay job finished")
        second.signal(signal.SIGTERM)
        assert second.wait(30) == 0, second.output()
    duplicates = _all_arrived(broker, ids)
    print(f"stopped {stopped_after:.1f}s after SIGTERM with confirms swallowed; {duplicates} published twice")
