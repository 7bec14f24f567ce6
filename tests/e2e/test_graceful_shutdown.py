"""Graceful shutdown (DESIGN §2) with a real worker subprocess and real signals.

SIGTERM: fetching stops, buffered-but-unstarted jobs go back to pending at once (undelivered),
in-flight handlers finish, outcomes are flushed, exit code 0. A second SIGTERM exits at once; the
running jobs' leases then expire and rescue returns them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest

from conveyor import App, Message
from conveyor.backends.base import JobGetParams, JobRecord, JobsRescueParams

from . import e2e_app
from ._support import REPO, Db, Proc, Procs, child_env, iter_lines, now, wait_until, worker_argv

JOBS = 20
CONCURRENCY = 2
GRACEFUL_TIMEOUT = 10.0


def _start(
    url: str, procs: Procs, run_log: Path, seconds: float, nohup: bool = False
) -> tuple[App, Db, list[UUID], Proc]:
    producer = App(url, migrate=True)
    e2e_app.register(producer)
    jobs = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": seconds}) for _ in range(JOBS)])
    worker = procs.start(
        "worker",
        ["nohup"] * nohup
        + worker_argv(
            url,
            "--queues",
            e2e_app.SLOW_QUEUE,
            "--concurrency",
            str(CONCURRENCY),
            "--prefetch",
            "100",
            "--graceful-timeout",
            str(GRACEFUL_TIMEOUT),
        ),
        env={"E2E_RUN_LOG": str(run_log)},
    )
    return producer, Db(url), [j.id for j in jobs], worker


def _started(run_log: Path) -> set[UUID]:
    return {UUID(f[1]) for f in iter_lines(run_log) if f[0] == "start"}


def _ended(run_log: Path) -> set[UUID]:
    return {UUID(f[1]) for f in iter_lines(run_log) if f[0] == "end"}


def _get(db: Db, job_id: UUID) -> JobRecord:
    record = db.backend.job_get(JobGetParams(job_id))
    assert record is not None, job_id
    return record


def _wait_all_leased_two_running(db: Db, run_log: Path, ids: list[UUID]) -> set[UUID]:
    """Wait until the worker holds every job (2 running, the rest in its prefetch buffer)."""

    def two_running() -> set[UUID] | None:
        started = _started(run_log)
        assert len(started) <= CONCURRENCY, started
        return started if len(started) == CONCURRENCY else None

    running = wait_until(two_running, 30, "2 running jobs")
    wait_until(lambda: all(r.state == "processing" for r in db.live()) and len(db.live()) == len(ids), 10, "all leased")
    return running


def _released(db: Db, buffered: set[UUID]) -> bool:
    rows = {r.id: r for r in db.live() if r.id in buffered}
    return len(rows) == len(buffered) and all(r.state == "pending" for r in rows.values())


def test_sigterm_finishes_in_flight_and_releases_buffered(database_url: str, procs: Procs, tmp_path: Path) -> None:
    _graceful(database_url, procs, tmp_path, signal.SIGTERM)


def test_sigint_is_graceful_too(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    _graceful(sqlite_url, procs, tmp_path, signal.SIGINT)


def test_a_hang_up_is_graceful_and_never_exits_at_once(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    # A closing terminal sends SIGHUP (the shell may send it more than once). Before: Python's default, the worker
    # was killed mid-job (exit 129), its running and buffered jobs left to their leases.
    _graceful(sqlite_url, procs, tmp_path, signal.SIGHUP, times=2)
    assert "hang-up (SIGHUP): stopping gracefully" in procs.outputs()


def test_under_nohup_a_hang_up_is_ignored(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    run_log = tmp_path / "runs.log"
    producer, db, ids, worker = _start(sqlite_url, procs, run_log, seconds=0.5, nohup=True)
    try:
        _wait_all_leased_two_running(db, run_log, ids)
        worker.signal(signal.SIGHUP)
        wait_until(lambda: len(_ended(run_log)) >= 6, 10, "jobs to go on ending after the hang-up")
        assert worker.popen.poll() is None and "hang-up" not in worker.output(), worker.output()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=GRACEFUL_TIMEOUT + 5) == 0, worker.output()
    finally:
        db.close()
        producer.close()


def _graceful(database_url: str, procs: Procs, tmp_path: Path, sig: signal.Signals, times: int = 1) -> None:
    run_log = tmp_path / "runs.log"
    producer, db, ids, worker = _start(database_url, procs, run_log, seconds=2.0)
    try:
        running = _wait_all_leased_two_running(db, run_log, ids)
        buffered = set(ids) - running

        for _ in range(times):
            worker.signal(sig)
        signalled = time.monotonic()
        # Buffered jobs are handed back at once: long before the running handlers (2 s) end.
        wait_until(lambda: _released(db, buffered), 1.5, "buffered jobs back to pending", interval=0.02)
        released_after = time.monotonic() - signalled
        assert all(_get(db, i).state == "processing" for i in running), "handed back only after the handlers ended"
        assert not _ended(run_log)

        code = worker.wait(timeout=GRACEFUL_TIMEOUT + 5)
        stopped_after = time.monotonic() - signalled
        assert code == 0, worker.output()
        assert released_after < 1.0
        assert stopped_after < GRACEFUL_TIMEOUT

        # In-flight jobs finished and their outcome was flushed before the exit.
        assert _ended(run_log) == running == _started(run_log)
        for job_id in running:
            r = _get(db, job_id)
            assert (r.state, r.attempts, r.deliveries) == ("completed", 1, 1), r
            assert r.result is not None and json.loads(r.result) == {"slept": 2.0}
        # Buffered jobs: pending, ready, undelivered (deliveries back to 0), no lease, never run.
        for job_id in buffered:
            r = _get(db, job_id)
            assert (r.state, r.attempts, r.deliveries, r.lease_expires_at) == ("pending", 0, 0, None), r
            assert r.run_at <= now()
        assert "Traceback" not in worker.output()
    finally:
        db.close()
        producer.close()


def test_second_sigterm_exits_at_once_and_leases_expire(database_url: str, procs: Procs, tmp_path: Path) -> None:
    run_log = tmp_path / "runs.log"
    producer, db, ids, worker = _start(database_url, procs, run_log, seconds=30.0)
    try:
        running = _wait_all_leased_two_running(db, run_log, ids)
        buffered = set(ids) - running

        worker.signal(signal.SIGTERM)
        wait_until(lambda: _released(db, buffered), 1.5, "buffered jobs back to pending", interval=0.02)
        assert worker.popen.poll() is None, "the first SIGTERM must wait for the running handlers"
        # The heartbeat has the starts of jobs running long counted before their outcome, so that a
        # worker dying under them leaves them counted.
        wait_until(
            lambda: all(_get(db, i).deliveries == 1 for i in running),
            e2e_app.VISIBILITY_TIMEOUT + 3,
            "the heartbeat counted the running jobs' starts",
            interval=0.05,
        )
        worker.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = worker.wait(timeout=5)
        assert code != 0
        assert time.monotonic() - signalled < 2.0
        assert not _ended(run_log)

        # The running jobs keep the leases of the dead worker until those expire (visibility
        # timeout 2 s, extended by heartbeats until the exit)...
        for job_id in running:
            r = _get(db, job_id)
            assert r.state == "processing" and r.lease_expires_at is not None and r.lease_expires_at > now(), r
        assert db.backend.jobs_rescue_expired(JobsRescueParams(now())) == 0
        # ...then rescue returns them to pending, the lost delivery still counted, and a rescue too.
        rescued = [0]

        def rescue() -> bool:
            rescued[0] += db.backend.jobs_rescue_expired(JobsRescueParams(now()))
            return rescued[0] >= len(running)

        wait_until(rescue, e2e_app.VISIBILITY_TIMEOUT + 5, "rescue of the expired leases", interval=0.1)
        assert rescued[0] == len(running)
        for job_id in running:
            r = _get(db, job_id)
            assert (r.state, r.attempts, r.deliveries, r.rescues, r.lease_expires_at) == ("pending", 0, 1, 1, None), r
        for job_id in buffered:
            r = _get(db, job_id)
            assert (r.state, r.attempts, r.deliveries, r.rescues, r.lease_expires_at) == ("pending", 0, 0, 0, None), r
    finally:
        db.close()
        producer.close()


def test_graceful_timeout_bounds_the_exit(database_url: str, procs: Procs, tmp_path: Path) -> None:
    """Handlers still running after ``--graceful-timeout`` are abandoned: the process exits then (a
    handler thread must not hold the exit), and their leases later expire and are rescued."""
    run_log = tmp_path / "runs.log"
    producer = App(database_url, migrate=True)
    e2e_app.register(producer)
    db = Db(database_url)
    try:
        ids = [
            j.id for j in producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 60.0}) for _ in range(4)])
        ]
        worker = procs.start(
            "worker",
            worker_argv(database_url, "--queues", e2e_app.SLOW_QUEUE, "--concurrency", "2", "--graceful-timeout", "1"),
            env={"E2E_RUN_LOG": str(run_log)},
        )
        running = _wait_all_leased_two_running(db, run_log, ids)
        worker.signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert worker.wait(timeout=15) == 0, worker.output()
        assert time.monotonic() - signalled < 5.0
        assert "2 handler(s) still running after 1.0s" in worker.output()
        assert not _ended(run_log)
        for job_id in set(ids) - running:
            assert (_get(db, job_id).state, _get(db, job_id).deliveries) == ("pending", 0)

        def rescued() -> bool:
            db.backend.jobs_rescue_expired(JobsRescueParams(now()))
            return all(_get(db, i).state == "pending" for i in running)

        wait_until(rescued, e2e_app.VISIBILITY_TIMEOUT + 5, "rescue of the abandoned jobs", interval=0.1)
        assert {(_get(db, i).attempts, _get(db, i).deliveries) for i in running} == {(0, 1)}
    finally:
        db.close()
        producer.close()


@pytest.mark.parametrize("processes", [1, 2])
def test_threads_a_handler_left_running_do_not_keep_the_process_after_its_stop(
    sqlite_url: str, procs: Procs, processes: int
) -> None:
    """Python waits at exit for a ThreadPoolExecutor's threads: one whose task hangs kept a stopped worker's
    process (and its supervisor) alive until a SIGKILL. It now exits ``--graceful-timeout`` after its stop."""
    producer = App(sqlite_url, migrate=True)
    e2e_app.register(producer)
    db = Db(sqlite_url)
    try:
        jobs = producer.send_many([Message(task=e2e_app.EXIT, payload={"how": "pool"}) for _ in range(processes * 2)])
        worker = procs.start(
            "worker",
            worker_argv(sqlite_url, "--queues", e2e_app.CRASH_QUEUE, "-p", str(processes), "--graceful-timeout", "1"),
        )
        wait_until(lambda: all(_get(db, j.id).state == "completed" for j in jobs), 30, "the jobs", interval=0.1)
        worker.signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert worker.wait(timeout=20) == 0, worker.output()
        assert time.monotonic() - signalled < 10.0
        assert "threads its handlers left running (ThreadPoolExecutor-" in worker.output()
    finally:
        db.close()
        producer.close()


_HOST = """
import sys, threading, time
from conveyor.cli import main
assert main(["--db", sys.argv[1], "worker", "tests.e2e.e2e_app:app", "--burst", "--graceful-timeout", "0.5"]) == 0

def own_work():  # the program's own thread, started after the worker's run: Python waits for it at exit
    time.sleep(2)
    print("own work done", flush=True)

threading.Thread(target=own_work).start()
sys.exit(5)
"""


def test_a_program_that_ran_a_worker_and_goes_on_exits_as_it_would_have(sqlite_url: str) -> None:
    """The exit timer was armed by every worker run: a program that ran one in its process (a test suite, a
    script) and went on was cut short at its exit --graceful-timeout later, its own threads' work lost and its
    exit code replaced by the worker's. Only threads that appeared during the worker's run arm it."""
    App(sqlite_url, migrate=True).close()
    done = subprocess.run(
        [sys.executable, "-c", _HOST, sqlite_url], cwd=REPO, env=child_env(), capture_output=True, timeout=60
    )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 5 and "own work done" in out, out
