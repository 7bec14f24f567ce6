"""Profile the report's queries one by one in one warm Spark session: wall and JVM CPU seconds each.

Each query runs twice into Spark's ``noop`` sink (computed, nothing written); the second run is the warm
cost, the first adds code generation and JIT warm-up. CPU seconds are the JVM's (from /proc), which other
work on a shared machine disturbs far less than wall time.

    flock /tmp/conveyor-bench.lock .venv/bin/python bench/pipeline/profile_queries.py \\
        /tmp/conveyor-bench/archive-10000000 floor,scan,histogram,pairs,outcomes,exceptional,latency
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    from pyspark.sql import functions as F

    from conveyor.pipeline._progress import NoStages
    from conveyor.pipeline.spark import get_session

    report = importlib.import_module("conveyor.pipeline.report")
    path, which = sys.argv[1], sys.argv[2].split(",")
    spark = get_session("local[2]")
    jvm = int(
        subprocess.run(["pgrep", "-P", str(os.getpid()), "java"], capture_output=True, text=True).stdout.split()[0]
    )

    def cpu() -> float:
        with open(f"/proc/{jvm}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def timed(name: str, df: Any) -> None:
        for attempt in range(2):
            c0, t0 = cpu(), time.monotonic()
            df.write.format("noop").mode("overwrite").save()
            line = {"query": name, "run": attempt + 1, "wall_s": round(time.monotonic() - t0, 2)}
            line["cpu_s"] = round(cpu() - c0, 2)
            print(json.dumps(line), flush=True)

    work = Path(tempfile.mkdtemp(prefix="conveyor-profile-"))
    rep = report._Report(spark, work, None, {}, 300_000_000, {}, NoStages(), time.monotonic())
    jobs = rep._jobs(path)
    slim = rep._slim(jobs)
    columns = report.REPORT_COLUMNS
    queries = {
        "floor": lambda: jobs.select(*columns).groupBy("queue").agg(F.count(F.lit(1)), *[F.count(c) for c in columns]),
        "scan": lambda: slim.where(F.col("wait") < 0),
        "histogram": lambda: rep._histogram_of(slim),
        "pairs": lambda: rep._pairs_of(slim),
        "outcomes": lambda: rep._outcome_counts(slim),
        "exceptional": lambda: rep._exceptional(jobs),
    }
    for name in which:
        if name == "latency":
            # The latency statistics are computed on the driver (numpy) from the stored histogram:
            # timed here with this process's CPU seconds rather than the JVM's.
            rep._stash("histogram", rep._histogram_of(slim))
            for attempt in range(2):
                c0, t0 = time.process_time(), time.monotonic()
                rep._latency()
                line = {"query": "latency (driver, from the stored histogram)", "run": attempt + 1}
                line.update(wall_s=round(time.monotonic() - t0, 2), cpu_s=round(time.process_time() - c0, 2))
                print(json.dumps(line), flush=True)
        else:
            timed(name, queries[name]())
    spark.stop()


if __name__ == "__main__":
    main()
