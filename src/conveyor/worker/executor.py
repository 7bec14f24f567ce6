"""The execute loop: ``concurrency`` slots run handlers; ``async def`` ones in coroutines on the event
loop, plain ``def`` ones in threads that loop by themselves (see :mod:`conveyor.worker._buffer`).

A slot takes a leased job from the prefetch buffer, decides whether it may run (poison, TTL, unknown
task), runs it, and hands the outcome to the completer, which counts the start with it. A suspect job
(its lease once expired) is counted before it runs instead (batched with the other slots' suspects), so
that a job which kills its workers is counted. Whatever the handler raises or does (an exception of any
kind, a hang past its timeout, a cancellation of its own task or of the worker's, a stop of the event
loop) is that job's outcome; the slot itself carries on. A process the handler forked never runs worker
code: it exits as soon as it comes back into it (see :func:`conveyor.worker._threads.leave_forked_child`)
or its loop comes to a callback that is not its handler's (see ``_after_fork_in_child``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from functools import partial
from types import CoroutineType
from typing import Any

from conveyor._catalogue import Catalogue
from conveyor._context import JobContext
from conveyor._errors import HandlerTimeout
from conveyor._message import decode_payload
from conveyor._outcomes import Outcome, before_run, on_failure, on_manual, on_success
from conveyor._task import Task
from conveyor.backends.base import Delivery, JobsStartParams, LeaseRef, LeasesExtendParams
from conveyor.worker import _threads
from conveyor.worker._buffer import Buffer
from conveyor.worker._calls import BackendCalls
from conveyor.worker._observe import NO_OBSERVER, Observer
from conveyor.worker._service import Service
from conveyor.worker._state import Counters, Held, Registry
from conveyor.worker._threads import exit_code_of, leave_forked_child, process_id, restore_worker_signals
from conveyor.worker.completer import Completer

log = logging.getLogger("conveyor.worker")


class _ThreadSlot:
    """One thread that runs ``def`` handlers, one job at a time, until the buffer closes.

    A Python thread cannot be stopped: when its handler hangs past the task's timeout, the watchdog
    (:meth:`Executor._watch`) gives the slot up — the job gets its timeout outcome, the slot's permit
    goes back and a new slot takes its place — and the thread ends whenever the call returns, its
    result dropped. The lock orders that against the handler returning at the same moment."""

    def __init__(self, executor: Executor, number: int) -> None:
        self.executor = executor
        self.lock = threading.Lock()
        #: The job running now, its task and when it must be given up (None: no timeout).
        self.job: tuple[Delivery, Task[Any, Any]] | None = None
        self.deadline: float | None = None
        self.abandoned = False
        #: The outcome the watchdog gave the job when it gave the slot up.
        self.timed_out: Outcome | None = None
        self.thread = threading.Thread(target=self.run, name=f"conveyor-handler-{number}", daemon=True)

    def run(self) -> None:
        executor, buffer = self.executor, self.executor.buffer
        try:
            release = False
            while (delivery := buffer.take_blocking(release)) is not None:
                release = True
                try:
                    executor.process_blocking(delivery, self)
                except Exception:
                    log.exception("internal error processing job %s", delivery.id)
                    executor.registry.drop(delivery.id, delivery.receipt)
                finally:
                    buffer.suspect_done(delivery)
                if self.abandoned:
                    return  # the watchdog gave this slot's permit back already
        finally:
            executor.slot_ended(self)


class Starts:
    """Counts suspect deliveries as started, batching the slots that start at the same time.

    The count must be stored before the handler runs (poison protection reads it), so a slot waits for
    it; slots that take suspects while a statement is in flight share the next one (a group commit)."""

    def __init__(self, calls: BackendCalls, clock: Callable[[], datetime]) -> None:
        self.calls = calls
        self.clock = clock
        self._waiting: list[tuple[Delivery, asyncio.Future[bool]]] = []
        self._flushing = False

    async def start(self, delivery: Delivery) -> bool:
        """Count ``delivery`` as started; False if its lease was lost meanwhile."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((delivery, future))
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush(), name="starts")
        return await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                refs = [LeaseRef(d.id, d.receipt) for d, _ in batch]
                params = partial(JobsStartParams, now=self.clock())
                try:
                    starts = self.calls.backend.jobs_start_many
                    started = set(await self.calls.call_batch(starts, refs, params, what="start"))
                except BaseException as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for delivery, future in batch:
                    if not future.done():
                        future.set_result(delivery.id in started)
        finally:
            self._flushing = False


