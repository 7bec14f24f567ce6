"""The execute loop: N concurrent slots run handlers; ``async def`` on the event loop, ``def`` in threads."""

from __future__ import annotations

import asyncio
import functools
import json
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor as _PoolExecutor
from concurrent.futures import Future
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from conveyor._app import App
from conveyor._context import JobContext
from conveyor._policy import Outcome, before_run, on_failure, on_manual, on_success
from conveyor._task import Task
from conveyor.backends.base import Delivery, LeaseRef, LeasesExtendParams
from conveyor.worker._shared import Counters, Registry, log
from conveyor.worker.completer import Completer


class HandlerTimeout(Exception):
    """A handler ran past its task's ``timeout`` (a transient failure: it retries)."""


P = ParamSpec("P")
T = TypeVar("T")


class HandlerThreads(_PoolExecutor):
    """A thread pool for ``def`` handlers whose threads are daemons.

    ``ThreadPoolExecutor`` joins its threads when the interpreter exits, so a handler still running
    after the graceful timeout would keep the worker process alive until it returned (for ever, if
    it hangs), although the worker had given it up. Abandoned handlers must not hold the exit:
    their leases expire and rescue hands the jobs to another worker. Threads start on demand, up
    to ``max_workers``, and are reused."""

    def __init__(self, max_workers: int, name: str = "conveyor-handler") -> None:
        self._max_workers = max_workers
        self._name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._shut = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run handlers after shutdown")
            future: Future[T] = Future()
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)
            return future

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
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
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class Executor:
    """Runs deliveries from the buffer through their task's handler and hands outcomes to the completer."""

    def __init__(
        self,
        app: App,
        registry: Registry,
        counters: Counters,
        buffer: asyncio.Queue[Delivery | None],
        completer: Completer,
        concurrency: int,
        clock: Callable[[], datetime],
        on_take: Callable[[], None] = lambda: None,
    ) -> None:
        self.app = app
        self.registry = registry
        self.counters = counters
        self.buffer = buffer
        self.completer = completer
        self.concurrency = concurrency
        self.clock = clock
        self.on_take = on_take
        self.running = 0
        self._threads = HandlerThreads(concurrency)
        self._slots: list[asyncio.Task[None]] = []

    # The worker passes itself as the lease keeper so that ``ctx.extend`` reaches the database.
    def extend(self, delivery: Delivery, seconds: float) -> bool:
        held = self.registry.held.get(delivery.id)
        if held is None or held.lost:
            return False
        params = LeasesExtendParams([LeaseRef(delivery.id, delivery.receipt)], seconds, self.clock())
        extended = self.app.backend.leases_extend_many(params)
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
        task = self.app.tasks.get(delivery.task)
        options = task.options if task else None
        on_expire = self.app.queue_policy(delivery.queue).on_expire
        outcome: Outcome | None = before_run(delivery, options, self.clock(), on_expire)
        if outcome is None:
            assert task is not None
            held.state = "running"
            self.counters.started += 1
            outcome = await self._run(task, delivery)
        self.completer.add(outcome)
        return outcome

    async def _run(self, task: Task[Any, Any], delivery: Delivery) -> Outcome:
        options = task.options
        ctx = JobContext(delivery, keeper=self, backend=self.app.backend)
        try:
            kwargs: dict[str, Any] = json.loads(delivery.payload)
            if task.wants_context:
                kwargs["ctx"] = ctx
            if task.is_async:
                call: Any = task.fn(**kwargs)
            else:
                loop = asyncio.get_running_loop()
                call = loop.run_in_executor(self._threads, functools.partial(task.fn, **kwargs))
            if options.timeout is not None:
                try:
                    result = await asyncio.wait_for(call, options.timeout)
                except TimeoutError:
                    raise HandlerTimeout(f"handler ran longer than {options.timeout}s") from None
            else:
                result = await call
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return on_failure(delivery, options, exc, self.clock())
        if options.ack_policy == "manual":
            return on_manual(delivery, options, ctx, self.clock())
        return on_success(delivery, options, result)

    async def run_once(self) -> Outcome | None:
        """Process one buffered delivery if there is one (for tests); None if the buffer is empty."""
        try:
            delivery = self.buffer.get_nowait()
        except asyncio.QueueEmpty:
            return None
        if delivery is None:
            return None
        return await self.process(delivery)

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
            except Exception:  # a bug in Conveyor itself; the lease expiry will redeliver the job
                log.exception("internal error processing job %s", delivery.id)
            finally:
                self.running -= 1

    def start(self) -> None:
        self._slots = [asyncio.create_task(self._slot(), name=f"slot-{i}") for i in range(self.concurrency)]

    async def stop(self, graceful_timeout: float) -> int:
        """Let running handlers finish within ``graceful_timeout``; return how many were cut off."""
        for _ in self._slots:
            self.buffer.put_nowait(None)
        _done, pending = await asyncio.wait(self._slots, timeout=graceful_timeout) if self._slots else (set(), set())
        for slot in pending:
            slot.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        # Threads still running a handler are abandoned (daemons: they do not hold the process's
        # exit); their leases expire and rescue returns the jobs.
        self._threads.shutdown(wait=False, cancel_futures=True)
        return len(pending)
