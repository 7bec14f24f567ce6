"""Handlers that reach past their job into the worker's process, in a real ``conveyor worker``: one
that forks and comes back into the worker in the child, one that has the event loop stopped from a
thread of its own. Each harms only its own job (or none); the worker goes on and exits 0."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path
from uuid import UUID

import psycopg
import pytest

from conveyor import App

from ._support import REPO, Proc, Procs, conveyor_argv, iter_lines, wait_until

#: The app the worker runs, written to the test's directory (importable through PYTHONPATH).
APP = textwrap.dedent(
    '''
    import asyncio
    import atexit
    import os
    import signal
    import sys
    import threading
    import time

    from conveyor import App, JobContext

    LOG = os.environ["HOSTILE_RUN_LOG"]
    app = App()


    def note(*words):
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (" ".join(map(str, words)) + "\\n").encode())
        finally:
            os.close(fd)


    atexit.register(lambda: note("atexit", os.getpid()))


    def exited(pid):
        """The child's exit code, or "alive" if it still runs after 10 s (it is then killed)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "alive"


    def in_child(how, ctx):
        note("child", ctx.job_id, os.getpid())
        if how == "raise":
            raise ValueError("raised in the child")
        if how == "exit":
            sys.exit(3)
        return "child"


    @app.task(queue="q", name="fork_def", max_attempts=1)
    def fork_def(how: str, ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        if how == "in a thread":
            forked = []

            def fork():
                pid = os.fork()
                if pid == 0:
                    note("child", ctx.job_id, os.getpid())
                    return  # the child's only thread ends, and the child with it
                forked.append(pid)

            thread = threading.Thread(target=fork)
            thread.start()
            thread.join()
            pid = forked[0]
        else:
            pid = os.fork()
            if pid == 0:
                return in_child(how, ctx)
        note("exit", ctx.job_id, exited(pid))
        return "parent"


    async def forks(how, ctx):
        note("run", ctx.job_id, os.getpid())
        pid = os.fork()
        if pid == 0:
            if how == "await":
                await asyncio.sleep(0.5)  # the worker's loops run in the child meanwhile
            return in_child(how, ctx)
        # The loop is blocked while the child runs: the child's whole life is this job's.
        note("exit", ctx.job_id, exited(pid))
        return "parent"


    @app.task(queue="q", name="fork_async", max_attempts=1)
    async def fork_async(how: str, ctx: JobContext) -> str:
        return await forks(how, ctx)


    @app.task(queue="q", name="fork_async_timeout", max_attempts=1, timeout=30)
    async def fork_async_timeout(how: str, ctx: JobContext) -> str:
        return await forks(how, ctx)


    TICKING = [True]


    @app.task(queue="q", name="ticks")
    async def ticks(ctx: JobContext) -> str:
        """Runs a step at every turn of the loop until fork_yields is done; notes a step run elsewhere."""
        note("run", ctx.job_id, os.getpid())
        me = os.getpid()
        while TICKING[0]:
            if os.getpid() != me:
                note("tick-in-child", ctx.job_id, os.getpid())
            await asyncio.sleep(0)
        return "ticked"


    @app.task(queue="q", name="fork_yields", max_attempts=1)
    async def fork_yields(ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        await asyncio.sleep(0.2)  # the ticks job runs meanwhile, in the other slot
        pid = os.fork()
        if pid == 0:
            await asyncio.sleep(0)  # one turn of the loop, in the child
            return in_child("return", ctx)
        note("exit", ctx.job_id, exited(pid))
        TICKING[0] = False
        return "parent"


    @app.task(queue="q", name="stops_the_loop", max_attempts=1)
    async def stops_the_loop(ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        loop = asyncio.get_running_loop()
        # From a thread: its context is not the handler's, so nothing tells whose stop this is.
        threading.Thread(target=lambda: loop.call_soon_threadsafe(loop.stop)).start()
        await asyncio.sleep(0.2)
        return "went on"


    @app.task(queue="q", name="terminates_its_child_at_once", max_attempts=1)
    async def terminates_its_child_at_once(ctx: JobContext) -> str:
        # As multiprocessing's Pool.__exit__ does: its workers get their SIGTERM as soon as they exist.
        pid = os.fork()
        if pid == 0:
            time.sleep(3)
            os._exit(0)
        os.kill(pid, signal.SIGTERM)
        return f"child exit {exited(pid)}"

    @app.task(queue="q", name="hangs_up_its_child", max_attempts=1)
    async def hangs_up_its_child(ctx: JobContext) -> str:
        pid = os.fork()
        if pid == 0:
            time.sleep(10)
            os._exit(0)
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGHUP)
        return f"child exit {exited(pid)}"

    @app.task(queue="q", name="terminates_its_child", max_attempts=1)
    async def terminates_its_child(ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        pid = os.fork()
        if pid == 0:
            time.sleep(10)
            os._exit(0)
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGTERM)
        return f"child exit {exited(pid)}"


    async def cancels_all(ctx):
        note("run", ctx.job_id, os.getpid())
        await asyncio.sleep(0.3)  # the job sent before it runs in the other slot meanwhile
        for task in asyncio.all_tasks():
            task.cancel()
        await asyncio.sleep(0.2)
        return "went on"


    @app.task(queue="q", name="cancels_all_tasks", max_attempts=1)
    async def cancels_all_tasks(ctx: JobContext) -> str:
        return await cancels_all(ctx)


    @app.task(queue="q", name="cancels_all_tasks_timeout", max_attempts=1, timeout=30)
    async def cancels_all_tasks_timeout(ctx: JobContext) -> str:
        return await cancels_all(ctx)


    @app.task(queue="q", name="ignores_sigterm", max_attempts=1)
    async def ignores_sigterm(how: str, ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        signal.signal(signal.SIGTERM, signal.SIG_IGN if how == "ignore" else signal.SIG_DFL)
        return "went on"


    def alarm_raises(signum, frame):
        raise TimeoutError("the handler's alarm")


    @app.task(queue="q", name="leaves_an_alarm", max_attempts=1)
    async def leaves_an_alarm(how: str, ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        if how == "own handler, cancelled":  # a timeout done by hand, its handler left installed
            signal.signal(signal.SIGALRM, alarm_raises)
            signal.alarm(5)
            signal.alarm(0)
            return "went on"
        if how == "own handler":
            signal.signal(signal.SIGALRM, alarm_raises)
        signal.alarm(1)
        return "went on"


    @app.task(queue="q", name="leaves_an_alarm_def", max_attempts=1)
    def leaves_an_alarm_def(how: str, ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        signal.alarm(1)  # works from any thread
        return "went on"


    @app.task(queue="q", name="closes_a_stream", max_attempts=1)
    async def closes_a_stream(how: str, ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        (sys.stderr if how == "stderr" else sys.stdout).close()
        return "went on"


    @app.task(queue="q", name="lowers_the_recursion_limit", max_attempts=1)
    async def lowers_the_recursion_limit(ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        sys.setrecursionlimit(30)  # above this frame's depth, below the worker's loops'
        return "went on"


    @app.task(queue="q", name="lowers_the_recursion_limit_def", max_attempts=1)
    def lowers_the_recursion_limit_def(ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        sys.setrecursionlimit(30)
        return "went on"


    @app.task(queue="q", name="leaks_files", max_attempts=1)
    async def leaks_files(ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        leaked = []
        try:
            while True:
                leaked.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        os.close(leaked.pop())
        note("leaked", ctx.job_id, len(leaked))  # the test ends the worker's connections now
        await asyncio.sleep(8)  # every descriptor of the process taken meanwhile (past a 5 s pool wait)
        for fd in leaked:
            os.close(fd)
        return "gave them back"


    @app.task(queue="q", name="quiet")
    async def quiet(i: int) -> int:
        return i  # no file of its own: it can run while another handler holds every descriptor


    @app.task(queue="q", name="fails")
    async def fails(ctx: JobContext) -> str:
        raise ValueError("a permanent failure: the worker logs a line for it")


    @app.task(queue="q", name="slow")
    async def slow(ctx: JobContext) -> str:
        note("run", ctx.job_id, os.getpid())
        await asyncio.sleep(1)
        return "slept"


    @app.task(queue="q", name="good")
    async def good(i: int, ctx: JobContext) -> int:
        note("run", ctx.job_id, os.getpid())
        await asyncio.sleep(0.01)
        return i
    '''
)

FORKS = [
    ("fork_def", "return", 0),
    ("fork_def", "raise", 1),
    ("fork_def", "exit", 3),
    ("fork_def", "in a thread", 0),
    ("fork_async", "return", 0),
    ("fork_async", "raise", 1),
    ("fork_async", "exit", 3),
    ("fork_async", "await", None),  # 0 (back after its sleep) or 1 (a worker loop reached the database first)
    ("fork_async_timeout", "return", 0),
    ("fork_async_timeout", "raise", 1),
    ("fork_async_timeout", "exit", 3),
    ("fork_async_timeout", "await", None),
]


def _path(tmp_path: Path) -> str:
    """PYTHONPATH for a worker of the app in ``tmp_path``: with this checkout's ``src`` before it, so that
    the worker runs the code under test, not the Conveyor the interpreter has installed."""
    return os.pathsep.join([str(tmp_path), str(REPO / "src")])


def _start(url: str, procs: Procs, tmp_path: Path, *options: str, log: Path | None = None) -> Proc:
    """``conveyor -v worker`` of the hostile app (written to ``tmp_path``), its handlers noting their runs in
    ``log`` (default: ``tmp_path / "runs.log"``)."""
    (tmp_path / "hostile_app.py").write_text(APP)
    return procs.start(
        "worker",
        conveyor_argv(url, "-v", "worker", "hostile_app:app", *options),
        env={"HOSTILE_RUN_LOG": str(log or tmp_path / "runs.log"), "PYTHONPATH": _path(tmp_path)},
    )


def _worker(url: str, procs: Procs, tmp_path: Path, log: Path, *options: str) -> int:
    worker = _start(url, procs, tmp_path, "--burst", "--concurrency", "2", "--prefetch", "10", *options, log=log)
    return worker.wait(timeout=60)


def test_a_forked_child_that_comes_back_into_the_worker_exits_at_once(
    database_url: str, procs: Procs, tmp_path: Path
) -> None:
    # Before: the child went on as a second worker on the parent's leases (App reopens its
    # connections in a forked child): it ran and acked other jobs, so jobs ran 3-4 times, and its
    # atexit handlers ran when it ended.
    producer = App(database_url, migrate=True)
    try:
        hostile = {
            producer.send(task, {"how": how}, queue="q", max_attempts=1).id: (task, how, code)
            for task, how, code in FORKS
        }
        goods = [producer.send("good", {"i": i}, queue="q").id for i in range(20)]
    finally:
        producer.close()
    log = tmp_path / "runs.log"

    assert _worker(database_url, procs, tmp_path, log) == 0

    lines = list(iter_lines(log))
    runs = [(UUID(job), int(pid)) for event, job, pid in (line for line in lines if line[0] == "run")]
    worker_pids = {pid for _, pid in runs}
    assert len(worker_pids) == 1, lines  # every job ran in the worker itself, none in a child
    assert sorted(job for job, _ in runs) == sorted([*hostile, *goods])  # each once
    children = {UUID(line[1]): int(line[2]) for line in lines if line[0] == "child"}
    # (a child that awaited may have been ended before it noted anything: its loop ran the worker's)
    assert {job for job, (_, how, _) in hostile.items() if how != "await"} <= set(children) <= set(hostile)
    assert not set(children.values()) & worker_pids
    exits = {UUID(line[1]): line[2] for line in lines if line[0] == "exit"}
    for job, (task, how, code) in hostile.items():
        if code is None:
            assert exits[job] in ("0", "1"), (task, how, exits[job])
        else:
            assert exits[job] == str(code), (task, how, exits[job])
    # The parent's atexit handlers ran in the worker only, never in a child.
    assert [int(line[1]) for line in lines if line[0] == "atexit"] == sorted(worker_pids)

    db = App(database_url)
    try:
        for job in hostile:
            status = db.job(job)
            assert (status.state, status.result, status.deliveries) == ("completed", "parent", 1), hostile[job]
        assert [(db.job(g).state, db.job(g).result) for g in goods] == [("completed", i) for i in range(20)]
    finally:
        db.close()


def _one_among_good_jobs(
    url: str, task: str, before: str | None = None, payload: dict[str, str] | None = None
) -> tuple[UUID, list[UUID]]:
    """One job of ``task`` (one attempt, ``payload``), then 20 of ``good``: the id of the one and of the
    good ones (``before``: a job of that task first, among the good ones)."""
    producer = App(url, migrate=True)
    try:
        first = [producer.send(before, {}, queue="q").id] if before else []
        one = producer.send(task, payload or {}, queue="q", max_attempts=1).id
        return one, first + [producer.send("good", {"i": i}, queue="q").id for i in range(20)]
    finally:
        producer.close()


def test_a_stop_of_the_event_loop_the_worker_cannot_trace_to_a_handler_is_resumed(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    # A stop scheduled from a thread the handler started carries no trace of the handler: the worker
    # cannot fail its job, but it runs the loop again. Before: asyncio.run ended ("Event loop stopped
    # before Future completed"), every task cancelled, the worker exited 1 with jobs left to their leases.
    stopper, goods = _one_among_good_jobs(sqlite_url, "stops_the_loop")
    log = tmp_path / "runs.log"

    assert _worker(sqlite_url, procs, tmp_path, log) == 0

    assert "the event loop was stopped (loop.stop()) while the worker ran; running it again" in procs.outputs()
    db = App(sqlite_url)
    try:
        assert (db.job(stopper).state, db.job(stopper).result) == ("completed", "went on")
        assert [(db.job(g).state, db.job(g).result, db.job(g).deliveries) for g in goods] == [
            ("completed", i, 1) for i in range(20)
        ]
    finally:
        db.close()


def _runs_with_its_child_terminated(
    sqlite_url: str, procs: Procs, tmp_path: Path, terminates: UUID, goods: list[UUID]
) -> None:
    """A worker drains the jobs; the one whose handler SIGTERMs its child sees the child end by it (-15),
    the worker takes no SIGTERM for its own, and the good jobs complete."""
    assert _worker(sqlite_url, procs, tmp_path, tmp_path / "runs.log") == 0

    assert "SIGTERM" not in procs.outputs()
    db = App(sqlite_url)
    try:
        assert (db.job(terminates).state, db.job(terminates).result) == ("completed", "child exit -15")
        assert [(db.job(g).state, db.job(g).result) for g in goods] == [("completed", i) for i in range(20)]
    finally:
        db.close()


def test_a_signal_to_a_child_a_handler_forked_is_the_childs_not_the_workers(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    # The child shares its parent loop's signal wake-up socket. Before: the SIGTERM the handler sent
    # its child was read by the worker's loop as its own (it stopped, handing its prefetched jobs
    # back), and the child, with the loop's no-op handler, ignored it.
    terminates, goods = _one_among_good_jobs(sqlite_url, "terminates_its_child")

    _runs_with_its_child_terminated(sqlite_url, procs, tmp_path, terminates, goods)


def test_a_hang_up_a_supervised_worker_s_handler_sends_its_child_is_the_childs(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    # A supervised worker process handles SIGHUP (its supervisor's death notice). Before: a child its handler
    # forked kept that handler, so the SIGHUP the handler sent it went to the worker's wake-up socket (the worker
    # stopped as if orphaned, and was restarted) while the child lived on ("child exit 0" after 10 s).
    hangs_up, goods = _one_among_good_jobs(sqlite_url, "hangs_up_its_child")

    assert _worker(sqlite_url, procs, tmp_path, tmp_path / "runs.log", "--processes", "2") == 0

    assert "is gone" not in procs.outputs()
    db = App(sqlite_url)
    try:
        assert (db.job(hangs_up).state, db.job(hangs_up).result) == ("completed", f"child exit -{signal.SIGHUP}")
        assert [(db.job(g).state, db.job(g).result) for g in goods] == [("completed", i) for i in range(20)]
    finally:
        db.close()


def test_a_signal_to_a_child_before_its_at_fork_hooks_have_run_is_the_childs(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    # Found with a fork-context multiprocessing.Pool in async handlers of `conveyor worker -p 2`: one
    # Pool.__exit__ waited for ever (py-spy: Pool._terminate_pool joining a worker; the worker alive in
    # SimpleQueue.get). Its SIGTERM had landed before the child's at-fork hook gave it the default
    # disposition, so the loop's no-op handler took it (and wrote it to the worker's wake-up socket).
    # The worker's signals are now blocked across the fork. A sitecustomize makes the window wide:
    # an at-fork hook registered before conveyor's, so run before its own, sleeps in every child.
    (tmp_path / "sitecustomize.py").write_text(
        "import os, time\nos.register_at_fork(after_in_child=lambda: time.sleep(0.5))\n"
    )
    terminates, goods = _one_among_good_jobs(sqlite_url, "terminates_its_child_at_once")

    _runs_with_its_child_terminated(sqlite_url, procs, tmp_path, terminates, goods)


@pytest.mark.parametrize("task", ["cancels_all_tasks", "cancels_all_tasks_timeout"])
def test_a_handler_that_cancels_every_task_fails_only_its_own_job(
    sqlite_url: str, procs: Procs, tmp_path: Path, task: str
) -> None:
    # ``for t in asyncio.all_tasks(): t.cancel()``: the worker's own tasks (its loops, the slots that
    # run the other handlers) are not the handler's to cancel. Before: the worker's loops ended
    # cancelled and the worker with them (a traceback, exit 1), the job running beside it cut short,
    # every job it held left to its lease.
    hostile, (slow, *goods) = _one_among_good_jobs(sqlite_url, task, before="slow")

    assert _worker(sqlite_url, procs, tmp_path, tmp_path / "runs.log") == 0

    assert procs.outputs().count("cancelled tasks of the worker's own") == 1
    db = App(sqlite_url)
    try:
        status = db.job(hostile)
        assert status.state == "dead"
        assert status.error is not None
        assert (status.error.type, status.error.message) == (
            "RuntimeError",
            "the handler cancelled tasks of the worker's own (its loops, the other handlers): refused",
        )
        assert (db.job(slow).state, db.job(slow).result, db.job(slow).deliveries) == ("completed", "slept", 1)
        assert [(db.job(g).state, db.job(g).result, db.job(g).deliveries) for g in goods] == [
            ("completed", i, 1) for i in range(20)
        ]
    finally:
        db.close()


def test_a_forked_child_whose_handler_yields_runs_no_callback_of_the_worker_or_other_handlers(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    # The child's loop is a copy of the worker's, with its ready callbacks. Before: a child whose
    # handler yielded (``await asyncio.sleep(0)``) ran them, the worker's loops and the other handlers'
    # steps (here the ticks job noted a step in the child), until one reached the database.
    forks, (ticks, *goods) = _one_among_good_jobs(sqlite_url, "fork_yields", before="ticks")
    log = tmp_path / "runs.log"

    assert _worker(sqlite_url, procs, tmp_path, log) == 0

    lines = list(iter_lines(log))
    assert [line for line in lines if line[0] == "tick-in-child"] == []
    # The first callback in the child's loop is the ticks job's: the child leaves there, exit 1.
    assert [line[2] for line in lines if line[0] == "exit"] == ["1"]
    assert "its loop came to a callback of the worker's or another handler's" in procs.outputs()
    db = App(sqlite_url)
    try:
        assert [(db.job(j).state, db.job(j).result) for j in (forks, ticks)] == [
            ("completed", "parent"),
            ("completed", "ticked"),
        ]
        assert [(db.job(g).state, db.job(g).result) for g in goods] == [("completed", i) for i in range(20)]
    finally:
        db.close()


@pytest.mark.parametrize("how", ["ignore", "default"])
def test_a_handler_that_replaces_the_workers_sigterm_handler_fails_and_the_worker_still_stops_gracefully(
    sqlite_url: str, procs: Procs, tmp_path: Path, how: str
) -> None:
    # ``signal.signal(SIGTERM, SIG_IGN)`` in an ``async def`` handler (the loop's thread, where it works).
    # Before: the job completed and the worker ignored every SIGTERM after it (only SIGKILL stopped it);
    # with SIG_DFL the next SIGTERM killed it (-15) with its running job left to its lease.
    replaces, goods = _one_among_good_jobs(sqlite_url, "ignores_sigterm", payload={"how": how})
    worker = _start(sqlite_url, procs, tmp_path, "--concurrency", "1")
    db = App(sqlite_url)
    try:
        wait_until(lambda: db.job(goods[-1]).state == "completed", 15, "the jobs after it to run")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=10) == 0, procs.outputs()
        assert "replaced the worker's SIGTERM handler: put back" in procs.outputs()
        status = db.job(replaces)
        assert status.state == "dead" and status.error is not None, status
        assert status.error.type == "RuntimeError" and "(signal.signal)" in status.error.message, status
        assert [(db.job(g).state, db.job(g).result) for g in goods] == [("completed", i) for i in range(20)]
    finally:
        db.close()


@pytest.mark.parametrize(
    ("task", "how"),
    [
        ("leaves_an_alarm", "default"),
        ("leaves_an_alarm_def", "default"),
        ("leaves_an_alarm", "own handler"),
        ("leaves_an_alarm", "own handler, cancelled"),
    ],
)
def test_an_alarm_a_handler_leaves_armed_ends_neither_the_worker_nor_other_jobs(
    sqlite_url: str, procs: Procs, tmp_path: Path, task: str, how: str
) -> None:
    # signal.alarm() left armed after the handler returned: with SIGALRM's default action the alarm killed
    # the worker process (-14) with its other jobs; with the handler's own SIGALRM handler, its exception
    # was raised wherever the event loop was, and the worker crashed (exit 1).
    alarm, goods = _one_among_good_jobs(sqlite_url, task, before="slow", payload={"how": how})
    worker = _start(sqlite_url, procs, tmp_path, "--concurrency", "2")
    db = App(sqlite_url)
    went_off = "SIGALRM: an alarm went off that nothing in the worker waits for"
    try:
        wait_until(lambda: db.job(goods[-1]).state == "completed", 15, "the jobs after it to run")
        if how == "default":
            wait_until(lambda: went_off in procs.outputs(), 10, "the alarm to go off")
        else:
            time.sleep(1.5)  # past the alarm's second, had it been left armed
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=10) == 0, procs.outputs()
        status = db.job(alarm)
        if how == "own handler":
            assert (
                "replaced the worker's SIGALRM handler: put back; it left an alarm armed: cancelled" in procs.outputs()
            )
            assert status.state == "dead" and status.error is not None and status.error.type == "RuntimeError"
        else:
            assert (status.state, status.result) == ("completed", "went on"), status
            assert "replaced the worker's" not in procs.outputs()
        assert (went_off in procs.outputs()) == (how == "default")
        assert [(db.job(g).state, db.job(g).result) for g in goods[1:]] == [("completed", i) for i in range(20)]
    finally:
        db.close()


@pytest.mark.parametrize("how", ["stderr", "stdout"])
def test_a_handler_that_closes_a_standard_stream_stops_no_log_line_and_no_worker(
    sqlite_url: str, procs: Procs, tmp_path: Path, how: str
) -> None:
    # sys.stderr.close() in a handler: every log line of the worker's raised ValueError after it (logging
    # reports a failed write on sys.stderr again), its loops ended on their own lines, and the burst
    # worker never stopped (killed here after 60 s). The lines now go to file descriptor 2.
    closer, goods = _one_among_good_jobs(sqlite_url, "closes_a_stream", payload={"how": how})
    producer = App(sqlite_url)
    try:
        failing = producer.send("fails", {}, queue="q", max_attempts=1).id
    finally:
        producer.close()

    assert _worker(sqlite_url, procs, tmp_path, tmp_path / "runs.log") == 0, procs.outputs()

    out = procs.outputs()
    assert "burst: queues q drained" in out and "ValueError('I/O operation on closed file.')" not in out, out
    db = App(sqlite_url)
    try:
        assert (db.job(closer).state, db.job(failing).state) == ("completed", "dead")
        assert [(db.job(g).state, db.job(g).result) for g in goods] == [("completed", i) for i in range(20)]
    finally:
        db.close()


@pytest.mark.parametrize("task", ["lowers_the_recursion_limit", "lowers_the_recursion_limit_def"])
def test_a_recursion_limit_a_handler_lowered_is_put_back_and_fails_its_attempt(
    sqlite_url: str, procs: Procs, tmp_path: Path, task: str
) -> None:
    # sys.setrecursionlimit is the whole process's, and the worker's loops run deeper than a handler's
    # first frame. Before: with the limit at 30 the worker's code raised RecursionError; an async
    # handler's worker wedged with every task cancelled (no line said why), a def handler's exited 1
    # with a traceback; the good jobs were left to their leases.
    lowers, goods = _one_among_good_jobs(sqlite_url, task)

    assert _worker(sqlite_url, procs, tmp_path, tmp_path / "runs.log") == 0

    assert f"the handler of {task} lowered the recursion limit to 30 (sys.setrecursionlimit): put back" in (
        procs.outputs()
    )
    db = App(sqlite_url)
    try:
        status = db.job(lowers)
        assert status.state == "dead"
        assert status.error is not None and "recursion limit to 30" in status.error.message
        assert [(db.job(g).state, db.job(g).result, db.job(g).deliveries) for g in goods] == [
            ("completed", i, 1) for i in range(20)
        ]
    finally:
        db.close()


def test_a_handler_that_takes_every_file_descriptor_a_while_leaves_the_worker_to_reconnect(
    postgres_database: str, postgres_server_url: str, procs: Procs, tmp_path: Path
) -> None:
    # The handler holds every descriptor of the process but one (EMFILE) for 8 s while the worker's
    # connections are ended under it, so that the worker has to open new ones meanwhile: it waits that
    # out as an unreachable server, and the jobs sent meanwhile complete once each. (The listener's
    # OSError, which ended the fetcher, is pinned in tests/postgres/test_pg_unavailable.py: here it
    # depends on which thread takes the last descriptor.)
    producer = App(postgres_database, migrate=True)
    try:
        leaks = producer.send("leaks_files", {}, queue="q", max_attempts=1).id
    finally:
        producer.close()
    log = tmp_path / "runs.log"
    worker = _start(postgres_database, procs, tmp_path, "--burst", "--concurrency", "2", log=log)
    wait_until(lambda: any(line[0] == "leaked" for line in iter_lines(log)), 30, "the handler's leak")
    name = postgres_database.rsplit("/", 1)[1]
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
    assert ended is not None and ended[0] > 0
    producer = App(postgres_database)
    try:
        goods = [producer.send("quiet", {"i": i}, queue="q").id for i in range(20)]
    finally:
        producer.close()

    assert worker.wait(timeout=60) == 0, procs.outputs()

    assert "Traceback" not in procs.outputs()
    db = App(postgres_database)
    try:
        assert (db.job(leaks).state, db.job(leaks).result) == ("completed", "gave them back")
        assert [(db.job(g).state, db.job(g).result, db.job(g).deliveries) for g in goods] == [
            ("completed", i, 1) for i in range(20)
        ]
    finally:
        db.close()


def test_a_worker_stopped_and_continued_reports_no_blocked_event_loop(
    sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    """SIGSTOP and SIGCONT (an operator, a debugger, a paused container) stop the stall watch's thread with the
    loop: once continued, the thread often looked before the loop had ticked, and warned of an event loop blocked
    for as long as the process was stopped (12 of 30 stops, each with "runs again" a tick later). A stop is not a
    stall; a handler that blocks the loop is still reported (tests/worker/test_hostile_handlers.py)."""
    App(sqlite_url, migrate=True).close()
    worker = _start(sqlite_url, procs, tmp_path)
    wait_until(lambda: "queues q" in worker.output(), 30, "the worker to start")
    for _ in range(8):
        os.kill(worker.pid, signal.SIGSTOP)
        time.sleep(1.3)  # past the watch's 1 s
        os.kill(worker.pid, signal.SIGCONT)
        time.sleep(0.4)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0, worker.output()
    assert "blocked" not in worker.output(), worker.output()