class Executor(Service):
    """Runs deliveries from the buffer through their task's handler and hands outcomes to the completer.

    ``run()`` runs ``concurrency`` coroutine slots, and as many thread slots if a task is a plain
    ``def`` (they share the buffer's ``concurrency`` permits), until :meth:`stop`, after which each
    slot ends once its handler returns (the worker cancels the run past its graceful timeout).
    ``on_stuck`` is called once when as many handler threads hang past their timeout as there are
    slots: a thread cannot be stopped, so only a new process gets them back."""

    name = "executor"
    observer: Observer = NO_OBSERVER
    #: How often the watchdog looks for ``def`` handlers past their timeout (its precision).
    watch_interval = 0.02

    def __init__(
        self,
        catalogue: Catalogue,
        calls: BackendCalls,
        registry: Registry,
        counters: Counters,
        buffer: Buffer,
        completer: Completer,
        concurrency: int,
        clock: Callable[[], datetime],
        on_stuck: Callable[[int], None] = lambda stuck: None,
    ) -> None:
        super().__init__()
        self.catalogue = catalogue
        self.backend = calls.backend
        self.registry = registry
        self.counters = counters
        self.buffer = buffer
        self.completer = completer
        self.concurrency = concurrency
        self.clock = clock
        self.on_stuck = on_stuck
        self.starts = Starts(calls, clock)
        # Thread slots share the counters with the event loop: their increments take this lock.
        self._tally = threading.Lock()
        self._slots: set[_ThreadSlot] = set()
        self._slots_started = 0
        self._stuck = 0
        self._stuck_reported = False
        self._slots_ended = asyncio.Event()
        #: The task running :meth:`run`, and whether it cancels its slots (see _cancelling_slots).
        self._runner: asyncio.Task[Any] | None = None
        self._cancelling = False
        #: The worker's process: one a handler forks leaves as soon as it comes back (see _call).
        self.pid = process_id()
        #: The handler runs under way on the event loop, by the task they run in.
        self.runs: dict[asyncio.Task[Any], _Running] = {}

    @property
    def running(self) -> int:
        """Handlers running now (slots holding a permit)."""
        return self.buffer.running

    def run_of(self, task: asyncio.Task[Any] | None) -> Delivery | None:
        """The delivery whose handler run ``task`` belongs to: a slot running it, its timeout's task, or a
        task the handler started (None: a task of the worker's own, of code outside any handler, or of
        another worker's handler on the same loop). Safe to call from another thread: it reads, and the
        loop's thread writes each entry whole."""
        if task is None:
            return None
        run = self.runs.get(task)
        if run is None and isinstance(task, _Task):
            run = task.started_by
        return None if run is None or run.executor is not self else run.delivery

    # The worker passes itself as the lease keeper so that ``ctx.extend`` reaches the database.
    def extend(self, delivery: Delivery, seconds: float) -> bool:
        held = self.registry.get(delivery.id, delivery.receipt)
        if held is None or held.lost:
            return False
        params = LeasesExtendParams([LeaseRef(delivery.id, delivery.receipt)], seconds, self.clock())
        extended = self.backend.leases_extend_many(params)
        if delivery.id in extended:
            held.visibility_timeout = seconds
            return True
        held.lost = True
        return False

    def _admit(self, delivery: Delivery) -> tuple[Held, Task[Any, Any] | None, Outcome | None] | None:
        """The job's entry, its task and the outcome that ends it unrun (poison, TTL, unknown task);
        None when its lease was lost before it started."""
        held = self.registry.get(delivery.id, delivery.receipt)
        if held is None or held.lost:
            self.registry.drop(delivery.id, delivery.receipt)
            return None
        task = self.catalogue.tasks.get(delivery.task)
        options = task.options if task else None
        on_expire = self.catalogue.queue_options(delivery.queue).on_expire
        return held, task, before_run(delivery, options, self.clock(), on_expire)

    def _started(self, held: Held, started: bool) -> bool:
        """Mark a job started (``started``: its suspect start was counted), or its lease lost."""
        if not started:
            held.lost = True
            with self._tally:
                self.counters.lost_leases += 1
            self.registry.drop(held.delivery.id, held.delivery.receipt)
            return False
        held.state = "running"
        with self._tally:
            self.counters.started += 1
        return True

    async def process(self, delivery: Delivery, slot: asyncio.Task[Any] | None = None) -> Outcome | None:
        """Run one delivery and queue its outcome; None when its lease was lost before it started.

        ``slot``: the coroutine slot's task this runs in (None: the caller's own, as the testing kit
        runs it, whose cancellation is always the caller's)."""
        admitted = self._admit(delivery)
        if admitted is None:
            return None
        held, task, outcome = admitted
        if outcome is None:
            assert task is not None
            counted = True
            if delivery.rescues and not held.counted:
                # A suspect: its lease expired before, maybe because it killed its worker. Count this
                # start before it runs, so that it is counted even if it kills this worker too.
                counted = held.counted = await self.starts.start(delivery)
            if not self._started(held, counted):
                return None
            token = self.observer.before_run(delivery, self.clock())
            began = time.perf_counter()
            running = _Running(slot if slot is not None else asyncio.current_task(), delivery, self)
            reset = _running.set(running)
            runs_in = running.task  # the slot (a timeout's task replaces it in running.task)
            if runs_in is not None:
                self.runs[runs_in] = running
            try:
                if task.is_async:
                    outcome = await self._run_async(task, delivery, slot)
                    _signals_kept(running, task.name)
                else:
                    outcome = await self._run_sync(task, delivery)
                if running.refused is not None:
                    outcome = on_failure(delivery, task.options, running.refused, self.clock())
            finally:
                _running.reset(reset)
                if runs_in is not None:
                    self.runs.pop(runs_in, None)
                self.observer.after_run(delivery, outcome, time.perf_counter() - began, token)
        self.completer.add(outcome)
        return outcome

    def process_blocking(self, delivery: Delivery, slot: _ThreadSlot) -> None:
        """Run one delivery of a ``def`` task in the calling thread slot and queue its outcome."""
        admitted = self._admit(delivery)
        if admitted is None:
            return
        held, task, outcome = admitted
        if outcome is None:
            assert task is not None and self.buffer.loop.loop is not None
            counted = True
            if delivery.rescues and not held.counted:
                # As in process(): the start is counted before the handler runs, on the event loop
                # (batched with the other slots' suspects); this thread waits for it.
                start = asyncio.run_coroutine_threadsafe(self.starts.start(delivery), self.buffer.loop.loop)
                counted = held.counted = start.result()
            if not self._started(held, counted):
                return
            timeout = task.options.timeout
            with slot.lock:
                slot.job = (delivery, task)
                slot.deadline = None if timeout is None else time.monotonic() + timeout
            token = self.observer.before_run(delivery, self.clock())
            began = time.perf_counter()
            running = _Running(None, delivery, self)
            reset = _running.set(running)
            try:
                outcome = self._call(task, delivery)
            finally:
                _running.reset(reset)
            if running.refused is not None:
                outcome = on_failure(delivery, task.options, running.refused, self.clock())
            with slot.lock:
                slot.job = slot.deadline = None
                abandoned = slot.abandoned
            if abandoned:
                # The watchdog gave the job its outcome (a timeout) and this slot up.
                self.observer.after_run(delivery, slot.timed_out, time.perf_counter() - began, token)
                self._unstick()
                return
            self.observer.after_run(delivery, outcome, time.perf_counter() - began, token)
        self.completer.add(outcome)

    def _call(self, task: Task[Any, Any], delivery: Delivery) -> Outcome:
        """Call a ``def`` handler with the job's arguments; its outcome, whatever it raises."""
        try:
            ctx, kwargs = self._arguments(task, delivery)
            try:
                result = task.fn(**kwargs)
            finally:
                # Inline, at the handler's caller's depth: a call more may not fit under the limit it left.
                lowered = sys.getrecursionlimit()
                if lowered < _threads.recursion_limit:
                    sys.setrecursionlimit(_threads.recursion_limit)
                    _limit_lowered(task.name, lowered)
        except BaseException as exc:
            if process_id() != self.pid:
                leave_forked_child(f"the handler of {task.name}", exit_code_of(exc))
            # Anything a handler raises, SystemExit and KeyboardInterrupt from library code included,
            # is a failed attempt of its job, never the end of the worker. (A real Ctrl-C or SIGTERM
            # reaches the worker's signal handlers, not the handler.)
            return on_failure(delivery, task.options, exc, self.clock())
        if process_id() != self.pid:
            leave_forked_child(f"the handler of {task.name}", 0)
        if type(result) is CoroutineType:
            # A plain function that returned a coroutine (a wrapper without functools.wraps around an
            # async def): its work never ran here. Completing the job would lose it.
            with contextlib.suppress(BaseException):
                result.close()
            error = TypeError(
                f"handler returned {type(result).__name__} that was never awaited: declare the task async def "
                "(a decorator around it must keep functools.wraps)"
            )
            return on_failure(delivery, task.options, error, self.clock())
        return self._returned(task, delivery, ctx, result)

    async def _run_async(self, task: Task[Any, Any], delivery: Delivery, slot: asyncio.Task[Any] | None) -> Outcome:
        """Run an ``async def`` handler: in ``slot`` (the coroutine slot's own task; None: the caller's
        task, as the testing kit runs it), or in a task of its own with a timeout."""
        cancels = slot.cancelling() if slot is not None else 0
        try:
            ctx, kwargs = self._arguments(task, delivery)
            if task.options.timeout is None:
                try:
                    result = await task.fn(**kwargs)
                finally:
                    lowered = sys.getrecursionlimit()  # inline: see _call
                    if lowered < _threads.recursion_limit:
                        sys.setrecursionlimit(_threads.recursion_limit)
                        _limit_lowered(task.name, lowered)
            else:
                result = await self._within(task.fn(**kwargs), task.options.timeout, task.name)
        except BaseException as exc:
            if process_id() != self.pid:
                leave_forked_child(f"the handler of {task.name}", exit_code_of(exc))
            if isinstance(exc, _Raised):
                return on_failure(delivery, task.options, exc.exc, self.clock())
            if isinstance(exc, asyncio.CancelledError):
                if slot is None:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # the caller's task is being cancelled: not the handler's outcome
                elif slot.cancelling() > cancels:
                    if self._cancelling_slots():
                        raise  # this slot is being stopped: not the handler's outcome
                    # The handler cancelled its slot's task (asyncio.current_task().cancel()): that
                    # stopped the slot, and the worker with it. It is this attempt's failure.
                    _uncancel(slot, cancels)
                    return on_failure(delivery, task.options, _own_cancel(exc), self.clock())
            return on_failure(delivery, task.options, exc, self.clock())
        if process_id() != self.pid:
            leave_forked_child(f"the handler of {task.name}", 0)
        if slot is not None and slot.cancelling() > cancels and not self._cancelling_slots():
            # The handler cancelled its own task and returned: a cancellation it did not take yet
            # would be thrown into this slot's next await (its next job's handler). Take it here.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError as exc:
                if self._cancelling_slots():
                    raise
                _uncancel(slot, cancels)
                return on_failure(delivery, task.options, _own_cancel(exc), self.clock())
            _uncancel(slot, cancels)  # it took the cancellation and went on: its result stands
        return self._returned(task, delivery, ctx, result)

    def _cancelling_slots(self) -> bool:
        """Whether the worker cancels its slots (a stop past the graceful timeout, the end of the
        event loop): a cancellation then is the worker's, never a handler's own."""
        return self._cancelling or (self._runner is not None and self._runner.cancelling() > 0)

    def _arguments(self, task: Task[Any, Any], delivery: Delivery) -> tuple[JobContext, dict[str, Any]]:
        """The job's context and the handler's keyword arguments (PayloadError for a stored payload that is
        not a JSON object Python can read)."""
        ctx = JobContext(delivery, keeper=self, backend=self.backend)
        kwargs = decode_payload(delivery.payload)
        if task.wants_context:
            kwargs["ctx"] = ctx
        return ctx, kwargs

    def _returned(self, task: Task[Any, Any], delivery: Delivery, ctx: JobContext, result: Any) -> Outcome:
        """The outcome of a handler that returned: completed, or its manual decision."""
        if task.options.ack_policy == "manual":
            return on_manual(delivery, task.options, ctx, self.clock())
        return on_success(delivery, task.options, result)

    async def _within(self, call: Any, timeout: float, name: str) -> Any:
        # Not asyncio.wait_for: it waits for the cancelled handler to finish, and a handler that
        # swallows the cancellation would then hold this slot for ever.
        running = asyncio.ensure_future(_carried(call, self.pid, name))
        run = _running.get()
        if run is not None:
            run.task = running  # the task the handler runs in: its own to cancel, no other handler's
        try:
            done, _ = await asyncio.wait({running}, timeout=timeout)
        except asyncio.CancelledError:
            running.cancel()  # the slot is stopped: so is its handler, as one without a timeout
            running.add_done_callback(_consume)
            raise
        if not done:
            running.cancel()
            running.add_done_callback(_consume)
            raise HandlerTimeout(f"handler ran longer than {timeout}s")
        if running.cancelled() and running.cancelling():
            try:
                running.result()
            except asyncio.CancelledError as exc:
                raise _own_cancel(exc) from None
        return running.result()

    async def _run_sync(self, task: Task[Any, Any], delivery: Delivery) -> Outcome:
        """A ``def`` handler run from the event loop (the testing kit drives the executor that way, and
        a task registered after the worker started has no thread slots; the worker's thread slots call
        ``_call`` in their own thread): in a daemon thread of its own, in the slot's context, so that
        what the slot set for it (the job's span) is current there too."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        context = contextvars.copy_context()

        def call() -> None:
            outcome = context.run(self._call, task, delivery)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, done, outcome)

        threading.Thread(target=call, name="conveyor-handler", daemon=True).start()
        timeout = task.options.timeout
        finished, _ = await asyncio.wait({done}, timeout=timeout)
        if not finished:
            done.cancel()
            return self._timed_out(task, delivery)
        return done.result()

    def _timed_out(self, task: Task[Any, Any], delivery: Delivery) -> Outcome:
        timeout = task.options.timeout
        log.warning("handler of %s ran past its %ss timeout; its thread is abandoned", task.name, timeout)
        return on_failure(delivery, task.options, HandlerTimeout(f"handler ran longer than {timeout}s"), self.clock())

    async def _slot(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        release = False
        while True:
            try:
                delivery = await self.buffer.take(release)
            except asyncio.CancelledError:
                if not self._stray_cancel(me):
                    raise  # the worker's
                release = False  # take() gives its permit back before it waits
                continue
            if delivery is None:
                return
            release = True
            try:
                await self.process(delivery, me)
            except asyncio.CancelledError:
                if not self._stray_cancel(me):
                    raise
                self.registry.drop(delivery.id, delivery.receipt)  # as an internal error: see below
            except Exception:
                # A bug in Conveyor itself, or a database that refused the start: forget the job, so
                # that its lease is no longer extended; it expires and rescue hands the job out again.
                log.exception("internal error processing job %s", delivery.id)
                self.registry.drop(delivery.id, delivery.receipt)
            finally:
                self.buffer.suspect_done(delivery)

    def _stray_cancel(self, slot: asyncio.Task[Any]) -> bool:
        """A cancellation reached ``slot`` outside a handler: False if it is the worker's (the caller
        raises it again); else (a handler's, late: ``loop.call_later(1, asyncio.current_task().cancel)``)
        take it back and say True: the slot goes on, rather than end, and the worker with it."""
        if self._cancelling_slots() or not slot.cancelling():
            return False
        log.error("a cancellation of a handler slot's task that is not the worker's (a handler's, late): ignored")
        _uncancel(slot, 0)
        return True

    def _start_slot(self) -> None:
        slot = _ThreadSlot(self, self._slots_started)
        self._slots_started += 1
        self._slots.add(slot)
        slot.thread.start()

    def slot_ended(self, slot: _ThreadSlot) -> None:
        """A thread slot's thread ends (called in it)."""
        if not slot.abandoned:
            self.buffer.loop.call(lambda: self._forget(slot))

    def _forget(self, slot: _ThreadSlot) -> None:
        self._slots.discard(slot)
        if not self._slots:
            self._slots_ended.set()

    async def _threads_ended(self) -> None:
        await self._slots_ended.wait()

    def _unstick(self) -> None:
        with self._tally:
            self._stuck -= 1

    def _give_up(self, slot: _ThreadSlot, now: float) -> Outcome | None:
        """Abandon ``slot`` if its handler ran past its deadline: its timed-out outcome, else None."""
        with slot.lock:
            if slot.job is None or slot.deadline is None or now < slot.deadline:
                return None
            delivery, task = slot.job
            slot.timed_out = outcome = self._timed_out(task, delivery)
            slot.abandoned = True
            with self._tally:
                self._stuck += 1
        self.buffer.suspect_done(delivery)  # its thread may never return
        return outcome

    async def _watch(self) -> None:
        """Give up thread slots whose handler ran past its task's timeout (see :class:`_ThreadSlot`)."""
        while True:
            await asyncio.sleep(self.watch_interval)
            now = time.monotonic()
            for slot in list(self._slots):
                outcome = self._give_up(slot, now)
                if outcome is None:
                    continue
                self._slots.discard(slot)
                self.completer.add(outcome)
                self.buffer.release()
                if self.stopping:
                    if not self._slots:
                        self._slots_ended.set()
                else:
                    self._start_slot()
                if self._stuck >= self.concurrency and not self._stuck_reported:
                    self._stuck_reported = True
                    self.on_stuck(self._stuck)

    async def run(self) -> None:
        """Run the slots until stopped (and their handlers returned) or cancelled."""
        self.buffer.loop.bind()
        self._runner = asyncio.current_task()
        guarded = _guard_stop(asyncio.get_running_loop())
        tasks = [asyncio.create_task(self._slot(), name=f"slot-{i}") for i in range(self.concurrency)]
        plain = [t for t in self.catalogue.tasks.values() if not t.is_async]
        watch: asyncio.Task[None] | None = None
        if plain:
            # From now on deliveries of these tasks go to the thread slots (a task registered later
            # runs in a coroutine slot, its handler in a thread of its own: see _run_sync).
            self.buffer.threaded = frozenset(t.name for t in plain)
            for _ in range(self.concurrency):
                self._start_slot()
            tasks.append(asyncio.create_task(self._threads_ended(), name="thread-slots"))
            if any(t.options.timeout is not None for t in plain):
                watch = asyncio.create_task(self._watch(), name="watchdog")
        try:
            await asyncio.gather(*tasks)
        finally:
            self._cancelling = True
            if watch is not None:
                watch.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=1.0)
            if guarded is not None:
                _unguard_stop(asyncio.get_running_loop(), guarded)
            # Thread slots still running a handler are abandoned (daemons: they do not hold the
            # process's exit); their leases expire and rescue returns the jobs.

    def stop(self) -> None:
        """Let each slot end once its handler returns (buffered jobs are the worker's to hand back)."""
        super().stop()
        self.buffer.close()


