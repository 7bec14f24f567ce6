"""Synthetic job histories in the export layout, generated with numpy and pyarrow (fast, cached).

A day of traffic over five queues and twenty tasks: exponential waits with a heavy tail, lognormal
run times, ~4 % retried jobs, ~1.5 % dead letters, a few lost deliveries and poison jobs."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from conveyor.pipeline.schema import arrow_schema

QUEUES = np.array(["default", "emails", "billing", "reports", "webhooks"])
QUEUE_WEIGHTS = np.array([0.4, 0.25, 0.15, 0.05, 0.15])
ERRORS = np.array(["TimeoutError", "ConnectionError", "ValueError", "KeyError", "HTTPError", "OSError"])
START_US = 1_780_000_000 * 1_000_000  # 2026-05-28T20:26:40Z
SPAN_US = 86_400 * 1_000_000


def generate(rows: int, out: Path, seed: int = 7, chunk: int = 2_000_000) -> Path:
    """Write ``rows`` synthetic archive rows under ``out/archive`` (skipped if already there)."""
    marker = out / "_synth.json"
    if marker.exists() and json.loads(marker.read_text()).get("rows") == rows:
        return out
    rng = np.random.default_rng(seed)
    schema = arrow_schema()
    part = ds.partitioning(pa.schema([("date", pa.string()), ("queue", pa.string())]), flavor="hive")
    for c, lo in enumerate(range(0, rows, chunk)):
        n = min(chunk, rows - lo)
        idx = np.arange(lo, lo + n, dtype=np.int64)
        enq = START_US + np.sort(rng.integers(0, SPAN_US, n))
        queue = QUEUES[rng.choice(len(QUEUES), n, p=QUEUE_WEIGHTS)]
        priority = rng.choice(np.array([0, 5, 10], dtype=np.int32), n, p=[0.7, 0.2, 0.1])
        task = np.char.add("task_", rng.integers(0, 20, n).astype(str))
        delayed = rng.random(n) < 0.05
        run_at = enq + np.where(delayed, rng.integers(0, 600_000_000, n), 0)
        wait = (rng.exponential(2.0, n) * np.where(rng.random(n) < 0.01, 50, 1) * 1e6).astype(np.int64)
        first_start = run_at + wait
        r = rng.random(n)
        attempts = np.where(r < 0.95, 1, np.where(r < 0.985, rng.integers(2, 4, n), 5)).astype(np.int32)
        lost = (rng.random(n) < 0.004).astype(np.int32) + (rng.random(n) < 0.0005).astype(np.int32) * 2
        deliveries = attempts + lost
        service = (rng.lognormal(-1.0, 1.0, n) * 1e6).astype(np.int64)
        backoff = (attempts - 1).astype(np.int64) * 30_000_000
        retried = attempts > 1
        run_at = np.where(retried, first_start + backoff, run_at)
        started = np.where(retried, run_at + 1_000_000, first_start)
        finished = started + service
        dead = attempts == 5
        expired = rng.random(n) < 0.003
        state = np.where(dead, "dead", np.where(expired, "expired", "completed"))
        has_error = retried | dead
        # Object arrays: a string where there is one, None elsewhere (NULL in the Parquet column).
        error_type = np.where(has_error, ERRORS[rng.integers(0, len(ERRORS), n)], np.array(None, dtype=object))
        reason = np.where(dead, "max_attempts_exceeded", np.array(None, dtype=object))
        reason = np.where(lost >= 2, "max_deliveries_exceeded", reason)
        state = np.where(lost >= 2, "dead", state)
        ts = pa.timestamp("us", tz="UTC")
        never = expired & ~dead
        cols = {
            "job_id": pc.binary_join_element_wise(
                "00000000-0000-7000-8000-", pc.utf8_lpad(pa.array(idx).cast(pa.string()), 12, "0"), ""
            ),
            "task": pa.array(task),
            "state": pa.array(state),
            "priority": pa.array(priority, pa.int32()),
            "attempts": pa.array(np.where(never, 0, attempts), pa.int32()),
            "deliveries": pa.array(np.where(never, 0, deliveries), pa.int32()),
            "max_attempts": pa.array(np.full(n, 5, np.int32)),
            "max_deliveries": pa.array(np.full(n, 10, np.int32)),
            "enqueued_at": pa.array(enq, ts),
            "run_at": pa.array(run_at, ts),
            "expires_at": pa.array(np.where(never, run_at + 1, 0), ts, mask=~never),
            "first_started_at": pa.array(first_start, ts, mask=never),
            "started_at": pa.array(started, ts, mask=never),
            "finished_at": pa.array(np.where(never, run_at + 60_000_000, finished), ts),
            "lease_expires_at": pa.nulls(n, ts),
            "error_type": pa.array(error_type, pa.string()),
            "error_message": pa.array(
                np.where(has_error, "synthetic failure", np.array(None, dtype=object)), pa.string()
            ),
            "reason": pa.array(reason, pa.string()),
            "idempotency_key": pa.nulls(n, pa.string()),
            "ordering_key": pa.nulls(n, pa.string()),
            "replay_of": pa.nulls(n, pa.string()),
            "replayed_by": pa.nulls(n, pa.string()),
            "worker_id": pa.array(np.char.add("w", rng.integers(0, 8, n).astype(str))),
            "headers": pa.array(np.full(n, "{}"), pa.string()),
            "source": pa.array(np.full(n, "archive"), pa.string()),
            "exported_at": pa.array(np.full(n, START_US + SPAN_US * 2), ts),
        }
        table = pa.Table.from_pydict(cols, schema=schema)
        date = pc.strftime(table["finished_at"], format="%Y-%m-%d")
        table = table.append_column("date", date).append_column("queue", pa.array(queue))
        ds.write_dataset(
            table,
            out / "archive",
            format="parquet",
            partitioning=part,
            basename_template=f"part-c{c:04d}-{{i}}.parquet",
            existing_data_behavior="overwrite_or_ignore",
            max_rows_per_group=512 * 1024,
        )
    marker.write_text(json.dumps({"rows": rows, "seed": seed}) + "\n")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("rows", type=int)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    t0 = time.monotonic()
    generate(args.rows, args.out)
    print(json.dumps({"rows": args.rows, "out": str(args.out), "seconds": round(time.monotonic() - t0, 2)}))
