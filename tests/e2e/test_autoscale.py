"""``conveyor worker APP --autoscale MIN:MAX``: real supervisor and worker processes on PostgreSQL grow on the
load of their queues, shrink back one at a time after the cool-down, lose and repeat no job; SIGTERM stops
everything mid-scale; a killed worker process is restarted unless autoscaling was stopping it."""

from __future__ import annotations

import os
import re
import resource
import signal
import time
from collections import Counter
from pathlib import Path
from uuid import UUID

import psycopg
from psycopg import sql

from conveyor import App, Message

from . import e2e_app
from ._support import Db, Procs, iter_lines, wait_until, worker_argv

JOBS = 300
#: Short intervals and cool-downs, so that a test sees a whole grow-and-shrink cycle in seconds.
FAST = ("--scale-interval", "0.2", "--scale-out-cooldown", "0.5")
#: Seconds of the job that keeps a retiring process busy: past its 20 s scale-in cool-down.
LONG = 40.0


def worker_children(pid: int) -> list[int]:
    """The supervisor's live worker processes (not multiprocessing's resource tracker, not zombies)."""
    out = []
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return out
    for child in children:
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(child)
        except OSError:
            continue
    return out


def starts_of(run_log: Path, job: UUID) -> list[int]:
    """The processes that started ``job``, in order (the e2e app's run log)."""
    return [int(f[4]) for f in iter_lines(run_log) if f[:2] == ["start", str(job)]]


def count_is(pid: int, n: int) -> list[int] | None:
    found = worker_children(pid)
    return found if len(found) == n else None