class _Running:
    """One run of a handler, as the code it runs or schedules sees it (:data:`_running`)."""

    __slots__ = ("delivery", "executor", "refused", "task")

    def __init__(self, task: asyncio.Task[Any] | None, delivery: Delivery, executor: Executor) -> None:
        #: The delivery the handler runs for, and the worker's executor that runs it (two workers may
        #: share a loop: a task of one's handler is not the other's to name).
        self.delivery = delivery
        self.executor = executor
        #: The error of what the worker refused the handler (a ``loop.stop()``, a cancel of a task
        #: that is not its own): its attempt's failure.
        self.refused: BaseException | None = None
        #: The task the handler runs in (its slot, or the task of its timeout; None: a thread): its own
        #: to cancel, and no other handler's.
        self.task = task


#: The handler run this code belongs to: set around each handler, so that it is seen in the
#: handler, in a task of its own, in what it schedules on the loop (callbacks copy the context) and
#: in the thread of a ``def`` handler.
_running: contextvars.ContextVar[_Running | None] = contextvars.ContextVar("conveyor_running", default=None)

#: True in the worker's own context (set by ``Worker.run`` and ``run_sync``'s task): a task created there
#: outside any handler is the worker's. One created from a thread of yours (``run_coroutine_threadsafe``),
#: whose context is not the worker's, is not.
worker_tasks: contextvars.ContextVar[bool] = contextvars.ContextVar("conveyor_worker_tasks", default=False)


