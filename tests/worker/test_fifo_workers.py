"""Per-key FIFO under many workers and injected failures: in order, never two at once per key."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

from conveyor import App, JobContext, Message, Worker


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def test_per_key_fifo_with_many_workers_and_failures(app: App) -> None:
    keys, per_key = 12, 15
    lock = threading.Lock()
    in_flight: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    peak = [0]
    starts: dict[str, list[int]] = defaultdict(list)
    done: dict[str, list[int]] = defaultdict(list)
    rng = random.Random(7)
    fail_first = {(k, s) for k in range(keys) for s in range(per_key) if rng.random() < 0.2}

    @app.task(queue="fifo", max_attempts=5, backoff=[0.02])
    def step(key: str, seq: int, ctx: JobContext) -> None:
        with lock:
            in_flight[key] += 1
            if in_flight[key] > 1:
                overlaps.append(key)
            starts[key].append(seq)
            peak[0] = max(peak[0], sum(in_flight.values()))
        try:
            time.sleep(0.002)
            if (int(key[1:]), seq) in fail_first and ctx.attempt == 1:
                raise ConnectionError("injected")
            with lock:
                done[key].append(seq)
        finally:
            with lock:
                in_flight[key] -= 1

    # Interleave the keys so that every acquire batch holds several jobs of each key.
    app.send_many(
        [
            Message(step.name, {"key": f"k{k}", "seq": s}, ordering_key=f"k{k}")
            for s in range(per_key)
            for k in range(keys)
        ]
    )
    workers = [
        Worker(app, queues=["fifo"], concurrency=4, prefetch=8, poll_interval=0.01, burst=True) for _ in range(3)
    ]

    async def run_all() -> None:
        await asyncio.gather(*(w.run() for w in workers))

    asyncio.run(asyncio.wait_for(run_all(), 120))
    assert overlaps == []
    for k in range(keys):
        key = f"k{k}"
        assert done[key] == list(range(per_key)), key
        # Starts never go backwards: a retry repeats its own seq before the key moves on.
        assert starts[key] == sorted(starts[key]), key
    assert sum(len(v) for v in done.values()) == keys * per_key
    # Different keys did run in parallel.
    assert peak[0] > 1
    assert sum(w.counters.completed for w in workers) == keys * per_key
