"""A worker survives its database going away: PostgreSQL (a throwaway cluster of the test's own)
is stopped under a running worker and started again; the worker reconnects with backoff, does not
exit, and the run completes with nothing lost."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import TypeVar
from uuid import UUID

import pytest

from conveyor import App, BackendUnavailable, Message

from . import e2e_app
from ._pgcluster import PgCluster
from ._support import Db, Procs, wait_until, worker_argv

T = TypeVar("T")

BATCH = 150
OUTAGE = 3.0


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as c:
        yield c


def _retrying(fn: Callable[[], T], timeout: float = 30) -> T:
    """What a producer does while its database restarts: retry on BackendUnavailable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.timeout(180)
def test_worker_survives_postgres_restart(cluster: PgCluster, procs: Procs) -> None:
    url = cluster.url
    producer = App(url, migrate=True)
    e2e_app.register(producer)
    db = Db(url)
    sent: set[UUID] = set()

    def send(n0: int) -> None:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(n0, n0 + BATCH)]
        sent.update(j.id for j in _retrying(lambda: producer.send_many(messages)))

    try:
        send(0)
        send(BATCH)
        # 40 ms per job, 4 slots: about 100 jobs/s, so the outage lands mid-run.
        worker = procs.start(
            "worker",
            worker_argv(url, "--queues", e2e_app.WORK_QUEUE, "--concurrency", "4"),
            env={"E2E_WORK_SLEEP": "0.04"},
        )
        before = wait_until(lambda: (n := db.terminal_counts()["completed"]) >= BATCH // 2 and n, 60, "work under way")
        assert before < BATCH, "the outage must come mid-run"

        cluster.stop("fast")  # disconnects every session, the worker's included
        stopped = time.monotonic()
        while time.monotonic() - stopped < OUTAGE:
            assert worker.popen.poll() is None, f"the worker exited while the database was away:\n{worker.output()}"
            time.sleep(0.1)
        cluster.start()

        # More work arrives after the restart (the producer retries through the outage too).
        send(2 * BATCH)
        total = 3 * BATCH
        wait_until(lambda: _retrying(lambda: db.terminal_counts()["completed"]) >= total, 90, "every job completed")
        assert worker.popen.poll() is None, worker.output()

        assert db.live() == []
        archived = db.archived()
        assert len(archived) == total and {r.id for r in archived} == sent
        assert {(r.state, r.attempts) for r in archived} == {("completed", 1)}

        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output()
        output = worker.output()
        # It met the outage (a call gave up and was retried with backoff, or the pool's own
        # reconnection attempts failed while the server was down), and nothing crashed.
        assert "database unavailable" in output or "connection failed" in output, output
        assert "Traceback" not in output, output
    finally:
        db.close()
        producer.close()
