"""What one drain costs the database, statement by statement: ``python -m bench.chaos.statements``.

Sends ``--jobs`` no-op jobs (the chaos mix's ``fast`` task) to a throwaway cluster, drains them with
one ``conveyor worker --burst --concurrency C`` process, and prints the drain rate (worker start-up
included) and, from ``pg_stat_statements``, the calls, rows and execution time of each statement the
worker ran. Used to explain a throughput change between two commits (run it on both)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psycopg
from tests.chaos import mix_app as mix
from tests.chaos._cluster import ChaosCluster
from tests.chaos._fleet import REPO

from conveyor import App, Message

from ._lock import bench_lock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.statements", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args(argv)
    with bench_lock(), ChaosCluster() as cluster:
        url = cluster.create_database("statements")
        with App(url, migrate=True) as app:
            mix.register(app, mix.MixConfig())
            app.send_many([Message(task=mix.FAST, payload={"n": n}) for n in range(args.jobs)])
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        argv_worker = [
            sys.executable, "-m", "conveyor", "--db", url, "worker", "tests.chaos.mix_app:app", "--burst",
            "--concurrency", str(args.concurrency),
        ]  # fmt: skip
        t = time.monotonic()
        done = subprocess.run(argv_worker, cwd=REPO, capture_output=True, check=False)
        elapsed = time.monotonic() - t
        print(
            f"{args.jobs:,} jobs in {elapsed:.2f} s: {args.jobs / elapsed:,.0f} jobs/s (worker exit {done.returncode})"
        )
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT calls, rows, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) "
                "FROM pg_stat_statements WHERE calls >= 10 AND query NOT LIKE '%%pg_stat_statements%%' "
                "ORDER BY total_exec_time DESC LIMIT 12"
            ).fetchall()
        print(f"{'calls':>8} {'rows':>8} {'rows/call':>9} {'ms':>8}  statement")
        for calls, nrows, ms, query in rows:
            print(f"{calls:>8,} {nrows:>8,} {nrows / calls:>9.1f} {ms:>8.0f}  {query}")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
