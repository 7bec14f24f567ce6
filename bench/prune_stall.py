"""Does pruning a large archive stall the workers? (issue 3: "pruning 1,000,000 archived rows").

Loads 1,000,000 archived rows into a fresh PostgreSQL database — half in old daily partitions (past the
default 7-day retention: pruned by dropping partitions), half finished an hour ago on a queue whose
retention is 30 minutes (pruned row by row in bounded batches) — then runs one worker (10 slots) fed a
steady 200 jobs/s, first without pruning, then while the pruner deletes all 1,000,000 rows. Prints the
pickup latency (enqueue to handler start) and throughput of both phases as JSON lines.

    .venv/bin/python bench/prune_stall.py [--rows 1000000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from conveyor import App, Worker
from conveyor.worker._calls import BackendCalls
from conveyor.worker._state import Counters
from conveyor.worker.pruner import Pruner

SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def load_archive(url: str, rows: int) -> None:
    half = rows // 2
    with psycopg.connect(url, autocommit=True) as conn:
        old_first_day = (datetime.now(UTC) - timedelta(days=20)).date()
        conn.execute("SELECT conveyor_archive_partitions_ensure(%s::date, 10)", (old_first_day,))
        fill = """
            INSERT INTO archive (id, queue, task, payload, headers, state, priority, run_at, enqueued_at,
                                 attempts, deliveries, max_attempts, max_deliveries, finished_at)
            SELECT gen_random_uuid(), %(queue)s, 'bench.noop', '{}'::jsonb, '{}'::jsonb, 'completed', 0,
                   %(at)s - (g %% 86400) * interval '1 second', %(at)s - (g %% 86400) * interval '1 second',
                   1, 1, 5, 10, %(at)s - (g %% %(spread)s) * interval '1 second'
            FROM generate_series(1, %(n)s) AS g
        """
        now = datetime.now(UTC)
        # Old rows: spread over days 19..11 ago, past the 7-day default retention.
        conn.execute(fill, {"queue": "old", "at": now - timedelta(days=11), "n": half, "spread": 8 * 86400})
        # Recent rows of a queue whose retention is 30 minutes: deleted in batches, not dropped.
        conn.execute(fill, {"queue": "short", "at": now - timedelta(hours=1), "n": rows - half, "spread": 600})
        conn.execute("ANALYZE archive")


def phase(app: App, seconds: float, rate: float, prune: bool) -> dict[str, float | str]:
    latencies: list[float] = []
    lock = threading.Lock()
    name = f"bench.pickup.{uuid.uuid4().hex[:6]}"

    @app.task(name=name, queue="live")
    async def pickup(t: float) -> None:
        with lock:
            latencies.append(time.time() - t)

    worker = Worker(app, queues=["live"], concurrency=10, prune_interval=3600)
    done = threading.Event()
    pruned = [0, 0.0]

    def run_worker() -> None:
        async def main() -> None:
            task = asyncio.create_task(worker.run())
            await asyncio.to_thread(done.wait)
            worker.stop()
            await task

        asyncio.run(main())

    def run_pruner() -> None:
        calls = BackendCalls(app.backend, Counters(), threads=1)
        started = time.perf_counter()
        pruned[0] = asyncio.run(Pruner(app.catalogue, calls, lambda: datetime.now(UTC)).run_once())
        pruned[1] = time.perf_counter() - started
        calls.shutdown()

    thread = threading.Thread(target=run_worker)
    thread.start()
    time.sleep(1.0)
    pruner = threading.Thread(target=run_pruner) if prune else None
    if pruner:
        pruner.start()
    sent, start = 0, time.perf_counter()
    # While pruning, keep sending until the pruner is done, so that every deletion overlaps live work.
    while time.perf_counter() - start < seconds or (pruner is not None and pruner.is_alive()):
        app.send(name, {"t": time.time()})
        sent += 1
        time.sleep(max(0.0, start + sent / rate - time.perf_counter()))
    elapsed = time.perf_counter() - start
    time.sleep(1.0)
    if pruner:
        pruner.join()
    done.set()
    thread.join()
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    return {
        "phase": "during pruning" if prune else "baseline",
        "sent": sent,
        "ran": len(latencies),
        "pickup_p50_ms": round(q[49] * 1000, 2),
        "pickup_p99_ms": round(q[98] * 1000, 2),
        "pickup_max_ms": round(latencies[-1] * 1000, 2),
        "seconds": round(elapsed, 1),
        "rows_pruned": pruned[0],
        "prune_seconds": round(pruned[1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0)
    args = parser.parse_args()
    name = f"conveyor_prune_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = SERVER.rsplit("/", 1)[0] + "/" + name
    try:
        app = App(url, migrate=True)
        app.backend.migrate()
        app.queue("short", retention=timedelta(minutes=30))
        t = time.perf_counter()
        load_archive(url, args.rows)
        print(json.dumps({"loaded_rows": args.rows, "load_seconds": round(time.perf_counter() - t, 1)}))
        for prune in (False, True):
            print(json.dumps(phase(app, args.seconds, args.rate, prune)))
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM archive WHERE queue IN ('old', 'short')").fetchone()
        print(json.dumps({"bulk_rows_left": left[0] if left else None}))
        app.close()
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
