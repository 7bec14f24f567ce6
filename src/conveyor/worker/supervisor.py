"""Prefork: run several worker processes so that every core is used (one event loop per process)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import logging
import math
import multiprocessing
import multiprocessing.process
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, MutableSequence
from datetime import datetime
from typing import Any

from conveyor._app import App
from conveyor._errors import EXIT_DAMAGED, ConfigurationError, ConveyorError, exit_code, first_line
from conveyor._scaling import ScalingPolicy, ScalingState, sum_load
from conveyor._stderr import log_to_stderr
from conveyor.backends import check_url
from conveyor.backends.base import Delivery
from conveyor.worker import _cpu
from conveyor.worker._config import WorkerConfig
from conveyor.worker._observe import Observer, Outcome
from conveyor.worker._worker import Worker

log = logging.getLogger("conveyor.worker")

#: A child's exit code when its configuration cannot work (sysexits' EX_CONFIG): the supervisor stops
#: rather than restart it.
EXIT_CONFIG = 78

#: A worker process that died soon after it started is restarted after a delay that doubles with each
#: such death in a row, from the first to the cap (a database that refuses it, an import that fails only
#: in children: no tight loop of restarts).
RESTART_DELAY_FIRST = 0.1
RESTART_DELAY_CAP = 10.0
#: A worker process that ran this long (seconds) before it died is restarted at once, and its slot's
#: count of quick deaths starts again: its death says nothing about the next start.
RAN_A_WHILE = 10.0
#: A slot whose worker processes died this many times in a row before their worker was up (its first
#: acquire answered) and within ``RAN_A_WHILE`` of their start: the supervisor gives up, stops the
#: others and exits 1. A process that was up and then died (a handler that kills it: poison protection
#: dead-letters that job) never counts, however soon it died.
FAILED_STARTS_LIMIT = 5

#: Seconds a read of the load may go unanswered (at least 3 scale intervals) before autoscaling says it waits for
#: the database (a lock, a network that swallows packets): the count stays meanwhile, as when a read fails.
HUNG_READ = 10.0

#: A worker process's flag (see _Report) once its worker stopped by itself (a burst drained, a signal), set just
#: before it exits: an exit 0 without it is a handler's ``os._exit(0)``, with the process's jobs in flight.
_STOPPED = 2

# prctl(2): the signal a process gets when the thread that created it exits.
_PR_SET_PDEATHSIG = 1
#: The signal a worker process gets from the kernel when its supervisor dies (Linux). Not SIGTERM: the kernel
#: sends it at each reparenting, so a supervisor with threads (autoscaling's load reader) that is killed sends
#: it twice, the first time while ``getppid()`` is still its pid; two SIGTERMs read as an operator's "exit at
#: once". SIGHUP is the hang-up of the process's controller; the worker stops gracefully on the first, once.
PARENT_DEATH_SIGNAL = signal.SIGHUP


def load_app(path: str) -> App:
    """Import ``module:attribute`` and return the App it names (the current directory is importable)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"APP must look like module:attribute (e.g. myproject.tasks:app), got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from None
    except SystemExit as exc:
        raise ConfigurationError(f"importing {module_name!r} called sys.exit({exc.code!r})") from None
    except Exception as exc:  # the app's module itself failed: where, in one line
        raise ConfigurationError(f"importing {module_name!r} failed: {_where(exc)}") from None
    if not hasattr(module, attr):
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigurationError(f"{path!r} is not a conveyor.App (found {type(app).__name__})")
    return app


