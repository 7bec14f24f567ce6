"""One workload for one library, in its own process: ``python -m bench.driver LIB WORKLOAD [options]``.

The runner (bench/run.py) starts this with the library's interpreter (the project's venv for
Conveyor, bench/.venv-peers for the peers), on a fresh database / Redis db, and reads the one
``BENCH-RESULT {json}`` line it prints. Workloads:

- ``batch``: enqueue N jobs with the library's bulk API; jobs/s of the call (building the
  library's message objects included).
- ``single``: enqueue N jobs one call (one transaction) each; jobs/s.
- ``drain``: enqueue N jobs (not timed), start the worker, wait until the side channel counted N.
- ``latency``: start the worker, warm it up, let it go idle, send N jobs ``interval`` apart;
  enqueue-to-start p50/p99 from the side channel.
- ``rss``: like drain, sampling the worker's VmRSS at the given completion counts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path
from typing import Any

from bench._common import (
    context_switches,
    cpu_seconds,
    drain_result,
    emit,
    latency_result,
    paced_sends,
    side_count,
    start_worker,
    stop_worker,
    vmrss_kib,
    wait_count,
    worker_env,
)


def payloads(n: int, start: int = 0, pad: int = 0) -> list[dict[str, Any]]:
    """``n`` job payloads; with ``pad`` > 0 each carries a ``pad``-character string as well (the
    1 KiB-payload figures)."""
    if pad:
        text = "x" * pad
        return [{"sent": 0.0, "i": i, "pad": text} for i in range(start, start + n)]
    return [{"sent": 0.0, "i": i} for i in range(start, start + n)]


def enqueue_all(adapter: Any, n: int, chunk: int) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        adapter.bulk(payloads(min(chunk, n - start), start))
    return time.perf_counter() - t0


def worker_pids(pid: int) -> list[int]:
    """The worker and its descendants (a prefork supervisor's children)."""
    pids = [pid]
    for p in pids:
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except FileNotFoundError:
            continue
        pids.extend(int(c) for c in children)
    return pids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lib")
    parser.add_argument("workload", choices=["batch", "single", "drain", "latency", "rss"])
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--db", default="")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--side", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--interval", type=float, default=0.020, help="latency: seconds between sends")
    parser.add_argument("--chunk", type=int, default=5000, help="drain setup: jobs per bulk call")
    parser.add_argument("--rss-at", default="100000,1000000", help="rss: completion counts to sample at")
    parser.add_argument("--options", default="{}", help="library options (JSON)")
    parser.add_argument("--idle", type=float, default=1.0, help="latency: seconds of idleness before the sends")
    parser.add_argument("--payload-bytes", type=int, default=0, help="batch: a string of this size in each payload")
    parser.add_argument("--warm", type=int, default=5, help="latency: jobs drained before the idle second")
    parser.add_argument("--prefilled", type=int, default=0, help="drain/rss: the jobs are already in the database")
    args = parser.parse_args()

    options = json.loads(args.options)
    module = importlib.import_module(f"bench.adapters.{args.lib}")
    adapter = module.Adapter(args.db, args.redis, options)
    result: dict[str, Any] = {"lib": args.lib, "workload": args.workload, "version": adapter.version()}
    args.side.unlink(missing_ok=True)
    try:
        if args.workload == "batch":
            jobs = payloads(args.n, pad=args.payload_bytes)
            t0 = time.perf_counter()
            adapter.bulk(jobs)
            seconds = time.perf_counter() - t0
            result.update(ok=True, n=args.n, seconds=round(seconds, 4), rate=round(args.n / seconds, 1))
        elif args.workload == "single":
            jobs = payloads(args.n)
            t0 = time.perf_counter()
            for job in jobs:
                adapter.single(job)
            seconds = time.perf_counter() - t0
            result.update(ok=True, n=args.n, seconds=round(seconds, 4), rate=round(args.n / seconds, 1))
        elif args.workload in ("drain", "rss"):
            setup = 0.0 if args.prefilled else enqueue_all(adapter, args.n, args.chunk)
            env = worker_env(args.side, adapter.worker_env())
            spawned = time.time()
            proc = start_worker(adapter.worker_argv(), env, args.log)
            try:
                if args.workload == "drain":
                    ok = wait_count(args.side, args.n, args.timeout, proc)
                    # The worker's own CPU (its processes' user + system time, start-up included):
                    # less sensitive than jobs/s to what else the machine runs.
                    pids = worker_pids(proc.pid)
                    result["worker_cpu_us_per_job"] = round(1e6 * cpu_seconds(pids) / args.n, 1)
                    # And its context switches (wake-ups, GIL hand-offs), all its threads, per job.
                    result["worker_switches_per_job"] = round(context_switches(pids) / args.n, 2)
                else:
                    ok, samples = sample_rss(proc.pid, args, [int(x) for x in args.rss_at.split(",")])
                    result["rss_kib"] = samples
            finally:
                stop_worker(proc)
            result.update(drain_result(args.side, args.n, spawned, ok), setup_seconds=round(setup, 2))
            if args.workload == "rss" and result.get("rss_kib"):
                values = [v for _, v in result["rss_kib"]]
                result["rss_growth"] = round(values[-1] / values[0] - 1, 4)
        elif args.workload == "latency":
            env = worker_env(args.side, adapter.worker_env())
            proc = start_worker(adapter.worker_argv(), env, args.log)
            try:
                warm = args.warm
                enqueue_all(adapter, warm, args.chunk)
                ok = wait_count(args.side, warm, args.timeout, proc)
                if ok:
                    time.sleep(args.idle)  # idle: every loop of the worker back to waiting
                    paced_sends(lambda ts: adapter.single({"sent": ts, "i": 0}), args.n, args.interval)
                    ok = wait_count(args.side, warm + args.n, 30, proc)
            finally:
                stop_worker(proc)
            result.update(latency_result(args.side, args.n, ok), interval_ms=args.interval * 1000)
        result["side_count"] = side_count(args.side)
    finally:
        adapter.close()
    emit(result)


def sample_rss(pid: int, args: argparse.Namespace, at: list[int]) -> tuple[bool, list[tuple[int, int]]]:
    """Wait for each completion count in ``at`` and read the worker's resident set there (the sum
    over the worker and its children, in KiB)."""
    samples: list[tuple[int, int]] = []
    deadline = time.monotonic() + args.timeout
    for count in at:
        while side_count(args.side) < count:
            if time.monotonic() > deadline:
                return False, samples
            time.sleep(0.05)
        rss = sum(vmrss_kib(p) or 0 for p in worker_pids(pid))
        samples.append((count, rss))
    return True, samples


if __name__ == "__main__":
    main()