def _after_fork_in_child() -> None:
    """In a process a handler forked (a fork from its context): from now on the event loop it inherited
    runs only that handler's callbacks (its own task, what it awaits, the tasks it started); at the
    first of anyone else's (the worker's loops, the other handlers') the process leaves.

    Before, a child whose handler yielded (``await asyncio.sleep(0)``) ran the worker's loops and the
    other handlers' steps, on its copy of the parent's state, until one reached the database (where
    ``BackendCalls.once`` ended it)."""
    forked_by = _running.get()
    if forked_by is None or forked_by.task is None:  # not a handler's fork, or a thread's (no loop runs there)
        return
    inherited = forked_by.task.get_loop()  # (asyncio's running loop is None in a child: it checks the pid)
    run = asyncio.events.Handle._run

    def run_the_handlers_only(handle: asyncio.Handle) -> None:
        # Only the inherited loop is policed: a loop the child starts (asyncio.run in a multiprocessing
        # child) runs callbacks from threads whose context is empty (run_in_executor, getaddrinfo).
        if getattr(handle, "_loop") is inherited and getattr(handle, "_context").get(_running) is not forked_by:  # noqa: B009
            leave_forked_child("a handler (its loop came to a callback of the worker's or another handler's)", 1)
        run(handle)

    setattr(asyncio.events.Handle, "_run", run_the_handlers_only)  # noqa: B010 - mypy refuses an assignment to a method