def _where(exc: BaseException) -> str:
    """``Type: message (file:line)`` of an exception, at the innermost frame of its traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    at = f" ({tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})" if tb is not None else ""
    try:
        message = str(exc)
    except Exception:
        message = ""
    return f"{type(exc).__name__}: {message}{at}" if message else f"{type(exc).__name__}{at}"


def run_worker(
    app_path: str,
    database_url: str | None,
    config: WorkerConfig,
    supervisor: int | None = None,
    observer: Observer | None = None,
    asked: Callable[[], int] | None = None,
) -> int:
    """Load the app and run one Worker in this process until it stops; return its exit code.
    ``supervisor``: the pid of the prefork supervisor whose child this process is (None: alone); ``asked``: how
    many SIGTERMs it has sent this process (see ``Worker.supervisor_stops``)."""
    child = supervisor is not None
    if child:
        # The supervisor owns SIGINT (a terminal's Ctrl-C reaches the whole process group); a child
        # stops on the SIGTERM the supervisor forwards, so one Ctrl-C is one graceful stop. It started with
        # SIGINT blocked (see run_processes): ignoring it discards one sent meanwhile.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    app = load_app(app_path)
    if database_url:
        app.database_url = database_url
    worker = Worker(app, config=config, observer=observer)
    worker.supervisor = supervisor
    worker.supervisor_stops = asked
    # Alone, a hang-up is a terminal closing: a graceful stop rather than Python's default (killed mid-job, the jobs
    # left to their leases), unless it was ignored from the start (nohup). A supervised child gets it as its
    # supervisor's death notice too (Linux; elsewhere it polls), and under nohup acts only on the notice.
    ignored = signal.getsignal(PARENT_DEATH_SIGNAL) == signal.SIG_IGN
    if child and sys.platform == "linux":
        worker.hang_up_signal, worker.hang_up_ignored = PARENT_DEATH_SIGNAL, ignored
    elif not child and not ignored:
        worker.hang_up_signal = PARENT_DEATH_SIGNAL
    code = 1  # should run_sync raise
    before = set(threading.enumerate())
    try:
        code = worker.run_sync(signals=(signal.SIGTERM,) if child else (signal.SIGTERM, signal.SIGINT))
    finally:
        app.close()
        left = [t for t in _waited_for_at_exit() if t not in before]
        _exit_within(config.graceful_timeout, code, left)
    return code


def _exit_within(seconds: float, code: int, left: list[threading.Thread]) -> None:
    """Once this process exits, give it ``seconds`` (your atexit hooks: a tracer's or an error reporter's
    flush), then end it with ``code``. The worker has stopped by then: every outcome is written, nothing is
    leased. A thread a handler left running kept the process from exiting after a graceful stop until a
    SIGKILL: Python waits at exit for every non-daemon thread and for every ``ThreadPoolExecutor``'s threads
    (a pool whose task hangs on the network, say), and so did a supervisor stopping its children.

    Armed at the start of Python's exit (``threading._register_atexit``, before those waits), and only if one of
    ``left`` (the threads that appeared during the worker's run and outlived it) is still there: a program that
    ran a worker in its process and went on (a test suite, a script) exits as it would have, its own threads'
    work done and its own exit code kept, not cut short with the worker's."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # not CPython's threading module: nothing armed
        return

    def arm() -> None:
        if not any(t.is_alive() for t in left):
            return
        with contextlib.suppress(RuntimeError):  # no new thread this late: exit as Python does
            threading.Thread(target=_leave, args=(seconds, code), name="conveyor-exit", daemon=True).start()

    with contextlib.suppress(RuntimeError):  # already exiting
        register(arm)


def _waited_for_at_exit() -> list[threading.Thread]:
    """The threads Python's exit waits for: the non-daemon ones, and every ``ThreadPoolExecutor``'s (its
    atexit hook joins them, daemon or not: a pool a handler starts in a worker's daemon thread is one)."""
    pools = getattr(sys.modules.get("concurrent.futures.thread"), "_threads_queues", {})
    return [t for t in threading.enumerate() if not t.daemon or t in pools]


def _leave(seconds: float, code: int) -> None:
    time.sleep(seconds)
    me = threading.current_thread()
    left = [t.name for t in threading.enumerate() if t is not me and t is not threading.main_thread()]
    log.warning(
        "the worker stopped, but this process has not exited %gs later: threads its handlers left running "
        "(%s) keep it; exiting without them",
        seconds,
        ", ".join(left) or "none left",
    )
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _log_config() -> tuple[int, str | None]:
    """The parent's root log level and format, for its children (spawned children start with
    logging unconfigured: only bare WARNING messages, whatever ``-v`` said)."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    return root.level, formatter._fmt if formatter is not None else None


class _Report(Observer):
    """What a worker process tells its supervisor, in memory the supervisor reads (one writer per slot): that it is
    up, once its first acquire is answered (then its app imported, its database answered and its loops run), and
    how many handlers it is running (a scale-in stops an idle process rather than cut a busy one's jobs)."""

    def __init__(self, flags: MutableSequence[int], running: MutableSequence[int], index: int) -> None:
        self.flags = flags
        self.running = running
        self.index = index
        self.up = False
        self._count = 0
        self._lock = threading.Lock()  # before_run/after_run of ``def`` handlers run in their threads

    def fetched(self, queue: str, deliveries: int) -> None:
        if not self.up:
            self.up = True
            self.flags[self.index] = 1

    def before_run(self, delivery: Delivery, now: datetime) -> None:
        with self._lock:
            self._count += 1
            self.running[self.index] = self._count

    def after_run(self, delivery: Delivery, outcome: Outcome | None, seconds: float, token: Any) -> None:
        with self._lock:
            self._count -= 1
            self.running[self.index] = self._count


def _child_main(
    app_path: str,
    database_url: str | None,
    config: WorkerConfig,
    log_config: tuple[int, str | None],
    supervisor: int,
    up: MutableSequence[int],
    index: int,
    asked: MutableSequence[int],
    running: MutableSequence[int],
) -> None:
    level, fmt = log_config
    log_to_stderr(level, fmt or logging.BASIC_FORMAT)
    _follow(supervisor)
    try:
        code = run_worker(
            app_path,
            database_url,
            config,
            supervisor=supervisor,
            observer=_Report(up, running, index),
            asked=lambda: asked[index],
        )
        up[index] = _STOPPED  # its worker stopped: an exit 0 without this is a handler's os._exit(0)
    except ConveyorError as exc:
        # Before its loops started (the schema check, its metrics port): one line, as the CLI prints it.
        # Its own options that cannot work, or a damaged database: a restart would fail the same way.
        print(f"conveyor: error: {first_line(exc)}", file=sys.stderr, flush=True)
        code = EXIT_CONFIG if isinstance(exc, ConfigurationError) else exit_code(exc)
    sys.exit(code)


def _follow(supervisor: int) -> None:
    """Stop this worker process as SIGTERM does (in-flight jobs finish, buffered ones go back) when its
    supervisor dies: an orphan would lease jobs for ever with no one left to stop it. Linux: the kernel
    sends ``PARENT_DEATH_SIGNAL`` (``PR_SET_PDEATHSIG``); elsewhere a thread polls the parent's pid every
    second and sends SIGTERM."""
    if sys.platform == "linux" and _set_parent_death_signal(PARENT_DEATH_SIGNAL):
        # The supervisor may have died between this process's fork and the call: it then has another
        # parent already, and no death is left to signal it. Nothing is leased yet: exit. (Sending itself
        # the signal did that by its default action, but not under nohup, which ignores it: an orphan.)
        if os.getppid() != supervisor:
            sys.exit(0)
        return
    threading.Thread(target=_poll_parent, args=(supervisor,), name="conveyor-supervisor-watch", daemon=True).start()


def _set_parent_death_signal(sig: signal.Signals) -> bool:
    """Have the kernel send ``sig`` when the thread that started this process exits (the supervisor
    starts its children from its main thread, so: when the supervisor exits). False if it cannot."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return bool(prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)


def _poll_parent(supervisor: int, interval: float = 1.0) -> None:
    while os.getppid() == supervisor:
        time.sleep(interval)
    os.kill(os.getpid(), signal.SIGTERM)


def _handlers(n: int) -> str:
    return "idle" if n <= 0 else f"{n} handler{'s' if n > 1 else ''} running"


def _how(code: int | None) -> str:
    """How a process ended, for a log line: ``exit code 3``, ``signal SIGKILL``."""
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


@dataclasses.dataclass
class _Slot:
    """One of the supervisor's worker processes: the one running now, and how its predecessors ended."""

    index: int
    process: multiprocessing.process.BaseProcess
    started: float
    #: Deaths in a row, each within RAN_A_WHILE of its start: the restart delay doubles with each.
    quick_deaths: int = 0
    #: Deaths in a row before the worker was up (and within RAN_A_WHILE): FAILED_STARTS_LIMIT gives up.
    failed_starts: int = 0
    #: When the dead process is to be replaced (None: not decided yet, or it runs).
    restart_at: float | None = None
    #: The process is stopped (SIGSTOP, SIGTSTP): seen by waitid, logged once per stop.
    stopped: bool = False
    #: Autoscaling stopped this slot's process (SIGTERM): once it exits, the slot is gone, never restarted.
    retiring: bool = False

    def died(self, was_up: bool, now: float) -> float | None:
        """Count the death of this slot's process; return the delay before its restart, or None when
        its processes keep failing to start (FAILED_STARTS_LIMIT in a row)."""
        if now - self.started >= RAN_A_WHILE:
            self.quick_deaths = self.failed_starts = 0
            return 0.0
        self.quick_deaths += 1
        self.failed_starts = 0 if was_up else self.failed_starts + 1
        if self.failed_starts >= FAILED_STARTS_LIMIT:
            return None
        return min(RESTART_DELAY_CAP, RESTART_DELAY_FIRST * 2.0 ** (self.quick_deaths - 1))


def _stop_change(pid: int) -> int | None:
    """The signal that stopped child ``pid`` since the last call (a positive number), 0 if it was
    continued since, None if neither (or the platform cannot tell). Reaps nothing (no WEXITED)."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return None
    try:
        info = waitid(os.P_PID, pid, os.WSTOPPED | os.WCONTINUED | os.WNOHANG)
    except OSError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_STOPPED:
        return info.si_status or signal.SIGSTOP
    return 0 if info.si_code == os.CLD_CONTINUED else None


class _LoadReader:
    """Reads the load of the worker's queues (ready and in-flight jobs) every ``interval`` seconds, in a thread
    of its own: a database that hangs must not hold up the supervisor's restarts and signals. The supervisor
    takes each reading (or the exception that read raised) from the main thread."""

    def __init__(self, app: App, queues: list[str], interval: float) -> None:
        self.app, self.queues, self.interval = app, queues, interval
        self.lock = threading.Lock()
        self.reading: tuple[float, tuple[int, int] | Exception] | None = None
        #: When the read under way started (None: none is): one that does not answer is no failure to log.
        self.since: float | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="conveyor-autoscale", daemon=True)

    def run(self) -> None:
        while True:
            result: tuple[int, int] | Exception
            self.since = time.monotonic()
            try:
                result = sum_load(self.app.admin.queues(), self.queues)
            except Exception as exc:  # the database is away, or refuses: the supervisor keeps its count
                result = exc
            with self.lock:
                self.reading = (time.monotonic(), result)
                self.since = None
            if self.done.wait(self.interval):
                return

    def take(self) -> tuple[float, tuple[int, int] | Exception] | None:
        with self.lock:
            reading, self.reading = self.reading, None
        return reading

    def stop(self) -> bool:
        """Stop reading; True once the thread has ended (then the App may be closed)."""
        self.done.set()
        self.thread.join(timeout=1.0)
        return not self.thread.is_alive()


def run_processes(
    app_path: str,
    database_url: str | None,
    processes: int,
    config: WorkerConfig,
    pin: bool = False,
    autoscale: ScalingPolicy | None = None,
    scale_interval: float = 5.0,
) -> int:
    """Run ``processes`` worker processes and supervise them until a signal (or, with burst, until
    all have drained). A child that dies unexpectedly is restarted: at once if it ran ``RAN_A_WHILE``,
    else after a delay that doubles with each quick death in a row (``RESTART_DELAY_FIRST`` up to
    ``RESTART_DELAY_CAP``). Every other child is stopped and none restarted when one cannot work (its
    configuration, a damaged database), or when one slot's children die before their worker is up
    ``FAILED_STARTS_LIMIT`` times in a row. A stopped child (SIGSTOP) is logged, never killed. Each
    child stops as on SIGTERM if the supervisor dies. Returns 0 when every child stopped cleanly,
    ``EXIT_DAMAGED`` when one found the database damaged, else 1. ``pin``: each process on a CPU of
    its own (round robin; a restarted child on its predecessor's).

    ``autoscale``: ``processes`` is ignored; the supervisor starts ``autoscale.minimum`` processes and every
    ``scale_interval`` seconds reads the load of the worker's queues (``app.admin.queues()``) and applies the
    policy: a scale-out starts new slots (the lowest free index: metrics ports and CPUs are laid out for
    ``autoscale.maximum`` processes); a scale-in stops the process running the fewest handlers (an idle one; of
    equals the newest) gracefully (SIGTERM: its buffered jobs go back at once, its running ones finish) and does
    not restart it, however it ends. While the load cannot be read, the count stays as it is (logged once per
    outage)."""
    if autoscale is not None:
        if config.burst:
            raise ConfigurationError("--autoscale cannot be combined with --burst (a burst drains and exits)")
        if not (math.isfinite(scale_interval) and 0.05 <= scale_interval <= 3600):
            raise ConfigurationError(f"--scale-interval must be from 0.05 to 3600 seconds, got {scale_interval!r}")
        processes = autoscale.maximum
        if config.prefetch is None:
            # No prefetch (a job is leased only for a free slot): a job buffered behind a long one would be
            # counted as load, start a process, and wait in its elder's buffer while the new one idles.
            config = dataclasses.replace(config, prefetch=0)
    cpus = _cpu.spread(processes) if pin else None
    if processes <= 1 and autoscale is None:
        if cpus is not None:
            config = dataclasses.replace(config, cpu=cpus[0])
        return run_worker(app_path, database_url, config)
    # Fail fast, in the parent, with one clear line, on what each child would fail on and exit.
    app = load_app(app_path)
    if database_url or not app._backend_given:  # an App given its backend opens no URL of its own
        check_url(database_url or app.database_url)
    if config.metrics_port is not None and config.metrics_port + processes - 1 > 65535:
        last = config.metrics_port + processes - 1
        raise ConfigurationError(f"--metrics-port: ports {config.metrics_port}..{last} go past 65535")
    reader: _LoadReader | None = None
    if autoscale is not None:
        if database_url and not app._backend_given:
            app.database_url = database_url
        queues = list(config.queues) if config.queues else app.catalogue.declared_queues()
        reader = _LoadReader(app, queues, scale_interval)
        log.info(
            "autoscale: %s; load read from queues %s every %gs", autoscale.describe(), ",".join(queues), scale_interval
        )
    ctx = multiprocessing.get_context("spawn")
    # One flag per slot that its worker process sets once it is up, and how many handlers it runs (see _Report):
    # shared memory, one writer each. With autoscale, one per slot the maximum may use.
    up = ctx.RawArray("b", processes)
    running = ctx.RawArray("i", processes)
    # The SIGTERMs the supervisor has sent the process in each slot (0 when one starts there), written before each is
    # sent: what forward() has yet to send, and how a child tells a SIGTERM to the whole process group (systemd's
    # default stop, timeout(1)), which reaches it directly and again forwarded, from an operator's second one.
    asked = ctx.RawArray("i", processes)
    supervisor = os.getpid()
    slots: list[_Slot] = []
    stopping = [0]

    def spawn(index: int) -> multiprocessing.process.BaseProcess:
        # Each child serves its own metrics on its own port (metrics_port + index; a restarted child
        # takes its predecessor's), so that no scrape sees half of another process's counters.
        own = config
        if config.metrics_port is not None:
            own = dataclasses.replace(own, metrics_port=config.metrics_port + index)
        if cpus is not None:
            try:
                own = dataclasses.replace(own, cpu=cpus[index])
            except ConfigurationError as exc:  # the supervisor's CPUs changed since it started
                log.warning("worker process %d starts unpinned: %s", index, first_line(exc))
        up[index] = asked[index] = running[index] = 0
        # Started from this (the main) thread: a child's parent-death signal fires when the thread that
        # started it exits, which must be the supervisor's exit, not a helper thread's.
        p = ctx.Process(
            target=_child_main,
            args=(app_path, database_url, own, _log_config(), supervisor, up, index, asked, running),
            daemon=False,
        )
        # The child starts with SIGINT blocked (fork and exec keep the signal mask): a Ctrl-C to the process group
        # while it started up (a scale-out, a restart) killed it (or raised KeyboardInterrupt in its imports), and
        # the supervisor exited 1. It stays pending there until run_worker ignores SIGINT, which discards it. One
        # sent to the supervisor meanwhile waits for its handler here. (The supervisor set SIGINT to SIG_IGN around
        # the start too, once: that discards a pending SIGINT, and a Ctrl-C that came between the two calls was
        # lost, the supervisor and its processes running on.) multiprocessing's resource tracker is started first:
        # starting it, in the first start, unblocks SIGINT (and the first process started with it unblocked).
        multiprocessing.resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return p

    def forward(slot: _Slot) -> None:
        """Send the child one SIGTERM per signal the supervisor got (a second one: exit at once)."""
        p = slot.process
        while p.pid and asked[slot.index] < stopping[0]:
            asked[slot.index] += 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
                # A child that is stopped (SIGSTOP, say from one of its own handlers) would only get
                # the signal once continued, and the supervisor waited for it for ever.
                os.kill(p.pid, signal.SIGCONT)

    def on_signal(signum: int, _frame: object) -> None:
        stopping[0] += 1
        for slot in slots:
            if slot.process.is_alive():
                forward(slot)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # With autoscale: the processes the policy asks for now (slots that are not retiring), its memory, and
    # whether the load could not be read at the last try (an outage is logged once, and its end).
    target = autoscale.minimum if autoscale is not None else processes
    scaling = ScalingState()
    outage = False

    def retire() -> None:
        """Scale in by one: a slot waiting for its restart just goes; else the process running the fewest handlers
        (an idle one: a busy one's jobs longer than the graceful timeout would be cut and run again), of those the
        newest (its highest index, so that the metrics ports in use stay contiguous when it can), stops gracefully
        as on SIGTERM and is not restarted."""
        slot = max(
            (s for s in slots if not s.retiring),
            key=lambda s: (not s.process.is_alive(), -running[s.index], s.index),
        )
        p = slot.process
        if not p.is_alive():
            slots.remove(slot)
            log.info("autoscale: worker process slot %d, waiting for its restart, is not restarted", slot.index)
            return
        slot.retiring = True
        if p.pid:
            # Counted as a forwarded signal: a later SIGTERM to the supervisor must not make it this
            # process's second one (which stops at once); a second one to the supervisor still does.
            asked[slot.index] += 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
                os.kill(p.pid, signal.SIGCONT)
        log.info(
            "autoscale: stopping worker process %s gracefully (scale-in, %s; it is not restarted)",
            p.pid,
            _handlers(running[slot.index]),
        )

    refused: list[float | None] = [None]  # when a scale-out that could not start a process is tried again

    def start_slots() -> None:
        """Scale out to ``target``: new slots on the lowest free indices (a retiring one keeps its index, and
        its metrics port, until it has exited). A process that cannot be started (no file descriptor left, a fork
        refused for memory or a process limit) leaves the others running: logged once, tried again every second."""
        while not stopping[0] and sum(1 for s in slots if not s.retiring) < target:
            taken = {s.index for s in slots}
            free = [i for i in range(processes) if i not in taken]
            if not free:
                return  # every index is held, some by retiring processes: the next pass, once they exit
            if refused[0] is not None and time.monotonic() < refused[0]:
                return
            try:
                process = spawn(free[0])
            except OSError as exc:
                if refused[0] is None:
                    log.warning(
                        "autoscale: cannot start a worker process (%s); keeping %d, trying again every second",
                        first_line(exc),
                        sum(1 for s in slots if not s.retiring),
                    )
                refused[0] = time.monotonic() + 1.0
                return
            if refused[0] is not None:
                log.warning("autoscale: worker processes can be started again")
                refused[0] = None
            slot = _Slot(free[0], process, time.monotonic())
            slots.append(slot)
            slots.sort(key=lambda s: s.index)
            log.info("autoscale: started worker process %s (slot %d)", slot.process.pid, slot.index)
            forward(slot)  # a signal that came while it was being started

    for index in range(target):
        if stopping[0]:
            break
        slots.append(_Slot(index, spawn(index), time.monotonic()))
        forward(slots[-1])  # a signal that came while it was being started
    burst = config.burst
    failed = damaged = waiting_logged = False
    if reader is not None:
        # Started with SIGINT blocked, as are the threads it starts (the App's pool): a SIGINT goes to the main
        # thread, the only one that lets it through (pending while spawn() blocks it).
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            reader.thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    try:
        while True:
            alive = False
            now = time.monotonic()
            gone: list[_Slot] = []
            for slot in slots:
                p = slot.process
                if p.is_alive():
                    alive = True
                    _watch_stopped(slot, burst)
                    continue
                slot.stopped = False
                code = p.exitcode
                if slot.retiring:
                    # Scaled in: never restarted, whatever its exit (a non-zero one is logged: its leases
                    # expire and rescue returns its jobs, as for any death).
                    gone.append(slot)
                    # Once stopping (a second SIGTERM reached it too), it counts as any other process: one that
                    # exited at once cut its jobs short, and the supervisor exits 1, as with --processes.
                    failed = failed or bool(stopping[0] and not _stopped_cleanly(code, True))
                    if _stopped_cleanly(code, True):
                        log.info("autoscale: worker process %s stopped (scale-in)", p.pid)
                    else:
                        log.warning(
                            "autoscale: retiring worker process %s ended with %s; not restarted", p.pid, _how(code)
                        )
                    continue
                if stopping[0] or (burst and code == 0 and up[slot.index] == _STOPPED):
                    failed = failed or not _stopped_cleanly(code, bool(stopping[0]))
                    continue
                if code in (EXIT_CONFIG, EXIT_DAMAGED):
                    why = "cannot run with its configuration" if code == EXIT_CONFIG else "found the database damaged"
                    log.error("worker process %s %s; stopping the others, restarting none", p.pid, why)
                    failed, damaged = True, damaged or code == EXIT_DAMAGED
                    on_signal(signal.SIGTERM, None)
                    continue
                if slot.restart_at is None:
                    delay = slot.died(bool(up[slot.index]), now)
                    if delay is None:
                        log.error(
                            "worker processes keep failing to start (%d in a row; the last, pid %s, ended with %s "
                            "before its first acquire); stopping the others, restarting none",
                            slot.failed_starts,
                            p.pid,
                            _how(code),
                        )
                        failed = True
                        on_signal(signal.SIGTERM, None)
                        continue
                    later = f" in {delay:.1f}s" if delay else ""
                    log.warning("worker process %s exited with %s; restarting it%s", p.pid, code, later)
                    slot.restart_at = now + delay
                alive = True
                if now >= slot.restart_at:
                    slot.process, slot.started, slot.restart_at = spawn(slot.index), time.monotonic(), None
                    forward(slot)  # a signal that came while it was being started
            if gone:
                slots[:] = [s for s in slots if s not in gone]
            if reader is not None and autoscale is not None and not stopping[0] and not failed:
                reading = reader.take()
                since = reader.since
                if reading is None and since is not None and now - since > max(HUNG_READ, 3 * scale_interval):
                    if not outage:
                        log.warning(
                            "autoscale: the load of the queues has not been read for %.0fs (the database does not "
                            "answer); keeping %d worker process(es) until it does",
                            now - since,
                            target,
                        )
                    outage = True
                if reading is not None:
                    at, result = reading
                    if isinstance(result, Exception):
                        if not outage:
                            log.warning(
                                "autoscale: cannot read the load of the queues (%s); keeping %d worker process(es) "
                                "until the database answers",
                                first_line(result),
                                target,
                            )
                        outage = True
                    else:
                        if outage:
                            log.warning("autoscale: the load of the queues can be read again")
                        outage = False
                        ready, in_flight = result
                        decision = autoscale.decide(
                            ready=ready,
                            in_flight=in_flight,
                            current=target,
                            concurrency=config.concurrency,
                            now=at,
                            state=scaling,
                        )
                        scaling = decision.state
                        if decision.desired != target:
                            log.info(
                                "autoscale: %d -> %d worker processes (%s)", target, decision.desired, decision.reason
                            )
                            target = decision.desired
                while sum(1 for s in slots if not s.retiring) > target:
                    retire()
                start_slots()
                alive = alive or any(not s.retiring for s in slots)
            if not alive:
                break
            # A burst ends when every child has drained and exited: one that is stopped holds it up for as
            # long as it stays stopped, which the operator is told once, when it is all that is left.
            left = [s for s in slots if s.process.is_alive() or s.restart_at is not None]
            waiting = bool(burst and not stopping[0] and left and all(s.stopped for s in left))
            if waiting and not waiting_logged:
                log.warning(
                    "burst: the other worker processes are done; waiting for stopped worker process(es) %s "
                    "(continue them with SIGCONT, or stop the supervisor with SIGTERM)",
                    ", ".join(str(s.process.pid) for s in left),
                )
            waiting_logged = waiting
            time.sleep(0.1)
    except BaseException as exc:
        # The supervisor itself failed (a child it could not start, ...): stop the children as a
        # SIGTERM would and wait for them, rather than leave them running unsupervised.
        log.error("the worker supervisor failed (%s); stopping its worker processes", first_line(exc))
        on_signal(signal.SIGTERM, None)
        for slot in slots:
            slot.process.join(config.graceful_timeout + 10)
            if slot.process.is_alive():
                slot.process.kill()
        raise
    finally:
        if reader is not None and reader.stop():
            app.close()
    for slot in slots:
        slot.process.join()
        code = slot.process.exitcode
        if not slot.retiring and not _stopped_cleanly(code, bool(stopping[0])):
            failed = True
            log.warning("worker process %s ended with %s", slot.process.pid, _how(code))
    return EXIT_DAMAGED if damaged else 1 if failed else 0


def _watch_stopped(slot: _Slot, burst: bool) -> None:
    """Log once when a child is stopped (SIGSTOP, SIGTSTP) and when it is continued. A stopped child is
    not killed: an operator or a debugger may have stopped it on purpose, and its leases expire on
    their own (other processes then run its jobs); SIGTERM to the supervisor continues and stops it."""
    change = _stop_change(slot.process.pid or 0)
    if change is None:
        return
    if change and not slot.stopped:
        slot.stopped = True
        log.warning(
            "worker process %s is stopped (%s): it runs nothing until continued (kill -CONT %s); other "
            "processes take its jobs once its leases expire%s",
            slot.process.pid,
            _how(-change),
            slot.process.pid,
            "; the burst cannot end before it does" if burst else "",
        )
    elif not change and slot.stopped:
        slot.stopped = False
        log.warning("worker process %s was continued", slot.process.pid)


def _stopped_cleanly(code: int | None, stopping: bool) -> bool:
    """Exit 0; or, once stopping, killed by the forwarded SIGTERM itself: a child installs its
    handler before its worker leases anything, so one that died of SIGTERM was still starting
    (or had already stopped) and held no job."""
    return code == 0 or (stopping and code == -signal.SIGTERM)
