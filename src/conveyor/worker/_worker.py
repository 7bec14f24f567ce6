"""The Worker: starts the loops, and stops them in the order that loses nothing."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
import threading
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from conveyor._app import App
from conveyor._errors import BackendCorrupt, BackendError, ConfigurationError, exit_code
from conveyor._limits import preview
from conveyor.backends.base import JobsReleaseParams, LeaseRef, QueuesStatsParams
from conveyor.worker import _cpu, _threads
from conveyor.worker._config import WorkerConfig
from conveyor.worker._loops import Loops, build_loops
from conveyor.worker._observe import NO_OBSERVER, Observer, Observers
from conveyor.worker._stall import StallWatch
from conveyor.worker._state import Counters
from conveyor.worker.executor import guard_tasks, unguard_tasks, worker_tasks

log = logging.getLogger("conveyor.worker")


# How long a worker waits at start for the database's clock (see conveyor._clock).
_CLOCK_READ_TIMEOUT = 2.0


class Worker:
    """Drains ``queues`` (lanes, in strict order) with ``concurrency`` handler slots.

    ``queues`` defaults to every queue a registered task declares. The other options are those of
    :class:`~conveyor.worker.WorkerConfig` (``concurrency``, ``prefetch``, ``burst``,
    ``graceful_timeout``, ...), given one by one or as ``config``. ``burst`` stops the worker once
    its queues hold no live job (ready, scheduled or processing). Stop it with :meth:`stop` (or
    SIGTERM/SIGINT under :meth:`run_sync`): fetching stops, buffered jobs go back to pending at once,
    running handlers get ``graceful_timeout`` seconds to finish, outcomes are flushed. ``exit_code``
    is then 0, or 1 if a loop failed or outcomes could not be written, or ``EXIT_DAMAGED`` (74) if the
    database is damaged.

    Leases are judged by the app's clock (:attr:`App.clock`: this host's, or on PostgreSQL the
    server's where this host's is off it; read at start). ``clock``, for tests, is used as given.

    ``observer`` hears what the loops do (:class:`conveyor.worker.Observer`); the worker adds its own
    for ``metrics_port`` (Prometheus, served from a thread) and ``tracing`` (OpenTelemetry)."""

    def __init__(
        self,
        app: App,
        queues: Sequence[str] | None = None,
        *,
        config: WorkerConfig | None = None,
        clock: Callable[[], datetime] | None = None,
        observer: Observer | None = None,
        **options: Any,
    ) -> None:
        if config is None:
            if isinstance(queues, (str, bytes)):
                queues = WorkerConfig(queues=queues).queues  # type: ignore[arg-type]  # refused, with its message
            config = WorkerConfig(queues=tuple(queues) if queues is not None else None, **options)
        elif queues or options:
            raise TypeError("give either config or queues and options, not both")
        self.app = app
        self.config = config
        self.queues = list(config.queues) if config.queues else app.catalogue.declared_queues()
        unknown = [q for q in config.weights or () if q not in self.queues]
        if unknown:
            raise ConfigurationError(
                f"weights name queues this worker does not drain: {', '.join(unknown)} "
                f"(it drains {', '.join(self.queues)})"
            )
        unweighted = [q for q in self.queues if config.weights and q not in config.weights]
        if unweighted:
            # A lane left out took the weight 1 without a word, where `--queues a:3,b` is refused: a weight
            # forgotten is as likely as a weight meant to be 1, and the two faces give the same lanes.
            raise ConfigurationError(
                f"weights give no weight to {', '.join(unweighted)}, which this worker drains: give a weight to "
                "every queue it drains, or weights=None to drain them in strict order"
            )
        _warn_of_leases_between_heartbeats(app, self.queues, config.heartbeat_interval)
        self.worker_id = config.identity
        # The app's clock, unless a test gives one: then kept as given, never set to the database's.
        self.clock = clock if clock is not None else app.clock
        self._keeps_database_time = clock is None
        self.counters = Counters()
        self._metrics, self.observer = _observers(config, observer)
        self._stop_requested: asyncio.Event | None = None
        self._stopping = False
        #: The pid of the prefork supervisor that started this process (set by it; None: none). A
        #: SIGTERM that finds it gone is the notice of its death (see supervisor._follow), not an
        #: operator's: it stops gracefully, and a graceful stop under way goes on.
        self.supervisor: int | None = None
        #: How many SIGTERMs the supervisor has sent this process so far (set by it; None: not supervised). A
        #: SIGTERM to the whole process group reaches the process twice, directly and forwarded by the supervisor:
        #: one stop. A second stop signal exits at once only when one sender sent two (the supervisor, or others).
        self.supervisor_stops: Callable[[], int] | None = None
        self._stop_signals = 0
        #: The hang-up signal, on which the worker stops gracefully, once, and never at once (None: not handled).
        #: ``conveyor worker`` sets SIGHUP: a terminal that closes sends it, and the kernel sends it to a supervised
        #: process when its supervisor dies (``PR_SET_PDEATHSIG``), maybe twice for one death (see ``_on_hang_up``).
        self.hang_up_signal: signal.Signals | None = None
        #: The process started with the hang-up ignored (``nohup``): a hang-up while the supervisor is this
        #: process's parent is a terminal's, ignored as ``nohup`` asked; the death's notice comes from init.
        self.hang_up_ignored = False
        self._hung_up = False
        self.exit_code = 0

    def stop(self) -> None:
        """Ask the worker to stop gracefully (safe to call from the event loop's thread)."""
        self._stopping = True
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def run(self) -> None:
        """Run until stopped (or drained, with ``burst``). With ``cpu``, every thread of this process
        runs on that CPU meanwhile (see ``conveyor/worker/_cpu.py``).

        A handler's ``loop.stop()`` is refused (it raises in the handler and fails its attempt), and so
        is its cancel of a task it did not start (the worker's loops, the slots running other handlers:
        ``cancel()`` returns False, logged once, and its attempt fails), unless your loop has a task
        factory of its own; the task that awaits this method is yours, not guarded. A
        stop that cannot be traced to a handler (scheduled from a thread the handler started, or on a
        loop that takes no guard, such as uvloop's) stops the loop: :meth:`run_sync` runs it again,
        but under your own ``asyncio.run`` that ends the run with every task cancelled, as a crash
        does (running and prefetched jobs come back when their leases expire; a completed job whose
        outcome was not written yet runs again)."""
        self._stop_requested = asyncio.Event()
        if self._stopping:
            self._stop_requested.set()
        unpin = _cpu.pin(self.config.cpu) if self.config.cpu is not None else None
        loop = asyncio.get_running_loop()
        guarded = guard_tasks(loop)
        own = worker_tasks.set(True)
        try:
            await self._run(self._stop_requested)
        finally:
            worker_tasks.reset(own)
            if guarded:
                unguard_tasks(loop)
            if unpin is not None:
                unpin()

    async def _run(self, stop_requested: asyncio.Event) -> None:
        backend = self.app.backend
        if self._keeps_database_time:
            await self._read_database_clock()
        loops = build_loops(
            self.app.catalogue,
            self.app.producer,
            backend,
            self.config,
            self.queues,
            self.clock,
            counters=self.counters,
            on_stuck=self._on_stuck,
            observer=self.observer,
            database_time=self._keeps_database_time,
        )
        if self._metrics is not None:
            held = loops.registry
            self._metrics.in_flight.set_function(lambda: float(len(held)))
        log.info(
            "worker %s: queues %s, concurrency %d, engine %s",
            self.worker_id,
            ",".join(self.queues),
            self.config.concurrency,
            backend.engine,
        )
        tasks = {loop: asyncio.create_task(loop.run(), name=loop.name) for loop in loops.all()}
        stall = StallWatch(loops.heartbeat, loops.executor, self.clock)
        stall.start()
        try:
            watch = asyncio.create_task(self._watch(loops), name="watch")
            stop_wait = asyncio.create_task(stop_requested.wait())
            done, _ = await asyncio.wait({stop_wait, *tasks.values()}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is stop_wait:
                    continue
                # A loop ended on its own: the worker cannot go on without it. Stop the way that loses
                # nothing (what is buffered goes back, running handlers finish, outcomes are flushed) and
                # exit non-zero, so that a supervisor restarts the process (unless the database is damaged).
                error = task.exception()
                if error is not None:
                    self._failed(f"worker loop {task.get_name()} failed", error, "stopping")
                else:
                    self.exit_code = max(self.exit_code, 1)
                    log.error("worker loop %s ended unexpectedly; stopping", task.get_name())
            watch.cancel()
            stop_wait.cancel()
            await self._shut_down(loops, tasks)
        except asyncio.CancelledError:
            # Cut short (a Ctrl-C under run_sync(install_signals=False), your cancel of Worker.run): as a
            # crash, what runs and what is unwritten is left to its lease; but the loop's connections
            # are closed now, not left open to the garbage collector.
            for task in tasks.values():
                task.cancel()
            loops.calls.shutdown(wait=False)
            raise
        finally:
            stall.stop()
        log.info("worker %s stopped: %s", self.worker_id, self.counters.as_dict())

    async def _shut_down(self, loops: Loops, tasks: dict[Any, asyncio.Task[None]]) -> None:
        # 1. Stop fetching; let an acquire under way land in the buffer rather than vanish.
        loops.fetcher.stop()
        await asyncio.wait({tasks[loops.fetcher]}, timeout=30)
        # 2. Hand buffered-but-unstarted jobs back to pending at once.
        await self._release_buffered(loops)
        # 3. Let running handlers finish within the graceful timeout (heartbeats keep their leases).
        loops.executor.stop()
        executor = tasks[loops.executor]
        await asyncio.wait({executor}, timeout=self.config.graceful_timeout)
        if not executor.done():
            cut = loops.executor.running
            executor.cancel()
            await asyncio.wait({executor}, timeout=2.0)
            log.warning(
                "%d handler(s) still running after %ss; their leases will expire", cut, self.config.graceful_timeout
            )
        # 4. Flush every outcome, then stop the maintenance loops.
        loops.completer.stop()
        await asyncio.wait({tasks[loops.completer]})
        if not loops.completer.flushed_all:
            self.exit_code = max(self.exit_code, 1)
        for loop in (loops.heartbeat, loops.rescuer, loops.scheduler, loops.pruner, loops.presence):
            loop.stop()
        # The presence loop ends its round rather than being cancelled: a cancelled round's write runs
        # on in its database thread and could store the worker's row again after leave() deleted it.
        await asyncio.wait({tasks[loops.presence]}, timeout=10)
        for loop in (loops.heartbeat, loops.rescuer, loops.scheduler, loops.pruner, loops.presence):
            tasks[loop].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        try:
            await loops.presence.leave()
        except BackendCorrupt as exc:  # anything else only leaves the row to go stale (see leave)
            self._failed("leaving the worker registry failed", exc, "stopping")
        loops.calls.shutdown()

    async def _read_database_clock(self) -> None:
        """Have the app's clock read the database's before the loops judge any lease by it (bounded: a
        database that is away is the loops' to wait for, with their retries)."""
        await asyncio.to_thread(self.app.clock.measure, _CLOCK_READ_TIMEOUT)

    def _failed(self, what: str, error: BaseException, then: str) -> None:
        """A loop or a step of the stop failed: one line (the database's message says what; a traceback
        only for what is not the database's), and a non-zero exit, ``EXIT_DAMAGED`` for a damaged one."""
        self.exit_code = max(self.exit_code, exit_code(error))
        if isinstance(error, BackendError):
            log.error("%s: %s; %s", what, error, then)
        else:
            log.error("%s; %s", what, then, exc_info=error)

    async def _release_buffered(self, loops: Loops) -> None:
        try:
            await self._release(loops)
        except Exception as exc:  # the stop goes on: running handlers finish, outcomes are flushed
            self._failed("handing buffered jobs back failed", exc, "their leases will expire")

    async def _release(self, loops: Loops) -> None:
        refs: list[LeaseRef] = []
        for delivery in loops.buffer.drain():
            held = loops.registry.get(delivery.id, delivery.receipt)
            if held is not None and not held.lost:
                refs.append(LeaseRef(delivery.id, delivery.receipt))
            loops.registry.drop(delivery.id, delivery.receipt)
        if refs:
            deadline = asyncio.get_running_loop().time() + 30
            calls = loops.calls
            released = await calls.call_batch(
                calls.backend.jobs_release_many,
                refs,
                partial(JobsReleaseParams, now=self.clock()),
                give_up=lambda: asyncio.get_running_loop().time() > deadline,
                what="release",
            )
            self.counters.released += released

    async def _watch(self, loops: Loops) -> None:
        """With ``burst``: stop once the worker is idle and its queues hold no live job."""
        if not self.config.burst:
            return
        try:
            await self._until_drained(loops)
        except Exception as exc:  # it could no longer tell: stop rather than run on unseen
            self._failed("the burst's watch failed", exc, "stopping")
            self.stop()

    async def _until_drained(self, loops: Loops) -> None:
        calls = loops.calls
        while True:
            await asyncio.sleep(0.1)
            if not (
                loops.fetcher.idle
                and loops.executor.running == 0
                and loops.completer.backlog == 0
                and len(loops.registry) == 0
            ):
                continue
            stats = await calls.call(calls.backend.queues_stats, QueuesStatsParams(self.clock()))
            live = sum(s.pending + s.scheduled + s.processing for s in stats if s.queue in self.queues)
            if live == 0:
                log.info("burst: queues %s drained", ",".join(self.queues))
                self.stop()
                return

    def run_sync(
        self,
        install_signals: bool = True,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
    ) -> int:
        """Run in a new event loop until stopped; return the exit code.

        With ``install_signals``, the first SIGTERM/SIGINT stops gracefully and a second one exits
        at once (leases then expire and rescue returns the jobs). A ``loop.stop()`` the worker did not
        ask for (one a handler scheduled from a thread of its own, say: the executor refuses those it
        can tell are a handler's) does not end it: the loop is run again where it stopped."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            installed: list[signal.Signals] = []
            if install_signals:
                for sig in signals:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
            death = self.hang_up_signal
            if death is not None and death not in installed:
                loop.add_signal_handler(death, self._on_hang_up)
                installed.append(death)
            alarm = getattr(signal, "SIGALRM", None)
            if install_signals and alarm is not None and signal.getsignal(alarm) == signal.SIG_DFL:
                # An alarm a handler armed (signal.alarm works from any thread) and left behind ended the
                # whole process when it went off, its other jobs with it. Nothing else here uses SIGALRM.
                loop.add_signal_handler(alarm, self._on_alarm)
                installed.append(alarm)
            # The parent-death signal too: a child a handler forked must not share its handler (the loop's, which
            # writes to the worker's wake-up socket: a SIGHUP the handler sent its child stopped the worker, and
            # the child lived on).
            _threads.keep_worker_signals(tuple(installed))
            _threads.keep_recursion_limit(True)
            try:
                await self.run()
            finally:
                _threads.keep_worker_signals(())
                _threads.keep_recursion_limit(False)
                # While the loop's self-pipe is still open: asyncio closes it before it removes the handlers,
                # and a signal in between printed "Exception ignored when trying to write to the signal wakeup
                # fd: OSError: [Errno 9] Bad file descriptor". The worker is done: a late signal finds the
                # default disposition (a late parent-death signal: ignored).
                for sig in installed:
                    loop.remove_signal_handler(sig)
                if death is not None:
                    signal.signal(death, signal.SIG_IGN)

        _run_to_the_end(main())
        return self.exit_code

    def _on_stuck(self, stuck: int) -> None:
        # A thread cannot be stopped, so a handler that hangs past its timeout keeps one for good; a
        # worker with as many of those as slots only gets them back as a new process.
        log.error(
            "%d handler thread(s) hang past their timeout; stopping so that a supervisor restarts this process", stuck
        )
        self.exit_code = 1
        self.stop()

    def _on_hang_up(self) -> None:
        """A hang-up (the terminal closed, or the supervisor died): stop gracefully, once. The kernel sends a
        supervised process the signal each time it is handed to a new parent: when a supervisor with several
        threads is killed, first (often) to another of its threads, then to init; a second notice counted as an
        operator's second SIGTERM exited at once."""
        if self._hung_up:
            return
        if self.hang_up_ignored and self.supervisor is not None and os.getppid() == self.supervisor:
            return
        self._hung_up = True
        then = "the graceful stop goes on" if self._stopping else "stopping gracefully"
        if self.supervisor is None:  # a terminal's, an operator's
            log.warning("hang-up (%s): %s", self.hang_up_signal.name if self.hang_up_signal else "signal", then)
        else:
            # Not told apart from an operator's SIGHUP: the first notice of a killed supervisor with threads can
            # come while getppid() is still its pid. (An operator's: the supervisor, alive, starts a new process.)
            log.warning("the worker supervisor (pid %s) is gone: %s", self.supervisor, then)
            self.supervisor = None
        self.stop()

    def _on_alarm(self) -> None:
        log.error(
            "SIGALRM: an alarm went off that nothing in the worker waits for (a handler's signal.alarm() or "
            "setitimer() left armed after it returned?): ignored; it would have ended this process"
        )

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.supervisor is not None and os.getppid() != self.supervisor:
            # Once only: a SIGTERM after this one is an operator's again (a second one exits at once).
            then = "the graceful stop goes on" if self._stopping else "stopping gracefully"
            log.warning("the worker supervisor (pid %d) is gone: %s", self.supervisor, then)
            self.supervisor = None
            self.stop()
            return
        self._stop_signals += 1
        if self._stopping and self.supervisor_stops is not None:
            by_supervisor = self.supervisor_stops()
            if by_supervisor < 2 and self._stop_signals - by_supervisor < 2:
                # A signal to the whole process group comes directly and forwarded by the supervisor: one stop.
                log.info("%s: not a second stop (no sender sent two); the graceful stop goes on", sig.name)
                return
        if self._stopping:
            log.warning("second %s: exiting at once", sig.name)
            os._exit(1)
        log.info("%s: stopping gracefully (send again to exit at once)", sig.name)
        self.stop()


def _run_to_the_end(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``, except that a stop of the loop before ``main`` ends resumes it.

    Before, ``loop.stop()`` from any code the loop ran ended ``asyncio.run`` ("Event loop stopped before
    Future completed"), which cancelled every task: running handlers, prefetched jobs and unwritten
    outcomes were left to their leases, and completed jobs ran again."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:  # as asyncio.run says (and not a resume without end: runner.run would refuse each time)
        main.close()
        raise RuntimeError("Worker.run_sync() cannot be called from a running event loop: await Worker.run()")
    with asyncio.Runner() as runner, _Interrupts(runner.get_loop()) as interrupts:
        # From the start: the run's own tasks are the worker's too (a handler cannot cancel them).
        guard_tasks(runner.get_loop())
        context = contextvars.copy_context()
        context.run(worker_tasks.set, True)
        task = interrupts.task = runner.get_loop().create_task(main, name="worker", context=context)
        while True:
            try:
                runner.run(_awaited(task), context=context)
                return
            except asyncio.CancelledError:
                if interrupts.count:
                    raise KeyboardInterrupt from None
                raise
            except RuntimeError:
                if task.done():
                    raise
            # Not done and not running: the loop was stopped under it (run_until_complete's error).
            log.error("the event loop was stopped (loop.stop()) while the worker ran; running it again")


class _Interrupts:
    """Ctrl-C as ``asyncio.Runner`` takes it (the first cancels the run's ``task``, which then ends in
    KeyboardInterrupt; the next raises KeyboardInterrupt at once), while no SIGINT handler of the
    worker's or yours is in place (``run_sync(install_signals=False)``).

    The Runner's own cancel ran in the context of whatever code the signal interrupted: in a handler's,
    the worker's tasks refused it as that handler's (see ``executor.guard_tasks``), and the worker ran
    on. This one runs in an empty context."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.task: asyncio.Task[None] | None = None
        self.count = 0
        self._installed = False

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count == 1 and self.task is not None and not self.task.done():
            self.loop.call_soon_threadsafe(self.task.cancel, context=contextvars.Context())
            return
        raise KeyboardInterrupt


async def _awaited(task: asyncio.Task[None]) -> None:
    # Awaited, not shielded: a Ctrl-C that asyncio.Runner turns into a cancellation reaches the worker.
    await task


def _observers(config: WorkerConfig, extra: Observer | None) -> tuple[Any, Observer]:
    """The worker's metrics (or None) and the chain of observers its loops call."""
    chain: list[Observer] = []
    metrics = None
    tracing = config.tracing
    if tracing is None:
        from conveyor._otel import available

        tracing = available()
    if tracing:
        from conveyor.tracing import HandlerTracing

        chain.append(HandlerTracing())
    if config.metrics_port is not None:
        try:
            from conveyor.metrics import WorkerMetrics, serve_worker_metrics
        except ImportError as exc:
            raise ConfigurationError(f"metrics need: pip install 'conveyor[metrics]' ({exc})") from None
        metrics = WorkerMetrics()
        try:
            serve_worker_metrics(metrics, config.metrics_port, config.metrics_host)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {config.metrics_host}:{config.metrics_port}: {exc.strerror or exc}"
            ) from None
        log.info("metrics on http://%s:%d/metrics", config.metrics_host, config.metrics_port)
        chain.append(metrics)
    if extra is not None:
        chain.append(extra)
    if not chain:
        return metrics, NO_OBSERVER
    return metrics, chain[0] if len(chain) == 1 else Observers(chain)


def _warn_of_leases_between_heartbeats(app: App, queues: Sequence[str], heartbeat_interval: float | None) -> None:
    """Warn of the drained tasks whose lease a configured heartbeat interval is not shorter than.

    WorkerConfig refuses an interval not shorter than its own default lease; a task may set a shorter one,
    and its jobs that run longer than it are then rescued and run again while they run. Not refused: a
    test may leave leases to expire on purpose."""
    if heartbeat_interval is None:
        return
    short = sorted(
        task.name
        for task in app.catalogue.tasks.values()
        if task.options.queue in queues and task.options.visibility_timeout <= heartbeat_interval
    )
    if short:
        log.warning(
            "heartbeat_interval %g s is not shorter than the visibility_timeout of task(s) %s: their jobs that run "
            "longer than their lease will be delivered again while they run",
            heartbeat_interval,
            ", ".join(preview(name, 100) for name in short[:10])
            + (f" and {len(short) - 10} more" if len(short) > 10 else ""),
        )
