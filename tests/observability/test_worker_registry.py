"""The worker registry: a running worker lists itself with the jobs it holds, and leaves on stop."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

from conveyor import App, Worker

from .conftest import Running


def _wait_for(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_running_worker_lists_itself_with_its_in_flight_jobs(app: App) -> None:
    release = threading.Event()
    started = threading.Event()

    @app.task(queue="q")
    def hold() -> None:
        started.set()
        release.wait(30)

    @app.task(queue="other")
    def nothing() -> None: ...

    job = hold.delay()
    worker = Worker(app, queues=["q", "other"], concurrency=1, prefetch=1, presence_interval=0.05, poll_interval=0.02)
    running = Running(worker)
    try:
        assert started.wait(20)
        _wait_for(lambda: any(job.id in w.in_flight for w in app.admin.workers()))
        (info,) = app.admin.workers()
        assert (info.id, info.host, info.pid) == (worker.worker_id, socket.gethostname(), os.getpid())
        assert (info.queues, info.concurrency, info.alive, info.in_flight) == (("q", "other"), 1, True, (job.id,))
        assert info.started_at <= info.last_seen
        # A worker that stops reporting is listed as not alive.
        assert app.admin.workers(stale_after=timedelta(0))[0].alive is False
        release.set()
        _wait_for(lambda: job.status().state == "completed")
        _wait_for(lambda: app.admin.workers()[0].in_flight == ())
    finally:
        release.set()
        running.stop()
    assert app.admin.workers() == []
