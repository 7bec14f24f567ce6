"""``conveyor worker --processes 2 --metrics-port P``: each worker process serves its own metrics, on
P and P + 1, and each is listed in the worker registry; a SIGTERM stops them and they leave it."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conveyor import App, Message

from . import e2e_app
from ._support import Procs, wait_until, worker_argv


def _two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two adjacent free ports")


def _started(port: int) -> float | None:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.TransportError:
        return None
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "conveyor_worker_jobs_started_total":
                total += sample.value
    return total


def test_each_prefork_child_serves_its_own_metrics_port(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    producer = App(sqlite_url)
    e2e_app.register(producer)
    try:
        producer.send_many([Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(200)])
        port = _two_free_ports()
        supervisor = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--processes", "2", "--concurrency", "2", "--metrics-port", str(port)),
            env={"E2E_WORK_SLEEP": "0.005"},
        )
        wait_until(lambda: producer.admin.queues()[0].completed == 200 or None, 120, "the drain")
        counts = [wait_until(lambda p=p: _started(p), 30, f"metrics on {p}") for p in (port, port + 1)]
        # Both processes took work, and between them they started every job (none twice: long leases).
        assert all(c > 0 for c in counts) and sum(counts) == 200, counts
        workers = wait_until(lambda: [w for w in producer.admin.workers() if w.alive] or None, 30, "the registry")
        assert len(workers) == 2 and {w.pid for w in workers} != {supervisor.pid}
        supervisor.popen.send_signal(signal.SIGTERM)
        assert supervisor.popen.wait(timeout=60) == 0, supervisor.output()
        assert producer.admin.workers() == []
    finally:
        producer.close()
