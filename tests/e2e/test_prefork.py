"""Prefork: ``conveyor worker APP --processes 2 --burst`` drains one SQLite file with several worker
processes, every job completed exactly once, exit code 0."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path
from uuid import UUID

import pytest

from conveyor import App, Message
from conveyor.backends.base import JobGetParams

from . import e2e_app
from ._support import Db, Procs, at_least, iter_lines, pids_logging, wait_until, worker_argv

JOBS = 600
PROCESSES = 2


def test_prefork_drains_sqlite_exactly_once(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    producer = App(sqlite_url)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(sqlite_url)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(JOBS)]
        ids = {j.id for j in producer.send_many(messages)}
        supervisor = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--processes", str(PROCESSES), "--concurrency", "4", "--burst"),
            # 10 ms per job keeps both processes busy for a while; long leases rule out any
            # redelivery, so "exactly once" is what must happen here.
            env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "0.01", "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        assert supervisor.wait(timeout=120) == 0, supervisor.output()

        runs = Counter(UUID(f[1]) for f in iter_lines(run_log) if f[0] == "run")
        assert set(runs) == ids
        assert set(runs.values()) == {1}, {i: n for i, n in runs.items() if n != 1}
        # The work was shared by the worker processes (the supervisor itself runs no handler).
        pids = Counter(int(f[4]) for f in iter_lines(run_log))
        assert len(pids) == PROCESSES and supervisor.pid not in pids, pids

        assert db.live() == []
        archived = db.archived()
        assert {r.id for r in archived} == ids
        assert {(r.state, r.attempts, r.deliveries) for r in archived} == {("completed", 1, 1)}
        assert len({r.worker_id for r in archived}) == PROCESSES
        assert "Traceback" not in supervisor.output()
        # The worker processes log as the supervisor was told to (-v: INFO, with the CLI's format).
        for pid in pids:
            assert re.search(rf"^\S+ \S+ INFO conveyor.worker: worker [^:]+:{pid}: queues ", supervisor.output(), re.M)
            assert re.search(rf"^\S+ \S+ INFO conveyor.worker: worker [^:]+:{pid} stopped: ", supervisor.output(), re.M)
    finally:
        db.close()
        producer.close()


def test_prefork_sigterm_is_graceful(database_url: str, procs: Procs, tmp_path: Path) -> None:
    """SIGTERM to the supervisor reaches every worker process: each finishes its running job,
    hands its buffered ones back, and the supervisor exits 0."""
    producer = App(database_url, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(database_url)
    try:
        jobs = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 4.0}) for _ in range(10)])
        ids = {j.id for j in jobs}
        supervisor = procs.start(
            "prefork",
            worker_argv(database_url, "--queues", "slow", "--processes", "2", "--concurrency", "1", "--prefetch", "1"),
            env={"E2E_RUN_LOG": str(run_log)},
        )
        pids = wait_until(lambda: at_least(pids_logging(run_log, "start"), 2), 60, "a job running in each")
        assert supervisor.pid not in pids
        running = {UUID(f[1]) for f in iter_lines(run_log) if f[0] == "start"}
        assert len(running) == 2
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()

        assert {UUID(f[1]) for f in iter_lines(run_log) if f[0] == "end"} == running
        archived = db.archived()
        assert {r.id for r in archived} == running
        assert {(r.state, r.attempts, r.deliveries) for r in archived} == {("completed", 1, 1)}
        live = db.live()
        assert {r.id for r in live} == ids - running
        assert {(r.state, r.attempts, r.deliveries, r.lease_expires_at) for r in live} == {("pending", 0, 0, None)}
    finally:
        db.close()
        producer.close()


def test_prefork_restarts_a_killed_worker_process(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    """A worker process that dies (SIGKILL) is replaced by the supervisor; its jobs come back
    through rescue; nothing is lost."""
    producer = App(sqlite_url)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(sqlite_url)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(400)]
        ids = {j.id for j in producer.send_many(messages)}
        supervisor = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--queues", "e2e", "--processes", "2", "--concurrency", "2"),
            env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "0.02"},
        )
        first = wait_until(lambda: at_least(pids_logging(run_log, "run"), 2), 60, "two worker processes at work")[0]
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: len(pids_logging(run_log, "run")) >= 3, 60, "a replacement worker process at work")
        assert supervisor.popen.poll() is None
        wait_until(lambda: len(db.archived()) == len(ids), 90, "every job completed", interval=0.2)
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()
        assert f"worker process {first} exited with -9; restarting it" in supervisor.output()

        assert db.live() == []
        archived = db.archived()
        assert {r.id for r in archived} == ids
        assert {(r.state, r.attempts) for r in archived} == {("completed", 1)}
        assert any(r.rescues == 1 for r in archived), "the killed process held no job"
    finally:
        db.close()
        producer.close()


def test_poison_job_that_kills_its_worker_is_dead_lettered(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    """A job whose handler kills the worker process (OOM, segfault) cannot cycle for ever: once it
    has been delivered more than its max_deliveries it is dead-lettered without running, and the
    worker processes (restarted by the supervisor) carry on with the other work."""
    producer = App(sqlite_url)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(sqlite_url)
    try:
        poison = producer.send_many([Message(task=e2e_app.CRASH)])[0].id
        supervisor = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--queues", "crash,e2e", "--processes", "2", "--concurrency", "1"),
            env={"E2E_RUN_LOG": str(run_log)},
        )

        def dead() -> bool:
            record = db.backend.job_get(JobGetParams(poison))
            return record is not None and record.state == "dead"

        wait_until(dead, 90, "the poison job dead-lettered", interval=0.2)
        record = db.backend.job_get(JobGetParams(poison))
        assert record is not None
        assert (record.reason, record.error_type, record.attempts) == ("max_deliveries_exceeded", "PoisonJob", 0)
        # Its first crash was not counted (nothing suspected it yet); each later start was, before it ran.
        assert (record.deliveries, record.rescues) == (e2e_app.CRASH_MAX_DELIVERIES, e2e_app.CRASH_MAX_DELIVERIES + 1)
        runs = [f for f in iter_lines(run_log) if f[0] == "run" and UUID(f[1]) == poison]
        assert [int(f[2]) for f in runs] == [1, *range(1, e2e_app.CRASH_MAX_DELIVERIES + 1)], runs

        # The supervisor replaced the killed processes and the workers still work.
        assert supervisor.popen.poll() is None
        assert supervisor.output().count("exited with -9; restarting it") == e2e_app.CRASH_MAX_DELIVERIES + 1
        after = producer.send_many([Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": 1})])[0]
        assert after.wait(timeout=30).state == "completed"
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()
    finally:
        db.close()
        producer.close()


def _worker_children(pid: int) -> list[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    out = []
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        for child in children:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
    except OSError:
        pass
    return out


def test_prefork_sigterm_while_worker_processes_start(sqlite_url: str, procs: Procs) -> None:
    """SIGTERM to the supervisor just after it spawned its worker processes (still importing, no
    signal handler yet): they die of that SIGTERM holding nothing, and that is a clean stop."""
    App(sqlite_url).close()
    supervisor = procs.start("prefork", worker_argv(sqlite_url, "--processes", "2"))
    wait_until(lambda: len(_worker_children(supervisor.pid)) >= 2, 60, "two worker processes spawned", interval=0.005)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output()
    assert "Traceback" not in supervisor.output()


# A Ctrl-C to the process group at the worst moments for the supervisor's first start of a worker process: right
# after it blocked SIGINT for the start ("blocked"), right after the start ("started", the process still starting up).
# The wrapper stands in for a terminal whose signal lands between two system calls, as a real one does now and then.
_CTRL_C_AT = """
import os, signal, sys
from conveyor.cli import main
mask, sent = signal.pthread_sigmask, []

