"""Fast fills of Conveyor's PostgreSQL tables with ``INSERT ... SELECT generate_series`` (no Python per row).

Used where going through ``send_many`` would take minutes: the 1,000,000 ready jobs of the RSS
run and the "big tables" of the scale run (1,000,000 pending jobs scheduled a day ahead in the
drained queue, 10,000,000 archived rows spread over the last ~14 hours, i.e. the archive partitions
of today and yesterday that the drain writes into). Rows look like what ``send_many`` and the
worker write: the same columns, a small JSON payload, the standard headers.

``python -m bench.fill --db URL --scheduled 1000000 --archived 10000000`` (migrates first).
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg

from bench._common import QUEUE

# Ids are time-ordered like UUIDv7 (a sequence in the low bits of a per-table prefix), so the
# primary keys grow at their right edge as they do in production; the headers are a constant
# object of the usual size.
_HEADERS = """'{"schema_version": 1, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "correlation_id": "0190b3a2-0000-7000-8000-000000000000"}'::jsonb"""


_ID = "(%(prefix)s || lpad(to_hex(g), 16, '0'))::uuid"
_PREFIX = {"ready": "0190b3a2c0007000", "scheduled": "0190b3a2d0007000", "archive": "0190b3a2a0007000"}


# Jobs due later are 'scheduled', as the producer writes them (PostgreSQL's migration 0005).
READY = f"""
INSERT INTO jobs (id, queue, task, payload, headers, state, priority, run_at, enqueued_at, max_attempts,
                  max_deliveries)
SELECT {_ID}, %(queue)s, 'bench.noop', jsonb_build_object('sent', 0.0, 'i', g), {_HEADERS},
       CASE WHEN %(offset)s::float8 > 0 THEN 'scheduled' ELSE 'pending' END, 0,
       now() + make_interval(secs => %(offset)s::float8) + g * interval '1 microsecond', now(), 5, 10
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""

ARCHIVED = f"""
INSERT INTO archive (id, queue, task, payload, headers, state, priority, run_at, enqueued_at, attempts,
                     deliveries, max_attempts, max_deliveries, first_started_at, started_at, lease_expires_at,
                     worker_id, finished_at)
SELECT {_ID}, %(queue)s, 'bench.noop', jsonb_build_object('sent', 0.0, 'i', g), {_HEADERS},
       'completed', 0, t, t, 1, 1, 5, 10, t, t, t + interval '30 seconds', 'bench-fill', t + interval '1 millisecond'
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g,
     LATERAL (SELECT now() - g * interval '5 milliseconds' AS t) AS x
"""


def fill(db: str, table: str, n: int, *, offset: float = 0.0, chunk: int = 1_000_000, log: bool = False) -> float:
    """Insert ``n`` rows into ``jobs`` (ready at now + ``offset`` s) or ``archive``; return seconds."""
    t0 = time.perf_counter()
    with psycopg.connect(db, autocommit=True) as conn:
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk) - 1
            sql = READY if table == "jobs" else ARCHIVED
            prefix = _PREFIX["archive" if table == "archive" else "scheduled" if offset > 0 else "ready"]
            params = {"queue": QUEUE, "offset": offset, "lo": lo, "hi": hi, "prefix": prefix}
            conn.execute(sql, params)
            if log:
                print(f"  {table}: {hi + 1:,}/{n:,} rows, {time.perf_counter() - t0:.0f}s", flush=True)
        # What autovacuum would have done by the time a real table got this big: set hint bits and
        # the visibility map, and give the planner statistics.
        conn.execute(f"VACUUM (ANALYZE) {table}")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--ready", type=int, default=0)
    parser.add_argument("--scheduled", type=int, default=0)
    parser.add_argument("--archived", type=int, default=0)
    args = parser.parse_args()

    from conveyor import App

    with App(args.db) as app:
        app.backend.migrate()
    if args.ready:
        fill(args.db, "jobs", args.ready, log=True)
    if args.scheduled:
        fill(args.db, "jobs", args.scheduled, offset=86_400.0, log=True)
    if args.archived:
        fill(args.db, "archive", args.archived, log=True)
    settle(args.db)


def settle(db: str) -> None:
    """Have what the fills wrote reach the disk before anything is measured on it: a checkpoint, then
    the kernel's dirty pages. Right after gigabytes of fills a checkpoint is still spreading their pages
    over minutes and the kernel flushing them, which slowed the first drains on the big tables by up to
    a fifth (docs/benchmarks.md, session 26); a table that grew big in production has long been written."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    os.sync()


if __name__ == "__main__":
    main()
