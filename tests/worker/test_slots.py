"""The two kinds of slots: coroutines for ``async def`` handlers, threads that loop by themselves for
plain ``def`` ones, sharing the buffer's ``concurrency`` permits (conveyor.worker._buffer)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from conveyor import App, Worker
from conveyor.backends.base import Delivery
from conveyor.worker._buffer import Buffer


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def delivery(task: str) -> Delivery:
    now = datetime.now(UTC)
    return Delivery(
        id=uuid4(), queue="q", task=task, payload="{}", headers="{}", priority=0, run_at=now, enqueued_at=now,
        expires_at=None, attempts=0, deliveries=0, max_attempts=3, max_deliveries=5, idempotency_key=None,
        ordering_key=None, receipt=str(uuid4()), lease_expires_at=now,
    )  # fmt: skip


def test_a_free_permit_goes_to_the_oldest_delivery_whatever_its_kind() -> None:
    buffer = Buffer(1)
    buffer.threaded = frozenset({"def"})
    items = [delivery(kind) for kind in ("def", "async", "async", "def", "def", "async")]
    for item in items:
        buffer.put(item)
    taken: list[Delivery | None] = []

    async def take_all() -> None:
        # The test plays both kinds of slot from one thread, always asking the kind whose turn it is.
        release = False
        for expected in items:
            if expected.task == "def":
                if release:
                    buffer.release()
                taken.append(buffer.take_blocking())
            else:
                taken.append(await buffer.take(release))
            release = True
            assert buffer.running == 1

    asyncio.run(take_all())
    assert taken == items
    assert buffer.empty()


def test_no_permit_no_take_and_close_ends_every_wait() -> None:
    buffer = Buffer(1)
    buffer.threaded = frozenset({"def"})
    first, second = delivery("def"), delivery("def")
    buffer.put(first)
    buffer.put(second)
    assert buffer.take_blocking() is first
    got: list[Delivery | None] = []
    waiting = threading.Thread(target=lambda: got.append(buffer.take_blocking()))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()  # the one permit is taken: the second delivery waits
    buffer.close()
    waiting.join(5)
    assert got == [None]
    assert buffer.drain() == [second]  # closed, what is left is the worker's to hand back


def test_arm_low_fires_once_the_buffer_falls_to_the_level() -> None:
    buffer = Buffer(10)
    buffer.threaded = frozenset({"def"})
    for _ in range(4):
        buffer.put(delivery("def"))
    assert buffer.arm_low(4) is False  # already there: nothing to wait for
    assert buffer.arm_low(2) is True
    buffer.take_blocking()
    assert not buffer.low.is_set()
    buffer.take_blocking()
    assert buffer.low.is_set()


def test_def_jobs_run_on_the_workers_own_slot_threads_not_one_thread_per_job(app: App) -> None:
    threads: set[str] = set()

    @app.task(queue="q")
    def where() -> None:
        threads.add(threading.current_thread().name)

    for _ in range(60):
        where.delay()
    worker = Worker(app, burst=True, poll_interval=0.02, concurrency=3)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    assert worker.counters.completed == 60
    assert threads and threads <= {f"conveyor-handler-{i}" for i in range(3)}


def test_async_and_def_handlers_share_the_concurrency(app: App) -> None:
    lock = threading.Lock()
    running = {"now": 0, "peak": 0}
    kinds: list[str] = []

    def enter(kind: str) -> None:
        with lock:
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
            kinds.append(kind)

    def leave() -> None:
        with lock:
            running["now"] -= 1

    @app.task(queue="q")
    def plain() -> None:
        enter("def")
        time.sleep(0.05)
        leave()

    @app.task(queue="q")
    async def coroutine() -> None:
        enter("async")
        await asyncio.sleep(0.05)
        leave()

    for i in range(24):
        (plain if i % 2 else coroutine).delay()
    worker = Worker(app, burst=True, poll_interval=0.02, concurrency=3)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    assert worker.exit_code == 0
    assert sorted(kinds) == ["async"] * 12 + ["def"] * 12
    # Three slots of each kind exist; the permits keep the two kinds together at three.
    assert running["peak"] == 3


def test_a_def_task_registered_after_the_worker_started_still_runs(app: App) -> None:
    started = threading.Event()

    @app.task(queue="q")
    async def early() -> None:
        started.set()

    async def scenario() -> list[str]:
        early.delay()
        worker = Worker(app, queues=["q"], poll_interval=0.02, concurrency=2)
        running = asyncio.create_task(worker.run())
        await asyncio.to_thread(started.wait, 20)  # its slots are made: it ran a job
        ran: list[str] = []

        @app.task(queue="q")
        def late(i: int) -> None:
            ran.append(threading.current_thread().name)

        for i in range(5):
            late.delay(i=i)
        deadline = time.monotonic() + 20
        while len(ran) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        worker.stop()
        await asyncio.wait_for(running, 30)
        return ran

    ran = asyncio.run(scenario())
    # No thread slot was started for it: each job ran in a handler thread of its own.
    assert ran == ["conveyor-handler"] * 5


def _suspect(task: str) -> Delivery:
    d = delivery(task)
    return Delivery(**{**{f: getattr(d, f) for f in Delivery.__slots__}, "rescues": 1})  # type: ignore[arg-type]


def test_one_suspect_at_a_time_the_others_set_aside_while_other_jobs_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # A suspect (a job whose lease once ran out) waits while another suspect runs, out of the slots:
    # the slots go on with other jobs (a first cut kept it in a slot, and new jobs starved behind it).
    buffer = Buffer(4)
    buffer.threaded = frozenset({"def"})
    first, second, third = _suspect("def"), _suspect("def"), _suspect("def")
    plain = [delivery("def") for _ in range(2)]
    for item in (first, second, plain[0], third, plain[1]):
        buffer.put(item)
    assert buffer.take_blocking() is first
    assert [buffer.take_blocking(), buffer.take_blocking()] == plain  # the other suspects set aside
    assert buffer.qsize() == 2
    got: list[Delivery | None] = []
    waiting = threading.Thread(target=lambda: got.append(buffer.take_blocking()))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()  # a permit is free, but the only buffered jobs are suspects
    buffer.suspect_done(plain[0])  # not the running suspect: nothing changes
    waiting.join(0.2)
    assert waiting.is_alive()
    buffer.suspect_done(first)
    waiting.join(5)
    assert got == [second]
    # The running one past its patience: the next may run beside it (a hung suspect holds no one for ever).
    monkeypatch.setattr("conveyor.worker._buffer.SUSPECT_PATIENCE", 0.0)
    assert buffer.take_blocking(release=True) is third  # a plain job's permit back
    assert buffer.drain() == []


def test_suspects_set_aside_are_handed_back_by_drain() -> None:
    buffer = Buffer(2)
    first, second = _suspect("async"), _suspect("async")
    buffer.put(first)
    buffer.put(second)

    async def take() -> Delivery | None:
        return await buffer.take()

    assert asyncio.run(take()) is first
    assert buffer.qsize() == 1
    assert buffer.drain() == [second]  # what a stopping worker gives back, unstarted
