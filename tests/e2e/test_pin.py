"""``conveyor worker --pin``: each worker process runs on one CPU (all its threads, those started
before the worker's loops included); under prefork child *i* on the *i*-th CPU the process may use.
Bad values and platforms that cannot pin are one clear error; a refusal at run time is a warning."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from conveyor import App, ConfigurationError, Message
from conveyor.cli import main as conveyor_main
from conveyor.worker import WorkerConfig

from . import e2e_app
from ._support import REPO, Db, Procs, iter_lines, wait_until, worker_argv

ALLOWED = sorted(os.sched_getaffinity(0))


def _send(url: str, n: int) -> set[object]:
    producer = App(url, migrate=True)
    e2e_app.register(producer)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": i}) for i in range(n)]
        return {j.id for j in producer.send_many(messages)}
    finally:
        producer.close()


def _cpus_by_pid(run_log: Path) -> dict[int, set[str]]:
    """pid → the CPU lists its handler threads reported (one entry when all were pinned alike)."""
    found: dict[int, set[str]] = {}
    for fields in iter_lines(run_log):
        found.setdefault(int(fields[4]), set()).add(fields[5])
    return found


def test_prefork_children_each_run_on_a_cpu_of_their_own(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    run_log = tmp_path / "runs.log"
    # Enough work (~4 s for one child alone) that a child started late under load still finds jobs.
    ids = _send(sqlite_url, 400)
    supervisor = procs.start(
        "pinned",
        worker_argv(sqlite_url, "--processes", "2", "--concurrency", "4", "--burst", "--pin"),
        env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "0.04"},
    )
    assert supervisor.wait(timeout=120) == 0, supervisor.output()
    assert {f[1] for f in iter_lines(run_log)} == {str(i) for i in ids}
    by_pid = _cpus_by_pid(run_log)
    assert len(by_pid) == 2, by_pid
    # Every handler thread of a child on that child's one CPU; child i on ALLOWED[i % n].
    assert all(len(lists) == 1 and "," not in next(iter(lists)) for lists in by_pid.values()), by_pid
    used = sorted(int(next(iter(lists))) for lists in by_pid.values())
    assert used == sorted(ALLOWED[i % len(ALLOWED)] for i in range(2)), (used, ALLOWED)
    for cpu in used:
        assert f"worker pinned to CPU {cpu}" in supervisor.output()


def test_one_pinned_process_has_every_thread_on_one_cpu(database_url: str, procs: Procs, tmp_path: Path) -> None:
    """All threads: the event loop's, the handlers', and those the App started before the worker's
    loops (the database pool's), read from /proc while the worker runs."""
    run_log = tmp_path / "runs.log"
    ids = _send(database_url, 50)
    worker = procs.start("pinned", worker_argv(database_url, "--pin"), env={"E2E_RUN_LOG": str(run_log)})
    wait_until(lambda: {f[1] for f in iter_lines(run_log)} >= {str(i) for i in ids}, 60, "every job ran")
    tids = [int(t) for t in os.listdir(f"/proc/{worker.pid}/task")]
    masks = {tid: frozenset(os.sched_getaffinity(tid)) for tid in tids}
    assert len(tids) > 10  # the loop, 10 handler slots, the pool's threads
    assert len(set(masks.values())) == 1 and len(next(iter(masks.values()))) == 1, masks
    (cpu,) = next(iter(masks.values()))
    assert _cpus_by_pid(run_log) == {worker.pid: {str(cpu)}}
    assert re.search(rf"worker pinned to CPU {cpu}\b", worker.output())
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()


def test_unpinned_worker_keeps_every_cpu(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    """Without --pin nothing changes (the check that the tests above can fail)."""
    run_log = tmp_path / "runs.log"
    _send(sqlite_url, 20)
    worker = procs.start("free", worker_argv(sqlite_url, "--burst"), env={"E2E_RUN_LOG": str(run_log)})
    assert worker.wait(timeout=60) == 0, worker.output()
    expected = ",".join(map(str, ALLOWED))
    assert set().union(*_cpus_by_pid(run_log).values()) == {expected}
    assert "pinned" not in worker.output()


@pytest.mark.parametrize(
    ("cpu", "message"),
    [
        (-1, "cpu must be between 0 and 8,191, got -1"),
        (ALLOWED[-1] + 1, f"cpu {ALLOWED[-1] + 1} is not one of the CPUs this process may use ("),
        (4096, "cpu 4096 is not one of the CPUs this process may use ("),
        (10**5000, "cpu must be between 0 and 8,191, got an integer of 16,610 bits"),
        (True, "cpu must be an integer, got True"),
        ("0", "cpu must be an integer, got str '0'"),
        ("x" * 10**6, "cpu must be an integer, got str 'xxxx"),
        (0.0, "cpu must be an integer, got float 0.0"),
        ([0], "cpu must be an integer, got list [0]"),
    ],
    ids=["negative", "past-the-last", "4096", "10**5000", "bool", "str", "huge-str", "float", "list"],
)
def test_a_cpu_the_process_cannot_use_is_refused(cpu: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        WorkerConfig(cpu=cpu)  # type: ignore[arg-type]
    assert str(refused.value).startswith(message) and len(str(refused.value)) < 200, str(refused.value)[:300]


def test_an_integer_like_cpu_is_taken_as_an_int() -> None:
    class NumpyLikeInt:  # numpy.int64 and friends: integers through __index__
        def __index__(self) -> int:
            return ALLOWED[0]

    cpu = WorkerConfig(cpu=NumpyLikeInt()).cpu  # type: ignore[arg-type]
    assert cpu == ALLOWED[0] and type(cpu) is int


def test_each_allowed_cpu_is_accepted() -> None:
    assert [WorkerConfig(cpu=c).cpu for c in ALLOWED] == ALLOWED


def test_a_platform_without_affinity_refuses_pinning_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sqlite_url: str
) -> None:
    monkeypatch.delattr(os, "sched_setaffinity")
    with pytest.raises(ConfigurationError, match="needs Linux"):
        WorkerConfig(cpu=0)
    monkeypatch.chdir(REPO)
    for processes in ("1", "3"):
        code = conveyor_main(["--db", sqlite_url, "worker", "tests.e2e.e2e_app:app", "--pin", "-p", processes])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1, (code, err)
        assert err.startswith("conveyor: error: pinning to a CPU needs Linux"), err


def test_a_refused_pin_is_a_warning_and_the_process_runs_unpinned() -> None:
    """A CPU gone offline, a cpuset changed under the process: pinning is a hint about speed."""
    script = (
        "import logging, os; logging.basicConfig(format='%(levelname)s %(message)s');"
        "from conveyor.worker import _cpu; before = os.sched_getaffinity(0); _cpu.pin(100000);"
        "print(os.sched_getaffinity(0) == before)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "True", done
    assert re.fullmatch(r"WARNING cannot pin this worker to CPU 100000 \(.+\); running unpinned\n", done.stderr)


def test_pinned_cpus_round_robin_over_more_processes_than_cpus() -> None:
    from conveyor.worker import _cpu

    n = len(ALLOWED) * 2 + 1
    assert _cpu.spread(n) == [ALLOWED[i % len(ALLOWED)] for i in range(n)]
    assert _cpu.spread(1)[0] in ALLOWED
    assert _cpu._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def _affinities() -> dict[int, set[int]]:
    found = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            found[int(tid)] = os.sched_getaffinity(int(tid))
    return found


@contextlib.contextmanager
def _restored_afterwards() -> Iterator[set[int]]:
    """The test process's CPUs, given back to every thread afterwards whatever the test did."""
    before = os.sched_getaffinity(0)
    try:
        yield before
    finally:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), before)


def test_an_in_process_worker_pins_every_thread_while_it_runs_and_gives_them_back(database_url: str) -> None:
    """``Worker(cpu=...)`` after the App was used: threads started before the worker (the App's pool,
    the program's own) run on the CPU while it runs, and on their own CPUs again once it stops."""
    from conveyor.worker import Worker

    app = App(database_url, migrate=True)
    e2e_app.register(app)
    db = Db(database_url)
    release = threading.Event()
    bystander = threading.Thread(target=release.wait, daemon=True)
    bystander.start()
    seen: list[set[int]] = []

    @app.task(name="pin.probe", queue="pinprobe")
    def probe() -> None:
        seen.append(os.sched_getaffinity(bystander.native_id or 0))

    with _restored_afterwards() as before:
        try:
            ids = {
                j.id
                for j in app.send_many([Message(task=e2e_app.WORK, payload={"kind": "ok", "n": i}) for i in range(40)])
            }
            probe.delay()
            worker = Worker(app, [e2e_app.WORK_QUEUE, "pinprobe"], burst=True, cpu=ALLOWED[-1], concurrency=4)
            assert worker.run_sync(install_signals=False) == 0
            assert seen == [{ALLOWED[-1]}]
            assert set(map(frozenset, _affinities().values())) == {frozenset(before)}
            assert {(r.state, r.attempts) for r in db.archived() if r.id in ids} == {("completed", 1)}
            # And a worker pinned elsewhere afterwards may (the CPU it checks against is the process's again).
            other = Worker(app, ["pinprobe"], burst=True, cpu=ALLOWED[0])
            assert other.run_sync(install_signals=False) == 0
        finally:
            release.set()
            db.close()
            app.close()


def test_in_process_workers_share_one_cpu_or_the_second_is_refused(database_url: str) -> None:
    from conveyor.worker import Worker

    app = App(database_url, migrate=True)

    @app.task(name="pin.slow", queue="pinslow")
    def slow() -> None:
        time.sleep(2.0)

    with _restored_afterwards() as before:
        try:
            slow.delay()
            first = Worker(app, ["pinslow"], burst=True, cpu=ALLOWED[0], concurrency=1)
            codes: list[int] = []
            runner = threading.Thread(target=lambda: codes.append(first.run_sync(install_signals=False)))
            runner.start()
            wait_until(lambda: os.sched_getaffinity(0) == {ALLOWED[0]}, 10, "the first worker pinned")
            if len(ALLOWED) > 1:
                second = Worker(app, ["pinidle"], burst=True, cpu=ALLOWED[1])
                with pytest.raises(ConfigurationError, match=rf"already runs a worker pinned to CPU {ALLOWED[0]}"):
                    second.run_sync(install_signals=False)
            alike = Worker(app, ["pinidle"], burst=True, cpu=ALLOWED[0])  # an empty queue: done at once
            assert alike.run_sync(install_signals=False) == 0
            assert runner.is_alive() and os.sched_getaffinity(0) == {ALLOWED[0]}  # still the first's
            runner.join(30)
            assert codes == [0]
            assert os.sched_getaffinity(0) == before
        finally:
            app.close()


def test_a_pin_refused_halfway_is_undone(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A refusal on the third thread: the two pinned before it get their CPUs back, as the warning says."""
    from conveyor.worker import _cpu

    real = os.sched_setaffinity
    calls = [0]

    def refuse_third(tid: int, mask: Iterable[int]) -> None:
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(22, "Invalid argument")
        real(tid, mask)

    releases = [threading.Event() for _ in range(4)]
    threads = [threading.Thread(target=e.wait, daemon=True) for e in releases]
    for t in threads:
        t.start()
    with _restored_afterwards() as before:
        try:
            monkeypatch.setattr(os, "sched_setaffinity", refuse_third)
            with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
                unpin = _cpu.pin(ALLOWED[-1])
            monkeypatch.undo()
            assert calls[0] > 3  # the two pinned were given back
            assert set(map(frozenset, _affinities().values())) == {frozenset(before)}
            assert "cannot pin this worker to CPU" in caplog.text and "running unpinned" in caplog.text
            unpin()  # nothing to give back
            assert _cpu._pinned == []
        finally:
            for e in releases:
                e.set()


def test_a_supervisor_whose_cpus_shrank_restarts_its_child_unpinned(sqlite_url: str, procs: Procs) -> None:
    """Before: the restart raised in the supervisor, which stopped supervising and hung (waiting for
    the other child at exit)."""
    if len(ALLOWED) < 2:  # the README's test command on a 1-CPU host; CI (.ci/run) has 2 CPUs and must run it
        if os.environ.get("CONVEYOR_CI"):
            pytest.fail("CI needs two CPUs for this test (one is taken away)")
        pytest.skip("needs two CPUs to take one away")
    _send(sqlite_url, 1)
    supervisor = procs.start("pinned", worker_argv(sqlite_url, "--pin", "-p", "2"))
    wait_until(lambda: supervisor.output().count("worker pinned to CPU") >= 2, 60, "both children pinned")
    children = [int(c) for c in Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children").read_text().split()]
    on_second = [c for c in children if os.sched_getaffinity(c) == {ALLOWED[1]}]
    assert len(on_second) == 1, children
    os.sched_setaffinity(supervisor.pid, {ALLOWED[0]})  # a cpuset shrunk under it
    os.kill(on_second[0], signal.SIGKILL)
    wait_until(lambda: "starts unpinned" in supervisor.output(), 30, "the restart")
    wait_until(lambda: supervisor.output().count("INFO conveyor.worker: worker ") >= 3, 30, "the new child's start")
    os.kill(supervisor.pid, signal.SIGTERM)
    assert supervisor.wait(timeout=60) in (0, 1), supervisor.output()
    assert "Traceback" not in supervisor.output()
