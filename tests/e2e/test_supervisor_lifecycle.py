"""The prefork supervisor's own life: its worker processes stop when it is killed; children that cannot
start are restarted with backoff, then given up on; a stopped child is reported, not killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest

from conveyor import App, Message
from conveyor.worker import supervisor

from . import e2e_app
from ._support import REPO, Db, Proc, Procs, at_least, iter_lines, pids_logging, wait_until, worker_argv


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@dataclass
class _Prefork:
    """A prefork worker (2 processes, 1 slot and 1 prefetched job each) on queue ``slow``, with a job
    running in each process: the supervisor's process tree, the ids sent, the run log and the database."""

    tree: Proc
    ids: set[UUID]
    pids: list[int]
    run_log: Path
    db: Db

    def starts(self) -> set[UUID]:
        return {UUID(f[1]) for f in iter_lines(self.run_log) if f[0] == "start"}

    def ends(self) -> set[UUID]:
        return {UUID(f[1]) for f in iter_lines(self.run_log) if f[0] == "end"}

    def wait_for_orphans(self) -> None:
        self.tree.wait(timeout=10)
        wait_until(lambda: not any(_running(p) for p in self.pids), 30, "the orphaned worker processes to stop")


@contextmanager
def _prefork(
    url: str, procs: Procs, tmp_path: Path, *, jobs: int, seconds: float, nohup: bool = False
) -> Iterator[_Prefork]:
    producer = App(url, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(url)
    try:
        sent = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": seconds}) for _ in range(jobs)])
        tree = procs.start(
            "prefork",
            # nohup: started with SIGHUP ignored, as `nohup conveyor worker ... &` does.
            ["nohup"] * nohup
            + worker_argv(url, "--queues", "slow", "--processes", "2", "--concurrency", "1", "--prefetch", "1"),
            env={"E2E_RUN_LOG": str(run_log), "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        pids = wait_until(lambda: at_least(pids_logging(run_log, "start"), 2), 60, "a job running in each")
        yield _Prefork(tree, {j.id for j in sent}, pids, run_log, db)
    finally:
        # Orphans this test left (when it fails): the process-group kill at teardown only covers a
        # supervisor still running.
        for pid in pids_logging(run_log, "start"):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        db.close()
        producer.close()


def test_worker_processes_stop_gracefully_when_the_supervisor_is_killed(
    database_url: str, procs: Procs, tmp_path: Path
) -> None:
    """SIGKILL of the supervisor: each worker process stops as on SIGTERM (its running job finishes,
    its buffered one goes back to pending) instead of leasing jobs for ever with no one to stop it."""
    with _prefork(database_url, procs, tmp_path, jobs=10, seconds=2.0) as run:
        run.tree.signal(signal.SIGKILL)
        run.wait_for_orphans()
        assert run.tree.output().count(") is gone: stopping gracefully") == 2, run.tree.output()

        starts = run.starts()
        assert run.ends() == starts
        archived = run.db.archived()
        assert {r.id for r in archived} == starts
        assert {(r.state, r.attempts) for r in archived} == {("completed", 1)}
        live = run.db.live()
        assert {r.id for r in live} == run.ids - starts
        assert {(r.state, r.lease_expires_at) for r in live} == {("pending", None)}


def test_a_supervisor_killed_during_a_graceful_stop_lets_its_worker_processes_finish_it(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    """SIGTERM, then SIGKILL of the supervisor while its worker processes stop gracefully: its death
    (PR_SET_PDEATHSIG) is no second signal. Before: each process took it for one and exited at
    once ("second SIGTERM: exiting at once"), its running job cut short and left to its lease."""
    with _prefork(sqlite_url, procs, tmp_path, jobs=6, seconds=3.0) as run:
        run.tree.signal(signal.SIGTERM)
        wait_until(lambda: run.tree.output().count("SIGTERM: stopping gracefully") == 2, 10, "both to stop gracefully")
        run.tree.signal(signal.SIGKILL)
        run.wait_for_orphans()
        assert "exiting at once" not in run.tree.output()
        starts = run.starts()
        assert len(starts) == 2
        assert run.ends() == starts
        archived = run.db.archived()
        assert {(r.id, r.state, r.attempts) for r in archived} == {(i, "completed", 1) for i in starts}
        assert {(r.state, r.lease_expires_at) for r in run.db.live()} == {("pending", None)}


_ORPHAN = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "parent":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2], sys.argv[3], str(os.getpid())])
    time.sleep(600)
else:
    import threading
    from conveyor.worker.supervisor import _poll_parent

    def stopped(signum, frame):
        open(sys.argv[3], "w").write("SIGTERM")
        sys.exit(0)

    signal.signal(signal.SIGTERM, stopped)
    threading.Thread(target=_poll_parent, args=(int(sys.argv[4]), 0.05), daemon=True).start()
    open(sys.argv[3] + ".pid", "w").write(str(os.getpid()))
    time.sleep(600)
"""


def test_without_a_parent_death_signal_a_worker_process_polls_for_its_supervisor(procs: Procs, tmp_path: Path) -> None:
    """Where there is no PR_SET_PDEATHSIG (not Linux), a thread polls the parent's pid: once the
    supervisor is gone, the process sends itself the SIGTERM that stops a worker gracefully."""
    out = tmp_path / "child"
    parent = procs.start("parent", [sys.executable, "-c", _ORPHAN, "parent", _ORPHAN, str(out)])
    pid_file = Path(f"{out}.pid")
    pid = int(wait_until(lambda: pid_file.read_text() if pid_file.exists() else None, 60, "the child"))
    try:
        assert _running(pid)
        parent.signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_until(lambda: out.exists() and out.read_text() == "SIGTERM", 30, "the child's SIGTERM")
        wait_until(lambda: not _running(pid), 30, "the child to exit")
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


_CRASHES_IN_CHILDREN = """
import multiprocessing
import os

from conveyor import App

# Only in the supervisor's worker processes: the supervisor's own check of the app passes.
if multiprocessing.parent_process() is not None:
    os._exit(3)
app = App()
"""


def test_worker_processes_that_cannot_start_are_restarted_with_backoff_then_given_up(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    """Children that die before their first acquire (here: their app's import ends the process, in
    children only) are restarted after 0.1, 0.2, 0.4, 0.8 s; the fifth failure in a row stops the
    supervisor, exit 1, with one line naming how the last one ended. Before, they were restarted every
    0.5 s for ever."""
    (tmp_path / "crashes_in_children.py").write_text(_CRASHES_IN_CHILDREN)
    App(sqlite_url).close()
    argv = [sys.executable, "-m", "conveyor", "--db", sqlite_url, "worker", "crashes_in_children:app", "-p", "2"]
    tree = procs.start("prefork", argv, env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])})
    try:
        code = tree.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the supervisor restarts children that cannot start for ever:\n{tree.output()[-3000:]}")
    output = tree.output()
    assert code == 1, output
    for delay in ("0.1", "0.2", "0.4", "0.8"):
        assert f"exited with 3; restarting it in {delay}s" in output, output
    assert output.count("keep failing to start") == 1, output
    assert "(5 in a row; the last, pid " in output and "ended with exit code 3 before its first acquire)" in output
    assert "in 1.6s" not in output


def test_restart_delays() -> None:
    """A quick death doubles the restart delay (to a cap); one after RAN_A_WHILE restarts at once and
    starts the count again; only deaths before the worker was up count towards giving up."""
    slot = supervisor._Slot(0, None, started=0.0)  # type: ignore[arg-type]  # no process: the arithmetic alone
    delays = [slot.died(was_up=True, now=1.0) for _ in range(10)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]
    assert slot.failed_starts == 0  # up every time (a poison job's doing): never given up on
    assert slot.died(was_up=False, now=supervisor.RAN_A_WHILE) == 0.0  # it ran a while
    assert (slot.quick_deaths, slot.failed_starts) == (0, 0)
    for _ in range(supervisor.FAILED_STARTS_LIMIT - 1):
        assert slot.died(was_up=False, now=1.0) is not None
    assert slot.died(was_up=True, now=1.0) is not None  # one that got up breaks the run
    for _ in range(supervisor.FAILED_STARTS_LIMIT - 1):
        assert slot.died(was_up=False, now=1.0) is not None
    assert slot.died(was_up=False, now=1.0) is None


def test_poison_jobs_that_kill_worker_processes_do_not_stop_the_supervisor(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    """Children killed by their handlers, again and again within a second or two of their start, are
    not failed starts (their worker was up): the supervisor goes on restarting them (poison protection
    is what ends such jobs), with backoff, however many die in a row."""
    producer = App(sqlite_url)
    e2e_app.register(producer)
    try:
        # One job per process at a time (--prefetch 1): each fresh child takes a fresh poison job and dies.
        producer.send_many([Message(task=e2e_app.CRASH) for _ in range(3 * supervisor.FAILED_STARTS_LIMIT)])
        tree = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--queues", "crash", "--processes", "2", "--concurrency", "1", "--prefetch", "1"),
        )
        more = 2 * supervisor.FAILED_STARTS_LIMIT + 1  # so that one slot had FAILED_STARTS_LIMIT + 1 in a row
        wait_until(lambda: tree.output().count("exited with -9; restarting it") >= more, 120, f"{more} deaths", 0.2)
        assert tree.popen.poll() is None, tree.output()
        assert "keep failing to start" not in tree.output()
        assert "restarting it in 0.8s" in tree.output()  # backed off all the same
    finally:
        producer.close()


def test_burst_reports_a_stopped_worker_process(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    """Under --burst a stopped child (SIGSTOP) holds the drain up for as long as it stays stopped: the
    supervisor says so (once when it stops, once when it is all that is left) rather than wait
    silently, and does not kill it; continued, it finishes and the burst exits 0."""
    producer = App(sqlite_url)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    try:
        slow = [Message(task=e2e_app.SLOW, payload={"seconds": 1.0}) for _ in range(6)]
        ids = {j.id for j in producer.send_many(slow)}
        tree = procs.start(
            "prefork",
            worker_argv(
                sqlite_url, "--queues", "slow", "--processes", "2", "--concurrency", "1", "--prefetch", "1", "--burst"
            ),
            env={"E2E_RUN_LOG": str(run_log)},
        )
        pids = wait_until(lambda: at_least(pids_logging(run_log, "start"), 2), 60, "a job running in each")
        stopped = pids[0]
        os.kill(stopped, signal.SIGSTOP)
        wait_until(lambda: f"worker process {stopped} is stopped (signal SIGSTOP)" in tree.output(), 30, "the report")
        assert "the burst cannot end before it does" in tree.output()
        # The other process drains the rest, the stopped one's jobs too once their leases expire.
        waiting = f"waiting for stopped worker process(es) {stopped} "
        wait_until(lambda: waiting in tree.output(), 90, "the report that only the stopped one is left", 0.2)
        assert _running(stopped) and tree.popen.poll() is None
        os.kill(stopped, signal.SIGCONT)
        assert tree.wait(timeout=60) == 0, tree.output()
        assert f"worker process {stopped} was continued" in tree.output()
        assert tree.output().count("is stopped (") == 1
        assert {producer.job(j).state for j in ids} == {"completed"}
    finally:
        producer.close()


def test_under_nohup_a_hang_up_of_the_group_is_ignored_and_a_killed_supervisor_still_stops_its_children(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    """`nohup conveyor worker -p 2 &` and the terminal closes: every process of the group gets SIGHUP, which nohup
    asked to ignore. Before: each child took it for its supervisor's death notice, stopped, and was restarted.
    The supervisor's real death is still noticed (its last notice comes once init is the parent)."""
    with _prefork(sqlite_url, procs, tmp_path, jobs=10, seconds=2.0, nohup=True) as run:
        os.killpg(run.tree.pid, signal.SIGHUP)
        run.tree.signal(signal.SIGHUP)
        wait_until(lambda: len(run.ends()) >= 2, 10, "the first two jobs to end")
        assert all(_running(p) for p in run.pids), run.tree.output()
        assert "is gone" not in run.tree.output() and "restarting" not in run.tree.output(), run.tree.output()
        run.tree.signal(signal.SIGKILL)
        run.wait_for_orphans()
        assert run.tree.output().count(") is gone: stopping gracefully") == 2, run.tree.output()
        assert run.ends() == run.starts()
        assert {(r.state, r.attempts) for r in run.db.archived()} == {("completed", 1)}


def test_a_sigterm_to_one_worker_process_stops_it_gracefully_and_the_supervisor_replaces_it(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    """An operator's SIGTERM straight to one child (not the supervisor): that child stops gracefully (its
    running job finishes, its buffered one goes back), the supervisor starts another in its place, and
    every job completes once."""
    with _prefork(sqlite_url, procs, tmp_path, jobs=6, seconds=1.0) as run:
        os.kill(run.pids[0], signal.SIGTERM)
        wait_until(lambda: f"worker process {run.pids[0]} exited with 0; restarting it" in run.tree.output(), 10, "it")
        wait_until(lambda: len(run.ends()) == len(run.ids), 20, "every job to run")
        run.tree.signal(signal.SIGTERM)
        assert run.tree.wait(timeout=10) == 0, run.tree.output()
        assert run.starts() == run.ends() == run.ids
        assert sum(1 for f in iter_lines(run.run_log) if f[0] == "start") == len(run.ids)  # each once
        assert {(r.state, r.attempts) for r in run.db.archived()} == {("completed", 1)}
        assert run.db.live() == []
        assert "Traceback" not in run.tree.output()
