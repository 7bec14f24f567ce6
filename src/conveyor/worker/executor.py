"""The execute loop: N concurrent slots run handlers; ``async def`` on the event loop, ``def`` in threads.

A slot takes a leased job from the prefetch buffer, decides whether it may run (poison, TTL, unknown
task), runs it, and hands the outcome to the completer, which counts the start with it. A suspect job
(its lease once expired) is counted before it runs instead (batched with the other slots' suspects), so
that a job which kills its workers is counted. Whatever the handler raises or does (an exception of any
kind, a hang past its timeout) is that job's outcome; the slot itself carries on."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor as _PoolExecutor
from concurrent.futures import Future
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from conveyor._catalogue import Catalogue
from conveyor._context import JobContext
from conveyor._errors import HandlerTimeout
from conveyor._outcomes import Outcome, before_run, on_failure, on_manual, on_success
from conveyor._task import Task
from conveyor.backends.base import Delivery, JobsStartParams, LeaseRef, LeasesExtendParams
from conveyor.worker._calls import BackendCalls
from conveyor.worker._observe import NO_OBSERVER, Observer
from conveyor.worker._service import Service
from conveyor.worker._state import Counters, Registry
from conveyor.worker.completer import Completer

log = logging.getLogger("conveyor.worker")

P = ParamSpec("P")
T = TypeVar("T")


class HandlerThreads(_PoolExecutor):
    """A thread pool for ``def`` handlers whose threads are daemons and can be abandoned.

    ``ThreadPoolExecutor`` joins its threads when the interpreter exits, so a handler still running
    after the graceful timeout would keep the worker process alive until it returned (for ever, if
    it hangs), although the worker had given it up. And a Python thread cannot be stopped: a handler
    that hangs past its task's timeout keeps its thread. :meth:`abandon` gives such a thread up: it no
    longer counts towards ``max_workers`` (a new thread takes its place, so the worker keeps its
    concurrency) and it ends when its call finally returns. Threads start on demand and are reused."""

    def __init__(self, max_workers: int, name: str = "conveyor-handler") -> None:
        self._max_workers = max_workers
        self._name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._running: dict[Future[Any], threading.Thread] = {}
        self._abandoned: set[threading.Thread] = set()
        self._started = 0
        self._shut = False

    @property
    def abandoned(self) -> int:
        """Threads given up on whose calls are still running."""
        with self._lock:
            return len(self._abandoned)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run handlers after shutdown")
            future: Future[T] = Future()
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
            if not self._idle.acquire(blocking=False):
                self._grow()
            return future

    def _grow(self) -> None:
        # Called with the lock held: start a thread if the pool is below its size.
        if len(self._threads) < self._max_workers:
            thread = threading.Thread(target=self._run, name=f"{self._name}-{self._started}", daemon=True)
            self._started += 1
            thread.start()
            self._threads.append(thread)

    def abandon(self, future: Future[Any]) -> None:
        """Give up the thread running ``future`` (its handler hung past its timeout).

        A call not yet started is cancelled instead."""
        if future.cancel():
            return
        with self._lock:
            thread = self._running.get(future)
            if thread is None or thread in self._abandoned:
                return
            self._abandoned.add(thread)
            self._threads.remove(thread)
            self._grow()

    def _run(self) -> None:
        me = threading.current_thread()
        while (item := self._work.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self._running[future] = me
                try:
                    result = call()
                except Exception as exc:
                    future.set_exception(exc)
                except BaseException as exc:
                    future.set_exception(_Raised(exc))
                else:
                    future.set_result(result)
                with self._lock:
                    del self._running[future]
                    if me in self._abandoned:
                        # Given up while it ran: a replacement has taken its place in the pool.
                        self._abandoned.discard(me)
                        return
            del item, future, call
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            threads = list(self._threads)
            for _ in threads:
                self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()


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
                params = JobsStartParams([LeaseRef(d.id, d.receipt) for d, _ in batch], self.clock())
                try:
                    started = set(await self.calls.call(self.calls.backend.jobs_start_many, params, what="start"))
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

    ``run()`` runs ``concurrency`` slots until :meth:`stop`, after which each slot ends once its
    handler returns (the worker cancels the run past its graceful timeout). ``on_stuck`` is called
    once when as many handler threads hang past their timeout as there are slots: a thread cannot be
    stopped, so only a new process gets them back."""

    name = "executor"
    observer: Observer = NO_OBSERVER

    def __init__(
        self,
        catalogue: Catalogue,
        calls: BackendCalls,
        registry: Registry,
        counters: Counters,
        buffer: asyncio.Queue[Delivery | None],
        completer: Completer,
        concurrency: int,
        clock: Callable[[], datetime],
        on_take: Callable[[], None] = lambda: None,
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
        self.on_take = on_take
        self.on_stuck = on_stuck
        self.running = 0
        self.starts = Starts(calls, clock)
        self._threads = HandlerThreads(concurrency)
        self._stuck_reported = False

    # The worker passes itself as the lease keeper so that ``ctx.extend`` reaches the database.
    def extend(self, delivery: Delivery, seconds: float) -> bool:
        held = self.registry.held.get(delivery.id)
        if held is None or held.lost:
            return False
        params = LeasesExtendParams([LeaseRef(delivery.id, delivery.receipt)], seconds, self.clock())
        extended = self.backend.leases_extend_many(params)
        if delivery.id in extended:
            held.visibility_timeout = seconds
            return True
        held.lost = True
        return False

    async def process(self, delivery: Delivery) -> Outcome | None:
        """Run one delivery and queue its outcome; None when its lease was lost before it started."""
        held = self.registry.held.get(delivery.id)
        if held is None or held.lost:
            self.registry.drop(delivery.id)
            return None
        task = self.catalogue.tasks.get(delivery.task)
        options = task.options if task else None
        on_expire = self.catalogue.queue_options(delivery.queue).on_expire
        outcome: Outcome | None = before_run(delivery, options, self.clock(), on_expire)
        if outcome is None:
            assert task is not None
            if delivery.rescues and not held.counted:
                # A suspect: its lease expired before, maybe because it killed its worker. Count this
                # start before it runs, so that it is counted even if it kills this worker too.
                if not await self.starts.start(delivery):
                    held.lost = True
                    self.counters.lost_leases += 1
                    self.registry.drop(delivery.id)
                    return None
                held.counted = True
            held.state = "running"
            self.counters.started += 1
            token = self.observer.before_run(delivery, self.clock())
            began = time.perf_counter()
            outcome = None
            try:
                outcome = await self._run(task, delivery)
            finally:
                self.observer.after_run(delivery, outcome, time.perf_counter() - began, token)
        self.completer.add(outcome)
        return outcome

    async def _run(self, task: Task[Any, Any], delivery: Delivery) -> Outcome:
        options = task.options
        ctx = JobContext(delivery, keeper=self, backend=self.backend)
        try:
            kwargs: dict[str, Any] = json.loads(delivery.payload)
            if task.wants_context:
                kwargs["ctx"] = ctx
            if task.is_async:
                result = await self._run_async(task, kwargs, options.timeout)
            else:
                result = await self._run_sync(task, kwargs, options.timeout)
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this slot is being stopped: not the handler's outcome
            return on_failure(delivery, options, exc, self.clock())
        except BaseException as exc:
            # Anything a handler raises, SystemExit and KeyboardInterrupt from library code included,
            # is a failed attempt of its job, never the end of the worker. (A real Ctrl-C or SIGTERM
            # reaches the worker's signal handlers, not the handler.)
            return on_failure(delivery, options, exc, self.clock())
        if options.ack_policy == "manual":
            return on_manual(delivery, options, ctx, self.clock())
        return on_success(delivery, options, result)

    async def _run_async(self, task: Task[Any, Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
        if timeout is None:
            return await task.fn(**kwargs)
        # Not asyncio.wait_for: it waits for the cancelled handler to finish, and a handler that
        # swallows the cancellation would then hold this slot for ever.
        running = asyncio.ensure_future(task.fn(**kwargs))
        done, _ = await asyncio.wait({running}, timeout=timeout)
        if not done:
            running.cancel()
            running.add_done_callback(_consume)
            raise HandlerTimeout(f"handler ran longer than {timeout}s")
        return running.result()

    async def _run_sync(self, task: Task[Any, Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
        # The handler runs in the slot's context (copied), so that what the slot set for it (the
        # job's trace span) is current in the handler's thread too.
        future = self._threads.submit(contextvars.copy_context().run, functools.partial(task.fn, **kwargs))
        waiting = asyncio.wrap_future(future)
        if timeout is None:
            try:
                return await waiting
            except _Raised as raised:
                raise raised.exception from None
        done, _ = await asyncio.wait({waiting}, timeout=timeout)
        if not done:
            # The thread cannot be stopped: give it up so that a new one takes its slot.
            self._threads.abandon(future)
            waiting.add_done_callback(_consume)
            stuck = self._threads.abandoned
            log.warning(
                "handler of %s ran past its %ss timeout; its thread is abandoned (%d stuck)",
                task.name, timeout,
                stuck,
            )
            if stuck >= self.concurrency and not self._stuck_reported:
                self._stuck_reported = True
                self.on_stuck(stuck)
            raise HandlerTimeout(f"handler ran longer than {timeout}s")
        try:
            return waiting.result()
        except _Raised as raised:
            raise raised.exception from None

    async def _slot(self) -> None:
        while True:
            delivery = await self.buffer.get()
            self.on_take()
            if delivery is None:
                return
            self.running += 1
            try:
                await self.process(delivery)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug in Conveyor itself, or a database that refused the start: forget the job, so
                # that its lease is no longer extended; it expires and rescue hands the job out again.
                log.exception("internal error processing job %s", delivery.id)
                self.registry.drop(delivery.id)
            finally:
                self.running -= 1

    async def run(self) -> None:
        """Run the slots until stopped (and their handlers returned) or cancelled."""
        slots = [asyncio.create_task(self._slot(), name=f"slot-{i}") for i in range(self.concurrency)]
        try:
            await asyncio.gather(*slots)
        finally:
            for slot in slots:
                slot.cancel()
            await asyncio.wait(slots, timeout=1.0)
            # Threads still running a handler are abandoned (daemons: they do not hold the process's
            # exit); their leases expire and rescue returns the jobs.
            self._threads.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        """Let each slot end once its handler returns (buffered jobs are the worker's to hand back)."""
        super().stop()
        for _ in range(self.concurrency):
            self.buffer.put_nowait(None)


class _Raised(Exception):
    """Carries a handler's BaseException (SystemExit, GeneratorExit, ...) from its thread to its slot.

    A future's exception reaches an awaiting task by being *thrown* into its coroutines, and a thrown
    GeneratorExit closes every coroutine it passes instead of being caught; carried in an Exception
    and raised again in the slot, it is an ordinary failed attempt."""

    def __init__(self, exception: BaseException) -> None:
        super().__init__(repr(exception))
        self.exception = exception


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome, so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()
