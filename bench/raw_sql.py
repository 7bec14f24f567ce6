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

import psycopg

from bench._common import emit
from bench.floors import acquire_params, column, finish_params, setup_jobs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    q = setup_jobs(args.db, args.n)
    id_at, receipt_at = column("id"), column("receipt")
    done = 0
    deadline = time.monotonic() + args.timeout
    with psycopg.connect(args.db, autocommit=True) as conn:
        conn.execute(q["session_setup"])
        t0 = time.perf_counter()
        while time.monotonic() < deadline:
            rows = conn.execute(q["jobs_acquire"], acquire_params(args.batch, "raw"), prepare=True).fetchall()
            if not rows:
                break
            acks = [(row[id_at], row[receipt_at]) for row in rows]
            conn.execute(q["jobs_finish_many"], finish_params(acks), prepare=True)
            done += len(rows)
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