def test_autoscale_grows_on_load_and_shrinks_back_one_at_a_time(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(postgres_database)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(JOBS)]
        ids = {j.id for j in producer.send_many(messages)}
        supervisor = procs.start(
            "autoscale",
            worker_argv(
                postgres_database,
                "--queues",
                "e2e",
                "--concurrency",
                "2",
                "--autoscale",
                "1:3",
                *FAST,
                "--scale-in-cooldown",
                "2",
            ),
            # 50 ms a job at 2 slots a process: one process would take 7.5 s; long leases rule out any
            # redelivery, so every job must run exactly once.
            env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "0.05", "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        wait_until(lambda: count_is(supervisor.pid, 3), 60, "three worker processes", interval=0.02)
        assert re.search(r"INFO conveyor.worker: autoscale: 1 -> 3 worker processes \(ready \d+", supervisor.output())
        wait_until(lambda: len(db.archived()) == JOBS, 120, "every job completed", interval=0.2)
        # Back to one: 3 -> 2 -> 1, one at a time, each after the load asked for fewer for the cool-down.
        stopped = re.compile(r"autoscale: worker process \d+ stopped \(scale-in\)")
        wait_until(lambda: len(stopped.findall(supervisor.output())) == 2, 60, "two processes scaled in")
        assert count_is(supervisor.pid, 1), worker_children(supervisor.pid)
        output = supervisor.output()
        assert "autoscale: 3 -> 2 worker processes" in output
        assert "autoscale: 2 -> 1 worker processes" in output
        assert "3 -> 1" not in output
        assert "restarting it" not in output  # a scaled-in process is never restarted
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 0, supervisor.output()

        runs = Counter(UUID(f[1]) for f in iter_lines(run_log) if f[0] == "run")
        assert set(runs) == ids
        assert set(runs.values()) == {1}, {i: n for i, n in runs.items() if n != 1}
        assert len({int(f[4]) for f in iter_lines(run_log)}) == 3  # the work was shared by three processes
        assert db.live() == []
        archived = db.archived()
        assert {(r.state, r.attempts, r.deliveries) for r in archived} == {("completed", 1, 1)}
        assert db.terminal_counts()["dead"] == 0
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def test_sigterm_while_scaling_out_stops_everything_and_loses_nothing(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    db = Db(postgres_database)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(JOBS)]
        ids = {j.id for j in producer.send_many(messages)}
        supervisor = procs.start(
            "autoscale",
            worker_argv(postgres_database, "--queues", "e2e", "--concurrency", "2", "--autoscale", "1:3", *FAST),
            env={"E2E_WORK_SLEEP": "0.05", "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        # The moment it decided to grow: the new processes are being spawned (or are still importing).
        wait_until(lambda: "autoscale: 1 -> 3" in supervisor.output(), 60, "the scale-out", interval=0.005)
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 0, supervisor.output()
        assert worker_children(supervisor.pid) == []

        archived = db.archived()
        live = db.live()
        assert {r.state for r in archived} <= {"completed"}
        # Nothing is lost and nothing is left leased: what did not run is ready again at once.
        assert {r.id for r in archived} | {r.id for r in live} == ids
        assert {(r.state, r.lease_expires_at) for r in live} <= {("pending", None)}
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def test_a_killed_worker_process_is_restarted_unless_it_was_retiring(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """At 3 processes, one killed with SIGKILL is restarted (autoscaling still wants it). The process a
    scale-in stops (here while its job runs, so that it lingers) is not, even when it is killed."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(postgres_database)
    try:
        producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 0.1})])
        supervisor = procs.start(
            "autoscale",
            worker_argv(
                postgres_database,
                "--queues",
                "slow",
                "--concurrency",
                "2",
                "--prefetch",
                "1",
                "--autoscale",
                "1:3",
                "--scale-steps",
                "1:2",
                *FAST,
                # Long enough for the kill, the restart and the busy-making below on a loaded machine: the first
                # scale-in must come after them.
                "--scale-in-cooldown",
                "30",
                "--graceful-timeout",
                "90",
            ),
            env={"E2E_RUN_LOG": str(run_log)},
        )
        wait_until(lambda: count_is(supervisor.pid, 3), 60, "three worker processes", interval=0.02)
        wait_until(lambda: "(slot 2)" in supervisor.output(), 10, "the supervisor's log of its slots")
        started = dict(
            (int(slot), int(pid))
            for pid, slot in re.findall(r"autoscale: started worker process (\d+) \(slot (\d+)\)", supervisor.output())
        )
        assert set(started) == {1, 2}, supervisor.output()
        # Wait for every worker to be up (its start line), then kill the one in slot 1.
        wait_until(lambda: supervisor.output().count(": queues slow,") >= 3, 60, "three workers up")
        os.kill(started[1], signal.SIGKILL)
        wait_until(
            lambda: f"worker process {started[1]} exited with -9; restarting it" in supervisor.output(), 30, "restart"
        )
        wait_until(lambda: count_is(supervisor.pid, 3), 30, "three worker processes again", interval=0.02)
        wait_until(lambda: supervisor.output().count(": queues slow,") >= 4, 60, "the replacement up")

        # Make every process busy with one long job (each alone awake while it takes its own), so that the scale-in
        # (the jobs in flight fit one process fewer at 2 slots each) finds no idle process to stop instead and stops
        # the newest slot's (2) while its job runs.
        newest = started[2]
        longs: dict[int, UUID] = {}
        for pid in sorted(worker_children(supervisor.pid), key=lambda p: p == newest):
            others = [p for p in worker_children(supervisor.pid) if p != pid]
            for other in others:
                os.kill(other, signal.SIGSTOP)
            try:
                job = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": LONG})])[0].id
                wait_until(lambda j=job: starts_of(run_log, j), 30, "a long job")
            finally:
                for other in others:
                    os.kill(other, signal.SIGCONT)
            assert starts_of(run_log, job) == [pid]
            longs[pid] = job
        long_job = longs[newest]

        retiring = f"autoscale: stopping worker process {newest} gracefully"
        wait_until(lambda: retiring in supervisor.output(), 90, "the scale-in", interval=0.02)
        assert "autoscale: 3 -> 2 worker processes" in supervisor.output()
        os.kill(newest, signal.SIGKILL)
        wait_until(
            lambda: f"retiring worker process {newest} ended with signal SIGKILL; not restarted" in supervisor.output(),
            30,
            "the retiring process's death",
        )
        assert count_is(supervisor.pid, 2), worker_children(supervisor.pid)
        assert f"worker process {newest} exited" not in supervisor.output()

        # Its job comes back through lease expiry and runs again elsewhere; SIGTERM then waits for it.
        wait_until(
            lambda: len([f for f in iter_lines(run_log) if f[:2] == ["start", str(long_job)]]) == 2, 60, "the rerun"
        )
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=LONG + 30) == 0, supervisor.output()
        assert [(r.state, r.deliveries) for r in db.archived() if r.id == long_job] == [("completed", 2)]
        assert sorted((r.state, r.deliveries) for r in db.archived() if r.id in longs.values()) == [
            ("completed", 1),
            ("completed", 1),
            ("completed", 2),
        ]
        assert db.live() == []
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def test_a_database_that_does_not_answer_keeps_the_count_and_is_logged_once(
    postgres_database: str, postgres_server_url: str, procs: Procs, tmp_path: Path
) -> None:
    """The load cannot be read (the database refuses every connection): the supervisor keeps its processes, says
    so once for the whole outage, and scales again once the database answers."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    producer.admin.migrate()
    name = postgres_database.rpartition("/")[2].partition("?")[0]
    try:
        supervisor = procs.start(
            "autoscale",
            worker_argv(
                postgres_database, "--queues", "slow", "--concurrency", "1", "--autoscale", "1:2", *FAST,
                "--scale-in-cooldown", "1",
            ),
        )  # fmt: skip
        wait_until(lambda: ": queues slow," in supervisor.output(), 60, "the worker up")
        with psycopg.connect(postgres_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            outage = "autoscale: cannot read the load of the queues ("
            wait_until(lambda: outage in supervisor.output(), 60, "the outage logged")
            # Many intervals (0.2 s) later: still one line, the same processes, the supervisor running.
            before = worker_children(supervisor.pid)
            time.sleep(11)
            assert supervisor.output().count(outage) == 1, supervisor.output()
            assert worker_children(supervisor.pid) == before and len(before) == 1
            assert supervisor.popen.poll() is None
        finally:
            with psycopg.connect(postgres_server_url, autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name)))
        wait_until(lambda: "the load of the queues can be read again" in supervisor.output(), 60, "the recovery")
        producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 1.0}) for _ in range(6)])
        wait_until(lambda: "autoscale: 1 -> 2 worker processes" in supervisor.output(), 60, "a scale-out after it")
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 0, supervisor.output()
        assert "Traceback" not in supervisor.output()
    finally:
        producer.close()


