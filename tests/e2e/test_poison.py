"""Poison protection against real crashes, and what a crash costs the jobs a worker had only prefetched.

A worker leases more jobs than it runs (its prefetch buffer). A lease is not a delivery: a start is
counted with its outcome, so a worker that dies charges none of the jobs it held, and those it merely
prefetched come back uncounted however many times a poison job kills it. Rescue marks every job it
returns as a suspect, and a suspect's starts are counted before its handler runs: the poison job is
counted on every start after its first crash and dead-lettered once it passes ``max_deliveries``
(so it runs ``max_deliveries + 1`` times in all)."""

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

    codes = _drain_with_restarts(database_url, procs, run_log, runs=e2e_app.CRASH_MAX_DELIVERIES + 3)

    # Each start of the hostile job killed its worker; the run after the last one ended cleanly.
    assert codes == [1] * (e2e_app.CRASH_MAX_DELIVERIES + 1) + [0], procs.outputs()
    db = Db(database_url)
    try:
        records = {r.id: r for r in db.archived()}
        poison = records[hostile]
        assert (poison.state, poison.reason, poison.attempts) == ("dead", "max_deliveries_exceeded", 0)
        assert (poison.deliveries, poison.rescues) == (e2e_app.CRASH_MAX_DELIVERIES, e2e_app.CRASH_MAX_DELIVERIES + 1)
        hostile_runs = [f for f in iter_lines(run_log) if UUID(f[1]) == hostile]
        assert len(hostile_runs) == e2e_app.CRASH_MAX_DELIVERIES + 1
        # The good jobs sat in the buffer of every worker the hostile job killed: none was charged.
        assert [(records[g].state, records[g].deliveries, records[g].attempts, records[g].rescues) for g in good] == [
            ("completed", 1, 1, e2e_app.CRASH_MAX_DELIVERIES + 1)
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


def test_jobs_that_ran_beside_a_crashing_job_are_not_dead_lettered_with_it(
    database_url: str, procs: Procs, tmp_path: Path
) -> None:
    # Found by a hostile sweep: the jobs a crash leaves behind are leased again together, and all of
    # them are suspects, whose starts are counted before they run. Run side by side with the job that
    # kills its workers, they died with it each time and were charged each time: innocent jobs ended
    # dead (max_deliveries_exceeded). Now one suspect runs at a time in a worker process.
    producer = App(database_url, migrate=True)
    e2e_app.register(producer)
    try:  # innocent jobs of the same task: the same delivery limit (CRASH_MAX_DELIVERIES)
        hostile = producer.send_many([Message(task=e2e_app.EXIT, payload={"how": "os._exit"})])[0].id
        good = [
            j.id for j in producer.send_many([Message(task=e2e_app.EXIT, payload={"how": "ok"}) for _ in range(GOOD)])
        ]
    finally:
        producer.close()
    run_log = tmp_path / "runs.log"
    codes = []
    for i in range(e2e_app.CRASH_MAX_DELIVERIES + 3):
        worker = procs.start(
            f"worker-{i}",
            worker_argv(url := database_url, "--queues", e2e_app.CRASH_QUEUE, "-c", "4", "--prefetch", "30", "--burst"),
            env={"E2E_RUN_LOG": str(run_log), "E2E_VISIBILITY_TIMEOUT": "1", "E2E_WORK_SLEEP": "0.3"},
        )
        codes.append(worker.wait(timeout=90))
        if codes[-1] == 0:
            break
    assert codes[-1] == 0, procs.outputs()
    db = Db(url)
    try:
        records = {r.id: r for r in db.archived()}
        assert (records[hostile].state, records[hostile].reason) == ("dead", "max_deliveries_exceeded")
        states = [(records[g].state, records[g].reason) for g in good]
        assert states == [("completed", None)] * GOOD, [s for s in states if s[0] != "completed"]
        assert db.live() == []
    finally:
        db.close()