os.register_at_fork(after_in_child=_after_fork_in_child)


def _signals_kept(running: _Running, name: str) -> None:
    """Put back the worker's handlers of its signals that an ``async def`` handler (on the loop's thread,
    where ``signal.signal`` works) replaced, and fail its attempt. A ``def`` handler's ``signal.signal``
    already raises ValueError (not the main thread)."""
    changed = restore_worker_signals()
    if not changed:
        return
    what = ", ".join(changed)
    armed = "; it left an alarm armed: cancelled" if "SIGALRM" in changed else ""
    log.error("the handler of %s replaced the worker's %s handler: put back%s", name, what, armed)
    if running.refused is None:
        running.refused = RuntimeError(
            f"the handler replaced the worker's {what} handler (signal.signal): put back{armed}"
        )


def _limit_lowered(name: str, lowered: int) -> None:
    """Say that the handler of task ``name`` lowered the recursion limit to ``lowered`` (put back by
    now), and fail its attempt."""
    log.error(
        "the handler of %s lowered the recursion limit to %d (sys.setrecursionlimit): put back to %d",
        name,
        lowered,
        sys.getrecursionlimit(),
    )
    running = _running.get()
    if running is not None and running.refused is None:
        running.refused = RuntimeError(
            f"the handler lowered the worker's recursion limit to {lowered} (sys.setrecursionlimit): put back"
        )