def test_a_scale_out_that_cannot_start_a_process_keeps_the_others(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """The supervisor cannot start a process when it scales out (its file descriptors are exhausted; a fork refused
    for memory or a process limit alike): the running processes go on, the failure is logged once, and the scale-out
    is tried again until it works (before, the supervisor stopped every process and exited 1 with a traceback)."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    producer.admin.migrate()
    db = Db(postgres_database)
    try:
        supervisor = procs.start(
            "autoscale",
            worker_argv(postgres_database, "--queues", "e2e", "--concurrency", "1", "--autoscale", "1:2", *FAST),
            env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "0.2", "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        wait_until(lambda: ": queues e2e," in supervisor.output(), 60, "the worker up")
        first = worker_children(supervisor.pid)
        assert len(first) == 1
        # One descriptor left: a start needs two pipes. The load reader keeps its open connection.
        _, hard = resource.prlimit(supervisor.pid, resource.RLIMIT_NOFILE)
        opened = len(os.listdir(f"/proc/{supervisor.pid}/fd"))
        resource.prlimit(supervisor.pid, resource.RLIMIT_NOFILE, (opened + 1, hard))
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(20)]
        ids = {j.id for j in producer.send_many(messages)}
        refused = "autoscale: cannot start a worker process ("
        wait_until(lambda: refused in supervisor.output(), 60, "the refused start logged")
        time.sleep(1.5)  # several tries later: one line, the first process runs on
        assert supervisor.popen.poll() is None, supervisor.output()
        assert worker_children(supervisor.pid) == first
        assert supervisor.output().count(refused) == 1, supervisor.output()
        resource.prlimit(supervisor.pid, resource.RLIMIT_NOFILE, (hard, hard))
        wait_until(lambda: count_is(supervisor.pid, 2), 60, "the scale-out once the process can start")
        wait_until(lambda: len(db.archived()) == len(ids), 60, "every job completed")
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 0, supervisor.output()
        assert {(r.state, r.deliveries) for r in db.archived()} == {("completed", 1)}
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def test_a_short_job_does_not_wait_behind_a_long_one_in_an_elders_buffer(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """-c 1 --autoscale 1:2, a 20 s job then a 1 s job: the load (two jobs, one slot) starts a second process,
    which must find the short job ready. With the adaptive prefetch the first process leased both, and the short
    one waited 20 s in its buffer while the new process idled."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(postgres_database)
    try:
        long_job = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 20.0})])[0].id
        short_job = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 1.0})])[0].id
        argv = worker_argv(
            postgres_database, "--queues", "slow", "--concurrency", "1", "--autoscale", "1:2", *FAST,
            "--scale-in-cooldown", "60",
        )  # fmt: skip
        supervisor = procs.start("autoscale", argv, env={"E2E_RUN_LOG": str(run_log)})

        def ended(job: UUID) -> list[list[str]]:
            return [f for f in iter_lines(run_log) if f[:2] == ["end", str(job)]]

        wait_until(lambda: [f for f in iter_lines(run_log) if f[:2] == ["start", str(long_job)]], 60, "the long job")
        long_started = time.monotonic()
        wait_until(lambda: ended(short_job), 30, "the short job done")
        assert not ended(long_job), "the short job waited for the long one"
        # It ran in the process the scale-out started, within a few seconds of the long job's start.
        assert time.monotonic() - long_started < 12
        assert "autoscale: 1 -> 2 worker processes" in supervisor.output()
        pids = {f[1]: int(f[4]) for f in iter_lines(run_log) if f[0] == "start"}
        assert pids[str(long_job)] != pids[str(short_job)]
        wait_until(lambda: ended(long_job), 30, "the long job done")
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()
        assert {(r.id, r.state, r.deliveries) for r in db.archived()} == {
            (long_job, "completed", 1),
            (short_job, "completed", 1),
        }
        assert db.live() == []
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigkill_of_the_supervisor_stops_each_worker_process_gracefully_once(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """The kernel's parent-death signal comes once per reparenting: a supervisor with a thread (the load reader)
    that is killed sent SIGTERM twice, the first time while getppid() was still its pid. Each process took it as
    an operator's SIGTERM, then the second as the supervisor's death, or as "second SIGTERM: exiting at once"
    (running handlers dropped); one in its loop's close printed "Exception ignored ... signal wakeup fd"."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(postgres_database)
    try:

        def kill_round(n: int) -> None:
            producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 1.5}) for _ in range(2)])
            supervisor = procs.start(
                f"autoscale{n}",
                worker_argv(postgres_database, "--queues", "slow", "--concurrency", "1", "--autoscale", "2:3", *FAST),
                env={"E2E_RUN_LOG": str(run_log)},
            )
            wait_until(lambda: supervisor.output().count(": queues slow,") >= 2, 60, "two workers up")
            wait_until(lambda: len([f for f in iter_lines(run_log) if f[0] == "start"]) >= 2 * n + 2, 30, "jobs")
            children = worker_children(supervisor.pid)
            supervisor.signal(signal.SIGKILL)
            supervisor.wait(timeout=10)
            wait_until(lambda: not group_alive(supervisor.pid), 30, "the worker processes gone")
            output = supervisor.output()
            assert output.count("is gone: stopping gracefully") == len(children), output
            for wrong in ("SIGTERM: stopping", "exiting at once", "goes on", "Exception ignored", "Traceback"):
                assert wrong not in output, output

        for n in range(3):
            kill_round(n)
        # Every job that started ran to its end (gracefully), none is left leased.
        runs = list(iter_lines(run_log))
        assert len([f for f in runs if f[0] == "start"]) == len([f for f in runs if f[0] == "end"]) == 6
        assert {r.state for r in db.archived()} == {"completed"}
        assert db.live() == []
    finally:
        db.close()
        producer.close()


def test_sigint_to_the_process_group_while_scaling_out_is_one_graceful_stop(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """A terminal's Ctrl-C reaches every process of the group, processes being spawned by a scale-out included:
    the supervisor stops everything gracefully, exits 0, and nothing is lost."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    db = Db(postgres_database)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(JOBS)]
        ids = {j.id for j in producer.send_many(messages)}
        supervisor = procs.start(
            "autoscale",
            worker_argv(postgres_database, "--queues", "e2e", "--concurrency", "2", "--autoscale", "1:3", *FAST),
            env={"E2E_WORK_SLEEP": "0.05", "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        # At once: the new processes are still starting (before, they died of it, and the supervisor exited 1).
        wait_until(lambda: "autoscale: 1 -> 3" in supervisor.output(), 60, "the scale-out", interval=0.005)
        os.killpg(supervisor.pid, signal.SIGINT)
        assert supervisor.wait(timeout=60) == 0, supervisor.output()
        assert worker_children(supervisor.pid) == []
        archived = db.archived()
        live = db.live()
        assert {r.state for r in archived} <= {"completed"}
        assert {r.id for r in archived} | {r.id for r in live} == ids
        assert {(r.state, r.lease_expires_at) for r in live} <= {("pending", None)}
        assert "Traceback" not in supervisor.output()
        assert "KeyboardInterrupt" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def test_sigterm_to_the_process_group_is_one_graceful_stop(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """systemd's default stop (``KillMode=control-group``), ``timeout(1)`` and ``kill -TERM -- -PGID`` send SIGTERM to
    every process at once: each worker process gets it from there and again from its supervisor, which forwards
    the one it got. That is one stop: the running jobs finish and the supervisor exits 0 (before, a process that
    saw the two apart took them for an operator's second SIGTERM, exited at once, and the supervisor exited 1)."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(postgres_database)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(6)]
        ids = {j.id for j in producer.send_many(messages)}
        supervisor = procs.start(
            "autoscale",
            worker_argv(postgres_database, "--queues", "e2e", "--concurrency", "2", "--autoscale", "3:3", *FAST),
            env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "2", "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        # Every process runs jobs: a process that stopped at once would cut them short.
        wait_until(
            lambda: len({f[4] for f in iter_lines(run_log)}) == 3 if run_log.exists() else None,
            60,
            "jobs running in the three processes",
            interval=0.02,
        )
        os.killpg(supervisor.pid, signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 0, supervisor.output()
        assert worker_children(supervisor.pid) == []
        assert "exiting at once" not in supervisor.output()
        archived = db.archived()
        live = db.live()
        assert {r.state for r in archived} <= {"completed"}
        assert {r.id for r in archived} | {r.id for r in live} == ids
        assert {(r.state, r.lease_expires_at) for r in live} <= {("pending", None)}
        runs = Counter(UUID(f[1]) for f in iter_lines(run_log) if f[0] == "run")
        assert {r.id for r in archived} == set(runs)  # each job that started finished
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def test_a_scale_in_stops_an_idle_process_and_not_the_newest_busy_one(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """-c 1 --autoscale 1:2, an 8 s job in the first process and a 25 s one in the process the scale-out started;
    once the short one ends the load asks for one process. The scale-in stopped the newest process, busy, and cut
    its job after the graceful timeout (2 s here): the job ran again once its lease expired. Now the idle process
    goes, and the long job runs once."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(postgres_database)
    try:
        short = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 8.0})])[0].id
        long = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 25.0})])[0].id
        argv = worker_argv(
            postgres_database, "--queues", "slow", "--concurrency", "1", "--autoscale", "1:2", *FAST,
            "--scale-in-cooldown", "0.5", "--graceful-timeout", "2",
        )  # fmt: skip
        supervisor = procs.start("autoscale", argv, env={"E2E_RUN_LOG": str(run_log)})
        wait_until(lambda: len([f for f in iter_lines(run_log) if f[0] == "start"]) == 2, 30, "both jobs running")
        pids = {UUID(f[1]): int(f[4]) for f in iter_lines(run_log) if f[0] == "start"}
        assert pids[long] != pids[short], supervisor.output()
        wait_until(lambda: "autoscale: stopping worker process" in supervisor.output(), 30, "the scale-in")
        output = supervisor.output()
        assert f"autoscale: stopping worker process {pids[short]} gracefully (scale-in, idle;" in output, output
        assert f"stopping worker process {pids[long]}" not in output
        wait_until(lambda: [f for f in iter_lines(run_log) if f[:2] == ["end", str(long)]], 40, "the long job done")
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()
        assert [f[1] for f in iter_lines(run_log) if f[0] == "start"] == [str(short), str(long)] or [
            f[1] for f in iter_lines(run_log) if f[0] == "start"
        ] == [str(long), str(short)]
        assert {(r.id, r.state, r.deliveries) for r in db.archived()} == {
            (short, "completed", 1),
            (long, "completed", 1),
        }
        assert "still running after" not in supervisor.output()
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()


