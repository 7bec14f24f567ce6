"""Benchmark: `conveyor export` through the storage seam and `--via jdbc`, in archive rows per second.

Creates a throwaway database (``bench_export_<random>``) on the PostgreSQL server named by ``--pg``
(default: ``$CONVEYOR_TEST_POSTGRES_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``, used as
the admin URL), migrates it, fills the archive with ``--rows`` rows by SQL (``bench/fill.py``, not
timed), then runs each way as a separate process, exactly as a user runs it, into a fresh directory:

    python -m conveyor.pipeline export --db URL --out DIR --via seam|jdbc --settle 0 [--master local[2]]

Wall time includes starting Python (and Spark, for JDBC); peak memory is the process tree's RSS.
Prints one JSON line per run; the database is dropped at the end.

    flock /tmp/conveyor-bench.lock .venv/bin/python bench/pipeline/bench_export.py --rows 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.fill import fill  # noqa: E402
from bench_report import _sampled  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument(
        "--pg", default=os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--ways", default="seam,jdbc", help="comma-separated, run in this order")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "conveyor-bench")
    args = parser.parse_args()

    name = f"bench_export_{uuid.uuid4().hex[:10]}"
    base, _, _ = args.pg.rpartition("/")
    url = f"{base}/{name}"
    with psycopg.connect(args.pg, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        from conveyor.backends import open_backend

        backend = open_backend(url)
        try:
            backend.migrate()
        finally:
            backend.close()
        fill_s = fill(url, "archive", args.rows)
        for way in args.ways.split(","):
            out = args.data_dir / f"export-{way}-{args.rows}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "conveyor.pipeline", "export", "--db", url, "--out", str(out)]
            cmd += ["--via", way, "--settle", "0"]
            if way == "jdbc":
                cmd += ["--master", args.master]
            code, stdout, err, wall, peak, cpu = _sampled(cmd, dict(os.environ, COLUMNS="250"))
            if code != 0:
                raise SystemExit(f"export --via {way} failed ({code}):\n{stdout}\n{err}")
            line = {
                "way": way,
                "rows": args.rows,
                "wall_s": round(wall, 1),
                "rows_per_s": round(args.rows / wall),
                "cpu_s": round(cpu, 1),
                "peak_rss_mib": round(peak / 2**20),
                "fill_s": round(fill_s, 1),
                "output": stdout.strip().splitlines()[-1] if stdout.strip() else "",
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
            print(json.dumps(line), flush=True)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
