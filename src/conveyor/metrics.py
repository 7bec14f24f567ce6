"""Prometheus metrics (``pip install 'conveyor[metrics]'``).

Two sources, two places (docs/observability.md lists every family):

- :class:`WorkerMetrics`, an observer of one worker process: what it started, how each handler ended
  and how long it ran, how long jobs waited, redeliveries, stale acks, fetch and flush batch sizes.
  ``conveyor worker --metrics-port P`` serves them; with ``--processes N`` child *i* serves port
  ``P + i`` (one registry per process, no shared files: see the docs for why not multiprocess mode).
- :class:`DatabaseCollector`, read at each scrape through the operator API: depth by state, oldest
  pending age, DLQ depth, terminal totals per queue and task (the per-queue counters, so a scrape costs
  the same on a 10M-row archive as on an empty one), jobs enqueued, live workers, alert states, and the
  two database signals. ``conveyor serve`` exposes it at ``/metrics``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from conveyor.backends.base import Delivery
from conveyor.worker._observe import Observer, Outcome, outcome_name

if TYPE_CHECKING:
    from conveyor._admin import Admin

__all__ = ["DatabaseCollector", "WorkerMetrics", "database_registry", "serve_worker_metrics"]

#: Seconds: handler durations and queue waits from 5 ms to an hour.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Seconds a scrape waits for the database before it answers ``conveyor_database_up 0``: with the token read
#: that /metrics may wait for first (as long again), within Prometheus's default scrape timeout of 10 s.
SCRAPE_TIMEOUT = 4.0
#: Jobs per acquire or per flush statement.
BATCH_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class WorkerMetrics(Observer):
    """The metrics of one worker process, in ``registry`` (a new one by default). ``in_flight``
    reads how many deliveries the worker holds (buffered and running) at scrape time."""

    def __init__(self, registry: CollectorRegistry | None = None, in_flight: Callable[[], int] | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.started = Counter(
            "conveyor_worker_jobs_started", "Handler starts, per queue and task.", ["queue", "task"], registry=r
        )
        self.finished = Counter(
            "conveyor_worker_jobs_finished",
            "Outcomes written (completed, retried, dead, expired, cancelled), per queue and task.",
            ["queue", "task", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "conveyor_worker_handler_duration_seconds",
            "How long handlers ran, per queue and task.",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.wait = Histogram(
            "conveyor_worker_queue_wait_seconds",
            "From the moment a job was ready (run_at) to the start of its handler, per queue.",
            ["queue"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.redeliveries = Counter(
            "conveyor_worker_redeliveries",
            "Handler starts of jobs started before (their earlier run lost its outcome or was retried).",
            ["queue"],
            registry=r,
        )
        self.stale_acks = Counter(
            "conveyor_worker_stale_acks",
            "Outcomes that matched no delivery: the lease had expired and the job was handed out again.",
            registry=r,
        )
        self.fetch_batch = Histogram(
            "conveyor_worker_fetch_batch_size", "Jobs leased per acquire.", ["queue"], buckets=BATCH_BUCKETS, registry=r
        )
        self.flush_batch = Histogram(
            "conveyor_worker_flush_batch_size",
            "Outcomes written per statement, by kind (finish, retry).",
            ["kind"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "conveyor_worker_jobs_in_flight", "Deliveries this worker holds (buffered and running).", registry=r
        )
        if in_flight is not None:
            self.in_flight.set_function(lambda: float(in_flight()))

    def fetched(self, queue: str, deliveries: int) -> None:
        self.fetch_batch.labels(queue).observe(deliveries)

    def before_run(self, delivery: Delivery, now: datetime) -> Any:
        self.started.labels(delivery.queue, delivery.task).inc()
        self.wait.labels(delivery.queue).observe(max(0.0, (now - delivery.run_at).total_seconds()))
        if delivery.deliveries > 0:
            self.redeliveries.labels(delivery.queue).inc()
        return None

    def after_run(self, delivery: Delivery, outcome: Outcome | None, seconds: float, token: Any) -> None:
        self.duration.labels(delivery.queue, delivery.task).observe(seconds)

    def flushed(self, kind: str, items: Sequence[Outcome], applied: int, queues: Sequence[tuple[str, str]]) -> None:
        self.flush_batch.labels(kind).observe(len(items))
        if applied < len(items):
            self.stale_acks.inc(len(items) - applied)
        # A statement that skipped stale items does not say which: the outcomes of such a batch (rare:
        # a lease expired under a live worker) are counted on its first ``applied`` items.
        for item, (queue, task) in zip(items[:applied], queues[:applied], strict=True):
            self.finished.labels(queue, task, outcome_name(item)).inc()


def serve_worker_metrics(metrics: WorkerMetrics, port: int, host: str = "127.0.0.1") -> None:
    """Serve ``metrics`` over HTTP on ``host:port`` from a daemon thread (prometheus_client's)."""
    start_http_server(port, addr=host, registry=metrics.registry)


class DatabaseCollector(Collector):
    """Metric families read from the database through the operator API at each scrape.

    Every read it makes costs the same whatever the archive holds (live rows, the per-queue counters,
    the index of unreplayed dead letters, the worker and alert tables). A scrape while the database
    is away yields ``conveyor_database_up 0`` and nothing else rather than failing; so does one whose
    read has not ended within ``timeout`` seconds (a server that holds its connections open and answers
    nothing), well inside Prometheus's default scrape timeout of 10 s.

    The reads run one at a time in a thread of the collector's own: a scrape that comes while one is
    under way waits for that one's result rather than starting another, so a database that answers
    nothing holds one thread and one connection, however often it is scraped."""

    def __init__(self, admin: Admin, timeout: float = SCRAPE_TIMEOUT) -> None:
        self.admin = admin
        self.timeout = timeout
        self._lock = threading.Lock()
        self._reading: Future[list[Metric]] | None = None
        self._began = 0.0

    @property
    def stalled(self) -> bool:
        """Whether a read of the database is under way and older than ``timeout`` (the database does not
        answer): a caller that would read the database too (a token) should not wait for it."""
        with self._lock:
            reading = self._reading
            return reading is not None and not reading.done() and time.monotonic() - self._began > self.timeout

    def collect(self) -> Iterator[Metric]:
        began = time.perf_counter()
        up = GaugeMetricFamily("conveyor_database_up", "1 when the last scrape could read the database.")
        try:
            families = self._read().result(timeout=self.timeout)
        except Exception:  # every failure (a timeout too) means the same here: the database was not read
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families
        took = GaugeMetricFamily("conveyor_scrape_duration_seconds", "How long reading the database took.")
        took.add_metric([], time.perf_counter() - began)
        yield took

    def _read(self) -> Future[list[Metric]]:
        """The read under way, or a new one started in a daemon thread (a read stuck on a socket must not
        keep the process from exiting, as a thread of a ThreadPoolExecutor would)."""
        with self._lock:
            if self._reading is not None and not self._reading.done():
                return self._reading
            reading: Future[list[Metric]] = Future()
            self._reading, self._began = reading, time.monotonic()

        def read() -> None:
            try:
                reading.set_result(list(self._families()))
            except BaseException as exc:  # handed to the scrape that waits, which answers up 0
                reading.set_exception(exc)

        threading.Thread(target=read, name="conveyor-scrape", daemon=True).start()
        return reading

    def _families(self) -> Iterator[Metric]:
        admin = self.admin
        queues = admin.queues()
        depth = GaugeMetricFamily("conveyor_queue_depth", "Live jobs by state.", labels=["queue", "state"])
        oldest = GaugeMetricFamily(
            "conveyor_queue_oldest_pending_age_seconds", "Age of the oldest ready job (0: none).", labels=["queue"]
        )
        dlq = GaugeMetricFamily("conveyor_queue_dlq_depth", "Unreplayed dead letters.", labels=["queue"])
        enqueued = CounterMetricFamily("conveyor_queue_jobs_enqueued", "Jobs ever enqueued.", labels=["queue"])
        for q in queues:
            for state in ("pending", "scheduled", "processing"):
                depth.add_metric([q.queue, state], float(getattr(q, state)))
            oldest.add_metric([q.queue], q.oldest_pending_age or 0.0)
            dlq.add_metric([q.queue], float(q.dead))
            enqueued.add_metric([q.queue], float(q.enqueued))
        totals = CounterMetricFamily(
            "conveyor_queue_jobs_finished",
            "Terminal outcomes written (completed, dead, expired, cancelled), per queue and task.",
            labels=["queue", "task", "outcome"],
        )
        for t in admin.task_totals():
            for outcome in ("completed", "dead", "expired", "cancelled"):
                totals.add_metric([t.queue, t.task, outcome], float(getattr(t, outcome)))
        workers = GaugeMetricFamily("conveyor_queue_workers", "Live workers draining the queue.", labels=["queue"])
        alive: dict[str, int] = {q.queue: 0 for q in queues}
        for w in admin.workers():
            if w.alive:
                for name in w.queues:
                    alive[name] = alive.get(name, 0) + 1
        for name, count in sorted(alive.items()):
            workers.add_metric([name], float(count))
        firing = GaugeMetricFamily(
            "conveyor_alert_firing", "1 while an alert fires, 0 once resolved.", labels=["rule", "queue"]
        )
        for a in admin.alerts():
            firing.add_metric([a.rule, a.queue or ""], 1.0 if a.state == "firing" else 0.0)
        yield from (depth, oldest, dlq, enqueued, totals, workers, firing)
        health = admin.database_health()
        # Each family only where the engine has the signal (SQLite has neither, MySQL no dead tuples): left
        # out rather than reported as 0.
        if health.oldest_transaction_age is not None:
            xact = GaugeMetricFamily(
                "conveyor_db_oldest_transaction_age_seconds",
                "Age of the oldest open transaction on the server (it holds back vacuum or purge).",
            )
            xact.add_metric([], health.oldest_transaction_age)
            yield xact
        if health.jobs_dead_tuples is not None:
            dead = GaugeMetricFamily("conveyor_db_jobs_dead_tuples", "Dead tuples in the jobs table.")
            dead.add_metric([], float(health.jobs_dead_tuples))
            yield dead


def database_registry(admin: Admin, collector: DatabaseCollector | None = None) -> CollectorRegistry:
    """A registry holding ``collector`` (a :class:`DatabaseCollector` over ``admin`` by default): what
    ``/metrics`` serves."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector if collector is not None else DatabaseCollector(admin))
    return registry