def _guard_stop(loop: asyncio.AbstractEventLoop) -> Callable[[], None] | None:
    """Make ``loop.stop()`` called from a handler (or what it scheduled) raise in it instead of stop the
    loop, and fail its attempt; the guard it put in place, or None if the loop cannot take one.

    A stopped loop ended ``asyncio.run`` with every task cancelled: the worker's other running jobs,
    its prefetched ones and its unwritten outcomes were left to their leases (run again, though
    completed). A stop from elsewhere still stops the loop (``run_until_complete`` ends that way);
    :meth:`Worker.run_sync` resumes a loop that a stop it did not ask for ended early."""
    stop = loop.stop

    def guarded() -> None:
        running = _running.get()
        if running is None:
            stop()
            return
        error = RuntimeError("the handler stopped the event loop (loop.stop()) that the worker runs on: refused")
        if running.refused is None:
            running.refused = error
        raise error

    try:
        setattr(loop, "stop", guarded)  # noqa: B010 - mypy refuses an assignment to a method
    except AttributeError:  # a loop without instance attributes (uvloop's): run_sync still resumes it
        return None
    return guarded


class _Task(asyncio.Task[Any]):
    """A task on the worker's event loop that knows which handler run started it (None: the worker).

    A handler may cancel the task it runs in and any task a handler started (its own, or one a library
    started in another handler and shares: a client's background task, say). Its cancel of the
    worker's own tasks (its loops, the slots) and of the task another handler runs in is refused
    (``cancel()`` returns False), logged once, and fails its attempt: ``for t in asyncio.all_tasks():
    t.cancel()`` in a handler ended the worker's loops, and the worker with them."""

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        loop: asyncio.AbstractEventLoop,
        context: contextvars.Context | None = None,
    ) -> None:
        super().__init__(coro, loop=loop, context=context)
        if context is None:
            self.started_by, workers = _running.get(), worker_tasks.get()
        else:
            self.started_by, workers = context.get(_running), context.get(worker_tasks, False)
        #: One of the worker's own tasks (its loops, slots, their helpers): created in its context, by no handler.
        self.workers = self.started_by is None and workers

    def cancel(self, msg: Any = None) -> bool:
        running = _running.get()
        started_by = self.started_by
        theirs = self.workers or (started_by is not None and started_by.task is self)
        if running is None or running.task is self or not theirs:
            return super().cancel(msg)
        if running.refused is None:
            log.error(
                "a handler cancelled tasks of the worker's own (first %r): refused; its attempt fails", self.get_name()
            )
            running.refused = RuntimeError(
                "the handler cancelled tasks of the worker's own (its loops, the other handlers): refused"
            )
        return False


