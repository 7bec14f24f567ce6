"""Fixtures of the observability tests: an App per engine and one OpenTelemetry SDK for the session
(a process has one global tracer provider; each test clears the in-memory exporter)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conveyor import App, Worker

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="session")
def _provider() -> InMemorySpanExporter:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    return _EXPORTER


@pytest.fixture
def spans(_provider: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    _provider.clear()
    yield _provider
    _provider.clear()


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Running:
    """A Worker on its own event loop in a thread, stopped gracefully by :meth:`stop`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        self.loop.run_until_complete(self.worker.run())

    def stop(self, timeout: float = 30) -> None:
        self.loop.call_soon_threadsafe(self.worker.stop)
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        self.loop.close()


def drain(app: App, **options: Any) -> Worker:
    """Run a burst worker until its queues are empty."""
    worker = Worker(app, burst=True, poll_interval=0.02, **options)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    return worker
