"""Workload 6, the database's own limit: Conveyor's acquire and finish statements, read from the
PostgreSQL backend's own queries.sql, driven in batches by a tight psycopg loop with no worker
around them (no event loop, no threads, no handler, no policy).

``python -m bench.raw_sql --db URL --n 20000 --batch 10``: the jobs are inserted first with the
backend (not timed), then one connection loops acquire(batch) → finish(batch) until the queue is
empty. Prints one ``BENCH-RESULT`` line: jobs/s from the first acquire to the last finish.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime

import psycopg

from bench._common import QUEUE, emit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    from conveyor import App, Message
    from conveyor.backends._sql import load_queries

    app = App(args.db)
    app.backend.migrate()
    for start in range(0, args.n, 5000):
        count = min(5000, args.n - start)
        app.send_many([Message(task="bench.noop", queue=QUEUE, payload={"sent": 0.0, "i": i}) for i in range(count)])
    app.close()

    q = load_queries("conveyor.backends.postgres")
    done = 0
    deadline = time.monotonic() + args.timeout
    with psycopg.connect(args.db, autocommit=True) as conn:
        conn.execute(q["session_setup"])
        t0 = time.perf_counter()
        while time.monotonic() < deadline:
            now = datetime.now(UTC)
            rows = conn.execute(
                q["jobs_acquire"],
                # start = the whole batch: every job runs at once, as in a worker with free slots.
                {"queue": QUEUE, "limit": args.batch, "visibility_timeout": 30.0, "worker_id": "raw", "now": now,
                 "start": args.batch},
                prepare=True,
            ).fetchall()
            if not rows:
                break
            n = len(rows)
            conn.execute(
                q["jobs_finish_many"],
                {
                    "ids": [r[0] for r in rows],
                    "receipts": [uuid.UUID(r[15]) for r in rows],
                    "states": ["completed"] * n,
                    "results": [None] * n,
                    "reasons": [None] * n,
                    "error_types": [None] * n,
                    "error_messages": [None] * n,
                    "tracebacks": [None] * n,
                    "ran": [True] * n,
                    "now": datetime.now(UTC),
                },
                prepare=True,
            )
            done += n
        seconds = time.perf_counter() - t0
    emit(
        {
            "lib": "raw-sql",
            "workload": "raw_sql",
            "batch": args.batch,
            "ok": done >= args.n,
            "n": args.n,
            "done": done,
            "seconds": round(seconds, 4),
            "rate": round(done / seconds, 1),
        }
    )


if __name__ == "__main__":
    main()
