"""Micro-benchmark of the PostgreSQL backend's hot statements (not collected by pytest).

Run: ``.venv/bin/python -m bench.backend_statements [--jobs 100000] [--batch 100] [--threads 1]``

Creates a scratch database on CONVEYOR_TEST_POSTGRES_URL's server, then measures: one
``jobs_insert_many`` of 20,000 jobs; inserting ``--jobs`` jobs in batches of 20,000; draining
them with ``jobs_acquire`` + ``jobs_finish_many`` (``--batch`` jobs per call, ``--threads``
drainers); and prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the acquire statement on the full table.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from datetime import UTC, datetime

import psycopg
from psycopg import sql

from conveyor._ids import uuid7
from conveyor.backends.base import Finish, JobsAcquireParams, JobsFinishParams, JobsInsertParams, NewJob
from conveyor.backends.postgres import PostgresBackend

ADMIN = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _jobs(n: int, queue: str = "bench") -> list[NewJob]:
    now = datetime.now(UTC)
    payload = json.dumps({"order_id": 12345, "amount": "19.99", "currency": "EUR"})
    return [
        NewJob(
            id=uuid7(),
            queue=queue,
            task="bench.task",
            payload=payload,
            headers='{"schema_version": 1}',
            priority=0,
            run_at=now,
            max_attempts=5,
            max_deliveries=10,
        )
        for _ in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    name = f"conveyor_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = ADMIN.rpartition("/")[0] + "/" + name
    backend = PostgresBackend(url)
    try:
        backend.migrate()

        batch = _jobs(20_000, queue="warmup")
        started = time.perf_counter()
        backend.jobs_insert_many(JobsInsertParams(jobs=batch, now=datetime.now(UTC)))
        elapsed = time.perf_counter() - started
        print(f"insert 20,000 jobs in one call: {elapsed * 1000:.0f} ms = {20_000 / elapsed:,.0f} jobs/s")

        jobs = _jobs(args.jobs)
        started = time.perf_counter()
        for i in range(0, len(jobs), 20_000):
            backend.jobs_insert_many(JobsInsertParams(jobs=jobs[i : i + 20_000], now=datetime.now(UTC)))
        elapsed = time.perf_counter() - started
        print(f"insert {args.jobs:,} jobs (20,000 per call): {args.jobs / elapsed:,.0f} jobs/s")

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE jobs")
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + backend._q["jobs_acquire"],
                {
                    "queue": "bench",
                    "limit": args.batch,
                    "visibility_timeout": 30.0,
                    "worker_id": "explain",
                    "now": datetime.now(UTC),
                },
            ).fetchall()
            print("\n".join(str(row[0]) for row in plan))
            conn.execute("ROLLBACK") if conn.info.transaction_status else None

        done = [0]
        lock = threading.Lock()
        timings: list[tuple[float, float]] = []

        def drain(worker: str) -> None:
            while True:
                t0 = time.perf_counter()
                deliveries = backend.jobs_acquire(
                    JobsAcquireParams(
                        queue="bench",
                        limit=args.batch,
                        visibility_timeout=30,
                        worker_id=worker,
                        now=datetime.now(UTC),
                    )
                )
                if not deliveries:
                    return
                t1 = time.perf_counter()
                backend.jobs_finish_many(
                    JobsFinishParams(
                        items=[Finish(id=d.id, receipt=d.receipt, state="completed") for d in deliveries],
                        now=datetime.now(UTC),
                    )
                )
                t2 = time.perf_counter()
                with lock:
                    done[0] += len(deliveries)
                    timings.append((t1 - t0, t2 - t1))

        started = time.perf_counter()
        threads = [threading.Thread(target=drain, args=(f"w{i}",)) for i in range(args.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        acquire_ms = sorted(t[0] * 1000 for t in timings)
        finish_ms = sorted(t[1] * 1000 for t in timings)
        print(
            f"drain {done[0]:,} jobs, batch {args.batch}, {args.threads} thread(s): "
            f"{done[0] / elapsed:,.0f} jobs/s; per call median acquire {acquire_ms[len(acquire_ms) // 2]:.2f} ms, "
            f"finish {finish_ms[len(finish_ms) // 2]:.2f} ms"
        )
    finally:
        backend.close()
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