#: How many runs of a worker guard each loop's tasks: the factory stays until the last of them ends.
_guarding: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()


def guard_tasks(loop: asyncio.AbstractEventLoop) -> bool:
    """Make the tasks created on ``loop`` from now on refuse a handler's cancel of what is not its own
    (see :class:`_Task`), until as many :func:`unguard_tasks` as calls that returned True; False if the
    loop has a task factory of your own (then left as it is)."""
    factory = loop.get_task_factory()
    if factory is not None and factory is not _new_task:
        return False
    loop.set_task_factory(_new_task)
    _guarding[loop] = _guarding.get(loop, 0) + 1
    return True


def unguard_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """One run that guarded ``loop`` ends: the task factory goes with the last one (before, the first
    of two workers on one loop to end took it from the other, whose later tasks were not guarded)."""
    left = _guarding.pop(loop, 1) - 1
    if left > 0:
        _guarding[loop] = left
    elif loop.get_task_factory() is _new_task:
        loop.set_task_factory(None)


def _new_task(loop: asyncio.AbstractEventLoop, coro: Any, /, context: contextvars.Context | None = None) -> _Task:
    return _Task(coro, loop=loop, context=context)


def _unguard_stop(loop: asyncio.AbstractEventLoop, guarded: Callable[[], None]) -> None:
    """Take the guard off (unless another was put over it since: that one calls this one)."""
    if vars(loop).get("stop") is guarded:
        delattr(loop, "stop")