def pthread_sigmask(how, signals):
    previous = mask(how, signals)
    blocked = how == signal.SIG_BLOCK and set(signals) == {signal.SIGINT}
    started = how == signal.SIG_SETMASK and signal.SIGINT in previous
    if not sent and (blocked if sys.argv[2] == "blocked" else started):
        sent.append(True)
        os.killpg(0, signal.SIGINT)
    return previous

signal.pthread_sigmask = pthread_sigmask
sys.exit(main(["--db", sys.argv[1], "-v", "worker", "tests.e2e.e2e_app:app", "--processes", "2"]))
"""


@pytest.mark.parametrize("moment", ["blocked", "started"])
def test_prefork_ctrl_c_while_a_worker_process_starts_is_one_graceful_stop(
    sqlite_url: str, procs: Procs, moment: str
) -> None:
    """ "blocked": the supervisor, starting a worker process, had SIGINT blocked (so that it waits) and then set it to
    SIG_IGN for the start (so that the new process starts ignoring it), which discards a pending one: the Ctrl-C was
    lost, the supervisor and its processes ran on (CI saw it once, as an autoscale test timing out). "started": the
    first process started with SIGINT neither ignored nor blocked (starting multiprocessing's resource tracker
    unblocks it) and died of it in its imports, a traceback and exit 1. Both: one graceful stop, exit 0."""
    App(sqlite_url, migrate=True).close()
    supervisor = procs.start("prefork", [sys.executable, "-c", _CTRL_C_AT, sqlite_url, moment])
    assert supervisor.wait(timeout=30) == 0, supervisor.output()
    assert "Traceback" not in supervisor.output() and "KeyboardInterrupt" not in supervisor.output()


def test_prefork_sigterm_stops_a_stopped_worker_process_too(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    """A worker process that is stopped (SIGSTOP: a hostile handler can stop its own process) gets
    the forwarded SIGTERM with a SIGCONT, finishes its job and exits: before, the supervisor waited
    for it for ever, and only SIGKILL ended it."""
    producer = App(sqlite_url)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    try:
        producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 2.0}) for _ in range(4)])
        supervisor = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--queues", "slow", "--processes", "2", "--concurrency", "1", "--prefetch", "1"),
            env={"E2E_RUN_LOG": str(run_log)},
        )
        pids = wait_until(lambda: at_least(pids_logging(run_log, "start"), 2), 60, "a job running in each")
        os.kill(pids[0], signal.SIGSTOP)
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()
    finally:
        producer.close()


def test_a_burst_does_not_end_on_a_worker_process_a_handler_exited_with_0(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    """``os._exit(0)`` in a handler, under ``--processes 2 --burst``: the supervisor restarts that process as
    any other that died. Before: it took the exit 0 for a drained burst; once the job had ended both
    processes so, the supervisor exited 0 with jobs still leased (state ``processing``) and nobody to run them."""
    producer = App(sqlite_url)
    e2e_app.register(producer)
    db = Db(sqlite_url)
    try:
        exits = producer.send_many([Message(task=e2e_app.EXIT, payload={"how": "os._exit(0)"})])[0].id
        oks = {j.id for j in producer.send_many([Message(task=e2e_app.EXIT, payload={"how": "ok"}) for _ in range(4)])}
        supervisor = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--queues", "crash", "--processes", "2", "--concurrency", "1", "--burst"),
            env={"E2E_WORK_SLEEP": "0.2"},
        )
        assert supervisor.wait(timeout=60) == 0, supervisor.output()
        assert "exited with 0; restarting it" in supervisor.output()
        assert db.live() == [], db.live()
        archived = {r.id: r for r in db.archived()}
        assert (archived[exits].state, archived[exits].reason) == ("dead", "max_deliveries_exceeded")
        assert {archived[i].state for i in oks} == {"completed"}
    finally:
        db.close()
        producer.close()
