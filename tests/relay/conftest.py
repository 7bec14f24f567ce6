"""Fixtures of the relay tests: a real RabbitMQ broker (never skipped) and a unique exchange and queue per test."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from tests.e2e._support import Procs

from conveyor import App, Worker
from conveyor.backends._redact import redact_url

AMQP_URL = os.environ.get("CONVEYOR_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


@dataclass(frozen=True)
class Received:
    """One message as a consumer of the broker gets it."""

    message_id: str | None
    body: bytes
    headers: dict[str, Any]
    content_type: str | None
    delivery_mode: int | None
    exchange: str | None
    routing_key: str | None


@dataclass
class Broker:
    """A test's own exchange (direct) and queue bound to it with the routing key ``key``; deleted afterwards."""

    url: str
    exchange: str
    queue: str
    key: str
    received: list[Received] = field(default_factory=list)
    #: What a test declared besides its exchange and queue: deleted with them.
    extra_exchanges: list[str] = field(default_factory=list)
    extra_queues: list[str] = field(default_factory=list)

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    async def _channel(self) -> tuple[aio_pika.abc.AbstractConnection, aio_pika.abc.AbstractChannel]:
        connection = await aio_pika.connect(self.url, timeout=10)
        return connection, await connection.channel()

    def declare(self, exchange: str | None = None, queue: str | None = None, key: str | None = None) -> None:
        """Declare ``exchange`` (direct, durable) and ``queue`` bound to it by ``key`` (defaults: the test's)."""

        async def declare() -> None:
            connection, channel = await self._channel()
            async with connection:
                ex = await channel.declare_exchange(
                    exchange or self.exchange, aio_pika.ExchangeType.DIRECT, durable=True
                )
                q = await channel.declare_queue(queue or self.queue, durable=True)
                await q.bind(ex, key or self.key)

        self.run(declare())

    def drain(self, queue: str | None = None) -> list[Received]:
        """Take every message waiting in ``queue`` (default: the test's); also kept in ``received``."""

        async def take() -> list[Received]:
            got: list[Received] = []
            connection, channel = await self._channel()
            async with connection:
                q = await channel.get_queue(queue or self.queue)
                while (message := await q.get(fail=False, timeout=10)) is not None:
                    got.append(
                        Received(
                            message.message_id,
                            message.body,
                            dict(message.headers),
                            message.content_type,
                            int(message.delivery_mode) if message.delivery_mode is not None else None,
                            message.exchange,
                            message.routing_key,
                        )
                    )
                    await message.ack()
            return got

        got = self.run(take())
        self.received.extend(got)
        return got

    def depth(self, queue: str | None = None) -> int:
        """How many messages wait in ``queue`` (default: the test's)."""

        async def depth() -> int:
            connection, channel = await self._channel()
            async with connection:
                q = await channel.declare_queue(queue or self.queue, passive=True)
                return int(q.declaration_result.message_count or 0)

        return int(self.run(depth()))

    def ids(self) -> Counter[str | None]:
        """How many times each message_id was received so far (after :meth:`drain`)."""
        return Counter(r.message_id for r in self.received)

    def delete(self, exchanges: list[str], queues: list[str]) -> None:
        async def delete() -> None:
            connection, channel = await self._channel()
            async with connection:
                for name in queues:
                    await channel.queue_delete(name)
                for name in exchanges:
                    await channel.exchange_delete(name)

        self.run(delete())


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The test broker's URL ($CONVEYOR_TEST_AMQP_URL, else the local RabbitMQ); fails (not skips) if it
    cannot be reached."""

    async def check() -> None:
        connection = await aio_pika.connect(AMQP_URL, timeout=5)
        await connection.close()

    try:
        asyncio.run(check())
    except Exception as exc:  # pragma: no cover - a broken environment
        pytest.fail(
            f"RabbitMQ at {redact_url(AMQP_URL)} is required and unreachable ({type(exc).__name__}: {exc}); "
            "start one (scripts/ensure_rabbitmq.py) or set CONVEYOR_TEST_AMQP_URL"
        )
    return AMQP_URL


@pytest.fixture
def broker(amqp_url: str) -> Iterator[Broker]:
    """A unique exchange and queue, declared and bound for this test, deleted after it (with those the test
    named in ``extra_exchanges`` / ``extra_queues``)."""
    tag = uuid.uuid4().hex[:12]
    b = Broker(amqp_url, f"conveyor-test-ex-{tag}", f"conveyor-test-q-{tag}", f"key-{tag}")
    b.declare()
    try:
        yield b
    finally:
        b.delete([b.exchange, *b.extra_exchanges], [b.queue, *b.extra_queues])


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Starts real subprocesses; kills (by process group) any left running at teardown."""
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.cleanup()


@contextmanager
def running_worker(app: App, concurrency: int = 2) -> Iterator[Worker]:
    """A worker on the queue ``outbox`` running in a thread of its own (its own event loop, so one broker
    connection throughout) until the block ends; then stopped gracefully, its loop shut down."""
    worker = Worker(app, ["outbox"], concurrency=concurrency)
    loops: list[asyncio.AbstractEventLoop] = []
    started = threading.Event()

    def run() -> None:
        with asyncio.Runner() as runner:
            loops.append(runner.get_loop())
            started.set()
            runner.run(worker.run())

    thread = threading.Thread(target=run, name="relay-worker")
    thread.start()
    assert started.wait(10)
    try:
        yield worker
    finally:
        loops[0].call_soon_threadsafe(worker.stop)
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"