def _settle(future: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome, so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def _uncancel(task: asyncio.Task[Any], cancels: int) -> None:
    """Take back the cancellations of ``task`` requested since it had ``cancels`` (Task.uncancel), so
    that its next cancellation (the worker's, an ``asyncio.timeout`` in its next handler) is counted
    right."""
    while task.cancelling() > cancels:
        task.uncancel()


def _own_cancel(exc: BaseException) -> asyncio.CancelledError:
    """The failure of a handler that cancelled its own task, with the traceback of where it was."""
    return asyncio.CancelledError("the handler cancelled its own task").with_traceback(exc.__traceback__)


class _Raised(Exception):
    """A SystemExit or KeyboardInterrupt raised by a handler running in a task of its own, carried
    out of it: asyncio re-raises those two from the task's step, out of the event loop, which ended
    the worker (and left every other running job to be rescued)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


async def _carried(call: Awaitable[Any], pid: int, name: str) -> Any:
    """Await the handler of task ``name`` in a task of its own: a SystemExit or KeyboardInterrupt is
    carried out as :class:`_Raised`; a process it forked that comes back here exits (``pid``: the
    worker's)."""
    try:
        try:
            result = await call
        finally:
            # Inline, at the handler's caller's depth: a call more may not fit under the limit it left.
            lowered = sys.getrecursionlimit()
            if lowered < _threads.recursion_limit:
                sys.setrecursionlimit(_threads.recursion_limit)
                _limit_lowered(name, lowered)
    except BaseException as exc:
        if process_id() != pid:
            leave_forked_child(f"the handler of {name}", exit_code_of(exc))
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise _Raised(exc) from None
        raise
    if process_id() != pid:
        leave_forked_child(f"the handler of {name}", 0)
    return result
