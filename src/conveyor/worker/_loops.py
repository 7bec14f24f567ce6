"""Building a worker's loops: the one place where they are wired to each other.

The Worker runs them; the testing kit drives the same loops round by round (``run_once``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from conveyor._catalogue import Catalogue
from conveyor._producer import Producer
from conveyor.backends.base import Backend
from conveyor.worker._buffer import Buffer
from conveyor.worker._calls import BackendCalls
from conveyor.worker._config import WorkerConfig
from conveyor.worker._observe import NO_OBSERVER, Observer
from conveyor.worker._service import Service
from conveyor.worker._state import Counters, Registry
from conveyor.worker.completer import Completer
from conveyor.worker.executor import Executor
from conveyor.worker.fetcher import Fetcher
from conveyor.worker.heartbeat import Heartbeat
from conveyor.worker.presence import Presence
from conveyor.worker.pruner import Pruner
from conveyor.worker.rescuer import Rescuer
from conveyor.worker.scheduler import Scheduler


@dataclass
class Loops:
    """One worker's loops and what they share (the registry of held deliveries, the buffer, the counters)."""

    counters: Counters
    registry: Registry
    calls: BackendCalls
    buffer: Buffer
    fetcher: Fetcher
    executor: Executor
    completer: Completer
    heartbeat: Heartbeat
    rescuer: Rescuer
    scheduler: Scheduler
    pruner: Pruner
    presence: Presence

    def all(self) -> list[Service]:
        """Every loop, in the order they start (and the reverse of how the worker ends them)."""
        return [
            self.completer,
            self.executor,
            self.fetcher,
            self.heartbeat,
            self.rescuer,
            self.scheduler,
            self.pruner,
            self.presence,
        ]


def build_loops(
    catalogue: Catalogue,
    producer: Producer,
    backend: Backend,
    config: WorkerConfig,
    queues: list[str],
    clock: Callable[[], datetime],
    *,
    counters: Counters | None = None,
    db_threads: int = 4,
    on_stuck: Callable[[int], None] = lambda stuck: None,
    observer: Observer = NO_OBSERVER,
    database_time: bool = False,
) -> Loops:
    """The loops of one worker process on ``backend``, draining ``queues`` (lanes, in order);
    ``observer`` hears what they do (metrics, tracing); with ``database_time`` the scheduler judges
    ticks by the database's clock, read at each pass (a worker that keeps the database's time)."""
    counters = counters if counters is not None else Counters()
    registry = Registry()
    calls = BackendCalls(backend, counters, threads=db_threads)
    buffer = Buffer(config.concurrency)
    completer = Completer(calls, registry, counters, clock, config.flush_interval)
    fetcher = Fetcher(catalogue, calls, registry, counters, buffer, config, queues, clock)
    fetcher.unwritten = lambda: completer.backlog
    executor = Executor(
        catalogue,
        calls,
        registry,
        counters,
        buffer,
        completer,
        config.concurrency,
        clock,
        on_stuck=on_stuck,
    )
    fetcher.observer = executor.observer = completer.observer = observer
    return Loops(
        counters=counters,
        registry=registry,
        calls=calls,
        buffer=buffer,
        fetcher=fetcher,
        executor=executor,
        completer=completer,
        heartbeat=Heartbeat(calls, registry, counters, clock, config.heartbeat_interval, completer),
        # After a database outage longer than a lease, this worker's own finished jobs have expired
        # leases too: rescue waits until their acks are written, or it would run them again.
        rescuer=Rescuer(calls, counters, clock, config.rescue_interval, ready=lambda: completer.backlog == 0),
        scheduler=Scheduler(producer, calls, clock, config.schedule_interval, database_time=database_time),
        pruner=Pruner(catalogue, calls, clock, config.prune_interval),
        presence=Presence(calls, config.identity, queues, config.concurrency, clock, config.presence_interval),
    )
