"""Poison protection against real crashes, and what a crash costs the jobs a worker had only prefetched.

A worker leases more jobs than it runs (its prefetch buffer). A delivery is counted when a job
starts, not when it is leased, so a worker that dies charges only the jobs it was running: the jobs
it merely held come back uncounted, however many times a poison job kills it. The poison job itself
is counted on every start and dead-lettered once it passes its ``max_deliveries``."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from conveyor import App, Message

from . import e2e_app
from ._support import Db, Procs, iter_lines, worker_argv

GOOD = 29


def _send(url: str, how: str) -> tuple[UUID, list[UUID]]:
    producer = App(url, migrate=True)
    e2e_app.register(producer)
    try:
        # The hostile job first: in hand-out order it is the one a single slot starts, the good jobs
        # wait in the prefetch buffer behind it.
        hostile = producer.send_many([Message(task=e2e_app.EXIT, payload={"how": how})])[0].id
        good = producer.send_many(
            [
                Message(task=e2e_app.WORK, queue=e2e_app.CRASH_QUEUE, payload={"kind": e2e_app.OK, "n": n})
                for n in range(GOOD)
            ]
        )
        return hostile, [j.id for j in good]
    finally:
        producer.close()


def _drain_with_restarts(url: str, procs: Procs, run_log: Path, runs: int) -> list[int]:
    """Run ``conveyor worker --burst -c 1 --prefetch 30`` again each time it dies; its exit codes."""
    codes = []
    for i in range(runs):
        worker = procs.start(
            f"worker-{i}",
            worker_argv(url, "--queues", e2e_app.CRASH_QUEUE, "--concurrency", "1", "--prefetch", "30", "--burst"),
            env={"E2E_RUN_LOG": str(run_log), "E2E_VISIBILITY_TIMEOUT": "1"},
        )
        codes.append(worker.wait(timeout=60))
        if codes[-1] == 0:
            break
    return codes


def test_a_crashing_job_is_dead_lettered_and_the_prefetched_jobs_are_not_charged(
    database_url: str, procs: Procs, tmp_path: Path
) -> None:
    hostile, good = _send(database_url, "os._exit")
    run_log = tmp_path / "runs.log"

    codes = _drain_with_restarts(database_url, procs, run_log, runs=e2e_app.CRASH_MAX_DELIVERIES + 2)

    # Each start of the hostile job killed its worker; the run after the last one ended cleanly.
    assert codes == [1] * e2e_app.CRASH_MAX_DELIVERIES + [0], procs.outputs()
    db = Db(database_url)
    try:
        records = {r.id: r for r in db.archived()}
        poison = records[hostile]
        assert (poison.state, poison.reason, poison.attempts) == ("dead", "max_deliveries_exceeded", 0)
        hostile_runs = [f for f in iter_lines(run_log) if UUID(f[1]) == hostile]
        assert len(hostile_runs) == e2e_app.CRASH_MAX_DELIVERIES
        # The good jobs sat in the buffer of every worker the hostile job killed: none was charged.
        assert [(records[g].state, records[g].deliveries, records[g].attempts) for g in good] == [
            ("completed", 1, 1)
        ] * GOOD
        assert db.live() == []
    finally:
        db.close()


def test_a_handler_raising_system_exit_fails_its_attempts_and_the_worker_carries_on(
    database_url: str, procs: Procs, tmp_path: Path
) -> None:
    hostile, good = _send(database_url, "SystemExit")
    run_log = tmp_path / "runs.log"

    codes = _drain_with_restarts(database_url, procs, run_log, runs=1)

    assert codes == [0], procs.outputs()
    db = Db(database_url)
    try:
        records = {r.id: r for r in db.archived()}
        bad = records[hostile]
        assert (bad.state, bad.reason, bad.attempts, bad.error_type) == (
            "dead",
            "max_attempts_exceeded",
            e2e_app.CRASH_MAX_DELIVERIES,
            "SystemExit",
        )
        assert [(records[g].state, records[g].deliveries) for g in good] == [("completed", 1)] * GOOD
    finally:
        db.close()
