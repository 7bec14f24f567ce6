"""Every metric family a worker serves, read over HTTP from its --metrics-port, after a drain that
produced each outcome; and stale acks, from the real completer writing an outdated receipt."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor import App, JobContext, Retry
from conveyor._clock import host_now
from conveyor.backends.base import Finish, JobsAcquireParams, JobsRescueParams
from conveyor.metrics import WorkerMetrics
from conveyor.worker import WorkerConfig
from conveyor.worker._loops import build_loops

from .conftest import drain, free_port


def _scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_worker_metrics_count_every_outcome_per_queue_and_task(app: App) -> None:
    @app.task(queue="q", name="ok")
    def ok() -> None: ...

    @app.task(queue="q", name="flaky", max_attempts=2, backoff=[0.0])
    def flaky(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise Retry(delay=0)

    @app.task(queue="q", name="bad")
    def bad() -> None:
        raise ValueError("bad input")

    for _ in range(3):
        ok.delay()
    flaky.delay()
    bad.delay()
    app.send("ok", {}, queue="q", ttl=0.001)  # expires before a start
    asyncio.run(asyncio.sleep(0.01))
    port = free_port()
    worker = drain(app, metrics_port=port)
    m = _scrape(port)

    started = m["conveyor_worker_jobs_started_total"]
    assert started[(("queue", "q"), ("task", "ok"))] == 3
    assert started[(("queue", "q"), ("task", "flaky"))] == 2
    finished = m["conveyor_worker_jobs_finished_total"]
    assert finished[(("outcome", "completed"), ("queue", "q"), ("task", "ok"))] == 3
    assert finished[(("outcome", "retried"), ("queue", "q"), ("task", "flaky"))] == 1
    assert finished[(("outcome", "completed"), ("queue", "q"), ("task", "flaky"))] == 1
    assert finished[(("outcome", "dead"), ("queue", "q"), ("task", "bad"))] == 1
    assert finished[(("outcome", "expired"), ("queue", "q"), ("task", "ok"))] == 1
    assert m["conveyor_worker_handler_duration_seconds_count"][(("queue", "q"), ("task", "ok"))] == 3
    assert m["conveyor_worker_queue_wait_seconds_count"][(("queue", "q"),)] == 6
    assert m["conveyor_worker_redeliveries_total"][(("queue", "q"),)] == 1  # flaky's second start
    assert sum(m["conveyor_worker_fetch_batch_size_sum"].values()) == 7
    flushes = m["conveyor_worker_flush_batch_size_sum"]
    assert flushes[(("kind", "finish"),)] == 6 and flushes[(("kind", "retry"),)] == 1
    assert m["conveyor_worker_stale_acks_total"][()] == 0
    assert m["conveyor_worker_jobs_in_flight"][()] == 0
    assert worker.counters.completed == 4


def test_a_stale_ack_is_counted(app: App) -> None:
    @app.task(queue="q")
    def ok() -> None: ...

    job = ok.delay()
    now = host_now()
    backend = app.backend
    (old,) = backend.jobs_acquire(JobsAcquireParams("q", 1, 1.0, "w-1", now))
    backend.jobs_rescue_expired(JobsRescueParams(now + timedelta(seconds=5)))
    (new,) = backend.jobs_acquire(JobsAcquireParams("q", 1, 30.0, "w-2", now + timedelta(seconds=5)))
    assert new.receipt != old.receipt
    metrics = WorkerMetrics()
    config = WorkerConfig(worker_id="w-1")
    loops = build_loops(app.catalogue, app.producer, backend, config, ["q"], host_now, observer=metrics)
    try:
        loops.completer.add(Finish(old.id, old.receipt, "completed"))
        asyncio.run(loops.completer.run_once())
    finally:
        loops.calls.shutdown()
    assert metrics.registry.get_sample_value("conveyor_worker_stale_acks_total") == 1
    assert metrics.registry.get_sample_value("conveyor_worker_flush_batch_size_count", {"kind": "finish"}) == 1
    assert job.status().state == "processing"


def test_a_metrics_port_in_use_is_a_clear_error(app: App) -> None:
    from conveyor import ConfigurationError, Worker

    port = free_port()
    first = Worker(app, metrics_port=port)
    with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
        Worker(app, metrics_port=port)
    assert first.config.metrics_port == port


def test_a_prefork_child_whose_metrics_port_is_taken_stops_the_worker_with_one_line(
    sqlite_url: str, tmp_path: Path
) -> None:
    # Child 1's port is taken: it failed the same way on every restart, twice a second, each time
    # with a traceback, forever. Now the worker stops, says why in one line and exits non-zero.
    (tmp_path / "ported_app.py").write_text(f"from conveyor import App\napp = App({sqlite_url!r})\n")
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        done = subprocess.run(
            [sys.executable, "-m", "conveyor", "worker", "ported_app:app", "-p", "3", "--metrics-port", str(port)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
            timeout=60,
        )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count(f"cannot serve metrics on 127.0.0.1:{port + 1}: Address already in use") == 1
