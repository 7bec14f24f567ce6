"""The Worker: starts the loops, and stops them in the order that loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from conveyor._app import App
from conveyor._message import utcnow
from conveyor.backends.base import Delivery, JobsReleaseParams, LeaseRef, QueuesStatsParams
from conveyor.worker._shared import BackendCalls, Counters, Registry, log
from conveyor.worker.completer import Completer
from conveyor.worker.executor import Executor
from conveyor.worker.fetcher import Fetcher
from conveyor.worker.heartbeat import Heartbeat
from conveyor.worker.pruner import Pruner
from conveyor.worker.rescuer import Rescuer
from conveyor.worker.scheduler import Scheduler


class Worker:
    """Drains ``queues`` (lanes, in strict order) with ``concurrency`` handler slots.

    ``queues`` defaults to every queue a registered task declares. ``burst`` stops the worker once
    its queues hold no live job (ready, scheduled or processing). Stop it with :meth:`stop` (or
    SIGTERM/SIGINT under :meth:`run_sync`): fetching stops, buffered jobs go back to pending at once,
    running handlers get ``graceful_timeout`` seconds to finish, outcomes are flushed."""

    def __init__(
        self,
        app: App,
        queues: Sequence[str] | None = None,
        *,
        concurrency: int = 10,
        prefetch: int | None = None,
        visibility_timeout: float = 30.0,
        poll_interval: float | None = None,
        flush_interval: float = 0.005,
        heartbeat_interval: float | None = None,
        rescue_interval: float = 5.0,
        schedule_interval: float = 1.0,
        prune_interval: float = 60.0,
        weights: Mapping[str, int] | None = None,
        graceful_timeout: float = 30.0,
        burst: bool = False,
        worker_id: str | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        declared = sorted({t.options.queue for t in app.tasks.values()}) or ["default"]
        self.app = app
        self.queues = list(queues) if queues else declared
        self.concurrency = concurrency
        # Leased-but-unstarted jobs held per process. The default starts at Celery's reservation, 4
        # per slot, and adapts up to 16 per slot while handlers start jobs fast enough to use them
        # (the buffer then holds about 50 ms of work: see Fetcher._adapt). Measured on PostgreSQL with
        # no-op jobs: 2 x concurrency made the fetcher the bottleneck of a drain, and bigger acquires
        # share each statement's fixed cost (docs/benchmarks.md). An explicit --prefetch is fixed:
        # long-running jobs that should spread over many workers want it close to concurrency.
        self.capacity = prefetch if prefetch is not None else max(4 * concurrency, 20)
        self.max_capacity = None if prefetch is not None else max(16 * concurrency, self.capacity)
        self.visibility_timeout = visibility_timeout
        self.poll_interval = poll_interval
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.rescue_interval = rescue_interval
        self.schedule_interval = schedule_interval
        self.prune_interval = prune_interval
        self.weights = dict(weights) if weights else None
        self.graceful_timeout = graceful_timeout
        self.burst = burst
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock
        self.counters = Counters()
        self.registry = Registry()
        self._stop_requested: asyncio.Event | None = None
        self._stopping = False
        self.exit_code = 0

    def stop(self) -> None:
        """Ask the worker to stop gracefully (safe to call from the event loop's thread)."""
        self._stopping = True
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def run(self) -> None:
        """Run until stopped (or drained, with ``burst``)."""
        self._stop_requested = asyncio.Event()
        if self._stopping:
            self._stop_requested.set()
        backend = self.app.backend
        calls = BackendCalls(backend, self.counters)
        buffer: asyncio.Queue[Delivery | None] = asyncio.Queue()
        poll = self.poll_interval if self.poll_interval is not None else (1.0 if backend.notifies else 0.25)
        completer = Completer(calls, self.registry, self.counters, self.clock, self.flush_interval)
        fetcher = Fetcher(
            self.app,
            calls,
            self.registry,
            self.counters,
            buffer,
            self.queues,
            self.capacity,
            self.worker_id,
            self.visibility_timeout,
            self.clock,
            poll,
            self.weights,
            self.max_capacity,
        )
        executor = Executor(
            self.app,
            calls,
            self.registry,
            self.counters,
            buffer,
            completer,
            self.concurrency,
            self.clock,
            on_take=fetcher.space.set,
            on_stuck=self._on_stuck,
        )
        fetcher.idle_slots = lambda: executor.idle_slots
        heartbeat = Heartbeat(calls, self.registry, self.counters, self.clock, self.heartbeat_interval)
        rescuer = Rescuer(calls, self.counters, self.clock, self.rescue_interval, ready=lambda: completer.backlog == 0)
        scheduler = Scheduler(self.app, calls, self.clock, self.schedule_interval)
        pruner = Pruner(self.app, calls, self.clock, self.prune_interval)

        log.info(
            "worker %s: queues %s, concurrency %d, engine %s",
            self.worker_id,
            ",".join(self.queues),
            self.concurrency,
            backend.engine,
        )
        executor.start()
        loops = {
            "fetcher": asyncio.create_task(fetcher.run(), name="fetcher"),
            "completer": asyncio.create_task(completer.run(), name="completer"),
            "heartbeat": asyncio.create_task(heartbeat.run(), name="heartbeat"),
            "rescuer": asyncio.create_task(rescuer.run(), name="rescuer"),
            "scheduler": asyncio.create_task(scheduler.run(), name="scheduler"),
            "pruner": asyncio.create_task(pruner.run(), name="pruner"),
        }
        watch = asyncio.create_task(self._watch(fetcher, executor, completer, calls), name="watch")
        stop_wait = asyncio.create_task(self._stop_requested.wait())
        done, _ = await asyncio.wait({stop_wait, *loops.values()}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is stop_wait:
                continue
            # A loop ended on its own: the worker cannot go on without it. Stop the way that loses
            # nothing (what is buffered goes back, running handlers finish, outcomes are flushed) and
            # exit non-zero, so that a supervisor restarts the process.
            self.exit_code = 1
            error = task.exception()
            if error is not None:
                log.error("worker loop %s failed; stopping", task.get_name(), exc_info=error)
            else:
                log.error("worker loop %s ended unexpectedly; stopping", task.get_name())
        watch.cancel()
        stop_wait.cancel()

        # 1. Stop fetching; let an acquire under way land in the buffer rather than vanish.
        fetcher.stop()
        await asyncio.wait({loops["fetcher"]}, timeout=30)
        # 2. Hand buffered-but-unstarted jobs back to pending at once.
        await self._release_buffered(buffer, calls)
        # 3. Let running handlers finish within the graceful timeout (heartbeats keep their leases).
        cut = await executor.stop(self.graceful_timeout)
        if cut:
            log.warning("%d handler(s) still running after %ss; their leases will expire", cut, self.graceful_timeout)
        # 4. Flush every outcome, then stop the maintenance loops.
        if not await completer.stop():
            self.exit_code = 1
        for loop in (heartbeat, rescuer, scheduler, pruner):
            loop.stop()
        for name in ("completer", "heartbeat", "rescuer", "scheduler", "pruner"):
            loops[name].cancel()
        await asyncio.gather(*loops.values(), return_exceptions=True)
        calls.shutdown()
        log.info("worker %s stopped: %s", self.worker_id, self.counters.as_dict())

    async def _release_buffered(self, buffer: asyncio.Queue[Delivery | None], calls: BackendCalls) -> None:
        refs: list[LeaseRef] = []
        while not buffer.empty():
            delivery = buffer.get_nowait()
            if delivery is None:
                continue
            held = self.registry.held.get(delivery.id)
            if held is not None and not held.lost:
                refs.append(LeaseRef(delivery.id, delivery.receipt))
            self.registry.drop(delivery.id)
        if refs:
            deadline = asyncio.get_running_loop().time() + 30
            released = await calls.call(
                calls.backend.jobs_release_many,
                JobsReleaseParams(refs, self.clock()),
                give_up=lambda: asyncio.get_running_loop().time() > deadline,
                what="release",
            )
            self.counters.released += released

    async def _watch(self, fetcher: Fetcher, executor: Executor, completer: Completer, calls: BackendCalls) -> None:
        """With ``burst``: stop once the worker is idle and its queues hold no live job."""
        if not self.burst:
            return
        while True:
            await asyncio.sleep(0.1)
            if not (fetcher.idle and executor.running == 0 and completer.backlog == 0 and len(self.registry) == 0):
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
        at once (leases then expire and rescue returns the jobs)."""

        async def main() -> None:
            if install_signals:
                loop = asyncio.get_running_loop()
                for sig in signals:
                    loop.add_signal_handler(sig, self._on_signal, sig)
            await self.run()

        asyncio.run(main())
        return self.exit_code

    def _on_stuck(self, stuck: int) -> None:
        # A thread cannot be stopped, so a handler that hangs past its timeout keeps one for good; a
        # worker with as many of those as slots only gets them back as a new process.
        log.error(
            "%d handler thread(s) hang past their timeout; stopping so that a supervisor restarts this process", stuck
        )
        self.exit_code = 1
        self.stop()

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping:
            log.warning("second %s: exiting at once", sig.name)
            os._exit(1)
        log.info("%s: stopping gracefully (send again to exit at once)", sig.name)
        self.stop()
