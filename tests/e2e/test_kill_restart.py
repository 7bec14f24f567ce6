"""10,000 jobs, 4 worker processes, two of them SIGKILLed mid-run and restarted: every job ends
exactly as its policy says, none is lost, none stays processing."""

from __future__ import annotations

import signal
import socket
import time
from collections import Counter
from functools import partial

import pytest

from conveyor import App, Message
from conveyor._outcomes import MAX_ATTEMPTS_EXCEEDED, PERMANENT_ERROR

from . import e2e_app
from ._support import Db, Proc, Procs, wait_until, worker_argv

TOTAL = 10_000
WORKERS = 4
#: Completed jobs (counted in the database) at which the first and the second worker are killed.
KILL_AT = (2_500, 5_000)


def _completed_at_least(db: Db, n: int) -> bool:
    return db.terminal_counts()["completed"] >= n


def _holds(db: Db, worker_id: str, n: int) -> bool:
    return db.held_by(worker_id) >= n


def kind_of(n: int) -> str:
    """1% permanent, 1% transient always, 5% transient once, the rest succeed."""
    r = n % 100
    if r == 0:
        return e2e_app.PERMANENT
    if r == 1:
        return e2e_app.TRANSIENT_ALWAYS
    if 2 <= r <= 6:
        return e2e_app.TRANSIENT_ONCE
    return e2e_app.OK


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_and_restart(database_url: str, procs: Procs) -> None:
    producer = App(database_url, migrate=True)
    e2e_app.register(producer)
    db = Db(database_url)
    try:
        _run(database_url, producer, db, procs)
    finally:
        db.close()
        producer.close()


def _run(url: str, producer: App, db: Db, procs: Procs) -> None:
    kinds = {}
    for start in range(0, TOTAL, 1000):
        messages = [
            Message(task=e2e_app.WORK, payload={"kind": kind_of(n), "n": n}) for n in range(start, start + 1000)
        ]
        for message, job in zip(messages, producer.send_many(messages), strict=True):
            kinds[job.id] = message.payload["kind"]
    assert len(kinds) == TOTAL

    def start_worker(i: int) -> Proc:
        # --visibility-timeout: the lease given at acquire before the task's own (2 s) applies;
        # short too, so that the buffered jobs of a killed worker come back fast. Each job sleeps
        # 15 ms: about 1,000 jobs/s over the 16 slots, so that the kills land mid-run.
        argv = worker_argv(url, "--processes", "1", "--concurrency", "4", "--visibility-timeout", "2", "--burst")
        return procs.start(f"worker{i}", argv, env={"E2E_WORK_SLEEP": "0.015"})

    workers = [start_worker(i) for i in range(WORKERS)]
    host = socket.gethostname()
    orphaned: list[int] = []
    for victim, threshold in enumerate(KILL_AT):
        wait_until(partial(_completed_at_least, db, threshold), 60, f"{threshold} completed jobs")
        proc = workers[victim]
        worker_id = f"{host}:{proc.pid}"
        assert proc.popen.poll() is None, f"worker {victim} exited early:\n{proc.output()}"
        # Kill it while it holds leases (its buffer is refilled in batches, so it nearly always does).
        wait_until(partial(_holds, db, worker_id, 8), 10, f"{worker_id} holding leases", interval=0.01)
        proc.signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        # The leases the dead worker held (buffered and running jobs): rescue must bring them back.
        orphaned.append(db.held_by(worker_id))
        workers[victim] = start_worker(victim)
    assert all(n > 0 for n in orphaned), f"a kill caught no job in flight: {orphaned}"
    assert db.terminal_counts()["completed"] < TOTAL, "the run ended before the restarted workers joined"

    # Burst workers exit 0 once nothing is live: orphaned leases must first expire and be rescued.
    deadline = time.monotonic() + 120
    for proc in workers:
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, proc.output()

    # Nothing lost, nothing left live.
    assert db.live() == []
    archived = db.archived()
    assert len(archived) == TOTAL
    assert {r.id for r in archived} == set(kinds)

    outcomes: Counter[tuple[str, str, str | None, int]] = Counter()
    for r in archived:
        outcomes[(kinds[r.id], r.state, r.reason, r.attempts)] += 1
        # deliveries - attempts counts deliveries that ended without a recorded outcome: only the
        # two kills can lose one (a graceful stop hands buffered jobs back undelivered).
        assert 0 <= r.deliveries - r.attempts <= len(KILL_AT), r
    # Exactly as the policy says, attempts counted by the database (never in process memory).
    # The always-transient jobs end on max_attempts_exceeded, never on max_deliveries_exceeded:
    # their delivery limit is max_attempts + 5 = 8, and they can be delivered at most 3 + 2 times
    # (3 recorded attempts plus one lost delivery per kill).
    per_100 = TOTAL // 100
    assert outcomes == {
        (e2e_app.OK, "completed", None, 1): TOTAL - 7 * per_100,
        (e2e_app.TRANSIENT_ONCE, "completed", None, 2): 5 * per_100,
        (e2e_app.PERMANENT, "dead", PERMANENT_ERROR, 1): per_100,
        (e2e_app.TRANSIENT_ALWAYS, "dead", MAX_ATTEMPTS_EXCEEDED, e2e_app.MAX_ATTEMPTS): per_100,
    }
    errors = Counter((kinds[r.id], r.error_type) for r in archived if r.state == "dead")
    assert errors == {
        (e2e_app.PERMANENT, "ValueError"): per_100,
        (e2e_app.TRANSIENT_ALWAYS, "TransientError"): per_100,
    }
    # The kills did cost leases: some jobs were rescued from the killed workers. (Not necessarily
    # every job seen leased to a killed worker: an ack it sent just before the kill can still commit
    # on the server after the client died.) Their starts were counted only if they had run a while
    # (the heartbeat counts those) or were suspects already: a lease alone is not a delivery.
    assert any(r.rescues > 0 for r in archived)
    assert all(r.rescues <= len(KILL_AT) for r in archived)
    stats = db.terminal_counts()
    assert (stats["completed"], stats["dead"], stats["pending"], stats["processing"]) == (
        TOTAL - 2 * per_100,
        2 * per_100,
        0,
        0,
    )
