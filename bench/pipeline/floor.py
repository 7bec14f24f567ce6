"""The floor the report is measured against: one Spark pass over the same Parquet.

Started as its own process, exactly like the report (same session helper, same master and driver
heap), it reads the columns the report reads (``conveyor.pipeline.report.REPORT_COLUMNS``) and
computes one grouped count: rows per queue, and the non-null values of every one of those columns
(a bare ``count(*)`` would let Spark skip decoding them). Prints one JSON line: ``start_s`` (Python
and Spark start) and ``scan_s`` (the pass).

    .venv/bin/python bench/pipeline/floor.py --input /tmp/conveyor-bench/archive-10000000
"""

from __future__ import annotations

import argparse
import json
import time

T0 = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from conveyor.pipeline.report import REPORT_COLUMNS, load_jobs
    from conveyor.pipeline.spark import get_session

    spark = get_session(args.master)
    started = time.monotonic()
    jobs = load_jobs(spark, args.input).select(*REPORT_COLUMNS)
    counts = jobs.groupBy("queue").agg(F.count(F.lit(1)).alias("rows"), *[F.count(c) for c in REPORT_COLUMNS])
    rows = counts.collect()
    done = time.monotonic()
    total = sum(int(r["rows"]) for r in rows)
    print(json.dumps({"rows": total, "start_s": round(started - T0, 2), "scan_s": round(done - started, 2)}))
    spark.stop()


if __name__ == "__main__":
    main()
