"""Stats cost against archive size: ``Admin.queues()`` and a ``/metrics`` scrape on an empty archive
and on 1,000,000 and 10,000,000 archived rows (PostgreSQL), next to the statement they replaced,
which counted the archive on every call.

``flock /tmp/conveyor-bench.lock .venv/bin/python -m bench.stats_cost [--pg URL] [--sizes 0,1000000,10000000]``

One database (``bench_stats_<random>``), filled step by step with ``bench.fill`` (completed rows of
one queue, spread over the last ~14 hours, VACUUM ANALYZE after each step, as autovacuum would have
done) plus 1,000 unreplayed dead letters; at each size every read runs ``--calls`` times after one
warm-up and the median and p95 are reported. The per-queue counters are seeded from the archive after
each fill, as migration 0004 does (the fill writes the archive directly, not through the finish
statement that keeps them). Results: one JSON line per figure in ``bench/results/stats-<stamp>.jsonl``
and a markdown table next to it. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import generate_latest

from bench.fill import fill
from conveyor import App
from conveyor.metrics import database_registry

RESULTS = Path(__file__).with_name("results")

#: The statement queues_stats ran before the counters (commit b5dc15d): it counted the archive.
OLD_QUEUES_STATS = """
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'pending' AND run_at <= now()) AS pending,
           count(*) FILTER (WHERE state = 'pending' AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE state = 'processing') AS processing,
           min(run_at) FILTER (WHERE state = 'pending' AND run_at <= now()) AS oldest_ready
    FROM jobs GROUP BY queue
),
ended AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'completed') AS completed,
           count(*) FILTER (WHERE state = 'dead' AND replayed_by IS NULL) AS dead,
           count(*) FILTER (WHERE state = 'expired') AS expired,
           count(*) FILTER (WHERE state = 'cancelled') AS cancelled
    FROM archive GROUP BY queue
)
SELECT * FROM live FULL JOIN ended USING (queue)
"""

DEAD = """
INSERT INTO archive (id, queue, task, payload, headers, state, priority, run_at, enqueued_at, attempts,
                     deliveries, max_attempts, max_deliveries, finished_at, error_type, reason)
SELECT ('0190b3a2e0007000' || lpad(to_hex(g), 16, '0'))::uuid, 'bench', 'bench.noop', '{}', '{}', 'dead', 0,
       now(), now(), 5, 5, 5, 10, now() - g * interval '1 second', 'RuntimeError', 'max_attempts_exceeded'
FROM generate_series(1, %(n)s) AS g
"""

SEED_COUNTERS = """
TRUNCATE queue_counters;
INSERT INTO queue_counters (queue, task, shard, completed, dead, expired, cancelled)
SELECT queue, task, 0, count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'dead'),
       count(*) FILTER (WHERE state = 'expired'), count(*) FILTER (WHERE state = 'cancelled')
FROM archive GROUP BY queue, task;
"""


def _times(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    fn()  # warm-up: connections, plans, caches
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {
        "median_ms": round(statistics.median(samples), 3),
        "p95_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.95))], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    default_pg = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--pg", default=default_pg, help="admin URL (a database is made and dropped here)")
    parser.add_argument("--sizes", default="0,1000000,10000000", help="archived rows at each step, ascending")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--old-calls", type=int, default=5, help="calls of the old statement (seconds each at 10M)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"stats-{stamp}.jsonl"
    name = f"bench_stats_{secrets.token_hex(4)}"
    base, _, _ = args.pg.rpartition("/")
    db = f"{base}/{name}"
    rows: list[dict[str, Any]] = []
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with App(db) as app:
            app.admin.migrate()
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(DEAD, {"n": 1000})
            have = 0
            registry = database_registry(app.admin)
            meta = {
                "figure": "meta",
                "command": "python -m bench.stats_cost "
                + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "pg"),
                "at": stamp,
            }
            rows.append(meta)
            for size in sizes:
                if size > have:
                    took = fill(db, "archive", size - have, log=True)
                    have = size
                    print(f"filled to {size:,} archived rows in {took:.0f}s", flush=True)
                with psycopg.connect(db, autocommit=True) as conn:
                    for statement in SEED_COUNTERS.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute("VACUUM (ANALYZE) queue_counters")
                    archived = conn.execute("SELECT count(*) FROM archive").fetchone()
                    old = _times(lambda: conn.execute(OLD_QUEUES_STATS).fetchall(), args.old_calls)
                stats = app.admin.queues()
                assert stats[0].completed == size and stats[0].dead == 1000, stats
                row = {
                    "figure": "stats_cost",
                    "archived": archived[0] if archived else None,
                    "queues": _times(app.admin.queues, args.calls),
                    "metrics_scrape": _times(lambda: generate_latest(registry), args.calls),
                    "old_queues_stats": old,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = [
        "| archived rows | Admin.queues() median / p95 | /metrics scrape median / p95 | old queues_stats median |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for r in rows[1:]:
        q, m, o = r["queues"], r["metrics_scrape"], r["old_queues_stats"]
        table.append(
            f"| {r['archived']:,} | {q['median_ms']} / {q['p95_ms']} ms | {m['median_ms']} / {m['p95_ms']} ms "
            f"| {o['median_ms']} ms |"
        )
    (RESULTS / f"stats-{stamp}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