def test_a_second_sigterm_stops_a_retiring_worker_process_at_once(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """A scale-in is stopping a busy process gracefully; SIGTERM to the supervisor stops the others, and a second
    one reaches the retiring process too, which exits at once: the supervisor exits 1 (before: 0), the job it ran
    is not lost (still leased, it comes back when its lease expires). Every process is busy (-c 2, one long job
    each once the short one ends, a load of one process), so the scale-in has no idle process to stop instead."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(postgres_database)
    try:
        short = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 4.0})])[0].id
        longs = {producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 60.0})])[0].id for _ in range(2)}
        argv = worker_argv(
            postgres_database, "--queues", "slow", "--concurrency", "2", "--autoscale", "1:2", *FAST,
            "--scale-in-cooldown", "0.5", "--graceful-timeout", "90",
        )  # fmt: skip
        supervisor = procs.start("autoscale", argv, env={"E2E_RUN_LOG": str(run_log)})
        wait_until(lambda: len([f for f in iter_lines(run_log) if f[0] == "start"]) == 3, 30, "three jobs running")
        pids = {UUID(f[1]): int(f[4]) for f in iter_lines(run_log) if f[0] == "start"}
        assert len(set(pids.values())) == 2, supervisor.output()  # the scale-out's process took a job too
        busy_retire = re.compile(r"autoscale: stopping worker process (\d+) gracefully \(scale-in, 1 handler running;")
        wait_until(lambda: busy_retire.search(supervisor.output()), 30, "the scale-in of a busy process")
        found = busy_retire.search(supervisor.output())
        assert found is not None
        retiring = int(found.group(1))
        assert len([j for j in longs if pids[j] == retiring]) == 1, (pids, retiring)
        assert [f for f in iter_lines(run_log) if f[:2] == ["end", str(short)]]
        supervisor.signal(signal.SIGTERM)
        time.sleep(1.0)
        assert supervisor.popen.poll() is None  # it waits for the processes' jobs
        assert retiring in worker_children(supervisor.pid)
        supervisor.signal(signal.SIGTERM)
        code = supervisor.wait(timeout=15)
        assert worker_children(supervisor.pid) == []
        output = supervisor.output()
        assert "second SIGTERM: exiting at once" in output, output
        assert code == 1  # jobs were cut short, as with --processes
        assert "Traceback" not in output
        # The long jobs are still leased by the processes that exited: their leases (2 s) run out, and they are
        # ready again.
        assert {(r.id, r.state) for r in db.live()} == {(j, "processing") for j in longs}
        assert not [f for f in iter_lines(run_log) if f[0] == "end" and UUID(f[1]) in longs]
    finally:
        db.close()
        producer.close()


def test_a_load_read_that_hangs_holds_up_neither_restarts_nor_the_stop(
    postgres_database: str, procs: Procs, tmp_path: Path
) -> None:
    """A session holds a lock the load query needs (queue_counters; idle workers do not touch it): the read hangs.
    The supervisor says so once, still restarts a killed worker process, and stops on SIGTERM."""
    producer = App(postgres_database, migrate=True)
    e2e_app.register(producer)
    producer.admin.migrate()
    lock = psycopg.connect(postgres_database)
    try:
        lock.execute("LOCK TABLE queue_counters IN ACCESS EXCLUSIVE MODE")
        argv = worker_argv(postgres_database, "--queues", "slow", "--concurrency", "1", "--autoscale", "1:2", *FAST)
        supervisor = procs.start("autoscale", argv)
        wait_until(lambda: ": queues slow," in supervisor.output(), 60, "the worker up")
        hung = "autoscale: the load of the queues has not been read for"
        wait_until(lambda: hung in supervisor.output(), 30, "the hung read logged")
        [child] = worker_children(supervisor.pid)
        os.kill(child, signal.SIGKILL)
        restarting = f"worker process {child} exited with -9; restarting it"
        wait_until(lambda: restarting in supervisor.output(), 10, "the restart")
        wait_until(lambda: supervisor.output().count(": queues slow,") == 2, 60, "the new worker up")
        assert supervisor.output().count(hung) == 1
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=20) == 0, supervisor.output()
        assert worker_children(supervisor.pid) == []
        assert "Traceback" not in supervisor.output()
    finally:
        lock.close()
        producer.close()
