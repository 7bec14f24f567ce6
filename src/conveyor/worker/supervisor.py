"""Prefork: run several worker processes so that every core is used (one event loop per process)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import time

from conveyor._app import App
from conveyor._errors import EXIT_DAMAGED, ConfigurationError, ConveyorError, exit_code, first_line
from conveyor.backends import check_url
from conveyor.worker import _cpu
from conveyor.worker._config import WorkerConfig
from conveyor.worker._worker import Worker

log = logging.getLogger("conveyor.worker")

#: A child's exit code when its configuration cannot work (sysexits' EX_CONFIG): the supervisor stops
#: rather than restart it.
EXIT_CONFIG = 78


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


def run_worker(app_path: str, database_url: str | None, config: WorkerConfig, child: bool = False) -> int:
    """Load the app and run one Worker in this process until it stops; return its exit code."""
    if child:
        # The supervisor owns SIGINT (a terminal's Ctrl-C reaches the whole process group); a child
        # stops on the SIGTERM the supervisor forwards, so one Ctrl-C is one graceful stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    app = load_app(app_path)
    if database_url:
        app.database_url = database_url
    worker = Worker(app, config=config)
    try:
        return worker.run_sync(signals=(signal.SIGTERM,) if child else (signal.SIGTERM, signal.SIGINT))
    finally:
        app.close()


def _log_config() -> tuple[int, str | None]:
    """The parent's root log level and format, for its children (spawned children start with
    logging unconfigured: only bare WARNING messages, whatever ``-v`` said)."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    return root.level, formatter._fmt if formatter is not None else None


def _child_main(
    app_path: str, database_url: str | None, config: WorkerConfig, log_config: tuple[int, str | None]
) -> None:
    level, fmt = log_config
    logging.basicConfig(level=level, format=fmt or logging.BASIC_FORMAT)
    try:
        code = run_worker(app_path, database_url, config, child=True)
    except ConveyorError as exc:
        # Before its loops started (the schema check, its metrics port): one line, as the CLI prints it.
        # Its own options that cannot work, or a damaged database: a restart would fail the same way.
        print(f"conveyor: error: {first_line(exc)}", file=sys.stderr, flush=True)
        code = EXIT_CONFIG if isinstance(exc, ConfigurationError) else exit_code(exc)
    sys.exit(code)


def run_processes(
    app_path: str, database_url: str | None, processes: int, config: WorkerConfig, pin: bool = False
) -> int:
    """Run ``processes`` worker processes and supervise them until a signal (or, with burst, until
    all have drained). A child that dies unexpectedly is restarted, unless it cannot work (its
    configuration, a damaged database: every other child is stopped). Returns 0 when every child
    stopped cleanly, ``EXIT_DAMAGED`` when one found the database damaged, else 1. ``pin``: each
    process on a CPU of its own (round robin; a restarted child on its predecessor's)."""
    cpus = _cpu.spread(processes) if pin else None
    if processes <= 1:
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
    ctx = multiprocessing.get_context("spawn")
    children: list[multiprocessing.process.BaseProcess] = []
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
        p = ctx.Process(target=_child_main, args=(app_path, database_url, own, _log_config()), daemon=False)
        p.start()
        return p

    forwarded: dict[int, int] = {}

    def forward(p: multiprocessing.process.BaseProcess) -> None:
        """Send the child one SIGTERM per signal the supervisor got (a second one: exit at once)."""
        while p.pid and forwarded.get(p.pid, 0) < stopping[0]:
            forwarded[p.pid] = forwarded.get(p.pid, 0) + 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
                # A child that is stopped (SIGSTOP, say from one of its own handlers) would only get
                # the signal once continued, and the supervisor waited for it for ever.
                os.kill(p.pid, signal.SIGCONT)

    def on_signal(signum: int, _frame: object) -> None:
        stopping[0] += 1
        for p in children:
            if p.is_alive():
                forward(p)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for index in range(processes):
        if stopping[0]:
            break
        children.append(spawn(index))
        forward(children[-1])  # a signal that came while it was being started
    burst = config.burst
    failed = damaged = False
    try:
        while True:
            alive = False
            for i, p in enumerate(children):
                if p.is_alive():
                    alive = True
                    continue
                code = p.exitcode
                if stopping[0] or (burst and code == 0):
                    failed = failed or not _stopped_cleanly(code, bool(stopping[0]))
                    continue
                if code in (EXIT_CONFIG, EXIT_DAMAGED):
                    why = "cannot run with its configuration" if code == EXIT_CONFIG else "found the database damaged"
                    log.error("worker process %s %s; stopping the others, restarting none", p.pid, why)
                    failed, damaged = True, damaged or code == EXIT_DAMAGED
                    on_signal(signal.SIGTERM, None)
                    continue
                log.warning("worker process %s exited with %s; restarting it", p.pid, code)
                time.sleep(0.5)
                if stopping[0]:
                    continue
                children[i] = spawn(i)
                forward(children[i])  # a signal that came while it was being started
                alive = True
            if not alive:
                break
            time.sleep(0.1)
    except BaseException as exc:
        # The supervisor itself failed (a child it could not start, ...): stop the children as a
        # SIGTERM would and wait for them, rather than leave them running unsupervised.
        log.error("the worker supervisor failed (%s); stopping its worker processes", first_line(exc))
        on_signal(signal.SIGTERM, None)
        for p in children:
            p.join(config.graceful_timeout + 10)
            if p.is_alive():
                p.kill()
        raise
    for p in children:
        p.join()
        failed = failed or not _stopped_cleanly(p.exitcode, bool(stopping[0]))
    return EXIT_DAMAGED if damaged else 1 if failed else 0


def _stopped_cleanly(code: int | None, stopping: bool) -> bool:
    """Exit 0; or, once stopping, killed by the forwarded SIGTERM itself: a child installs its
    handler before its worker leases anything, so one that died of SIGTERM was still starting
    (or had already stopped) and held no job."""
    return code == 0 or (stopping and code == -signal.SIGTERM)
