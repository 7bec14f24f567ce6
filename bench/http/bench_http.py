"""HTTP producer benchmark: 64 concurrent clients each sending single jobs to `conveyor serve`.

Group commit against one transaction per request (`--no-group-commit`), on a PostgreSQL cluster of
its own with default settings (fsync and synchronous_commit on, autovacuum on: the way users run it),
started in a temporary directory and removed afterwards. The load generator is wrk (Debian's `wrk`)
with bench/http/send.lua; its own CPU time is measured and reported, as are the server's and
PostgreSQL's. Every figure is checked: the jobs the database holds equal the 202s wrk counted.

    flock /tmp/conveyor-bench.lock .venv/bin/python bench/http/bench_http.py --seconds 20 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from bench._cluster import Cluster, children, free_port  # noqa: E402
from bench._common import cpu_seconds  # noqa: E402


def conveyor(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", "--db", db, *args], check=True, capture_output=True, text=True, cwd=REPO
    )


def wrk(url: str, token: str, seconds: float, connections: int, threads: int) -> tuple[dict[str, float], float]:
    """Run wrk; return its JSON summary and its own CPU seconds."""
    env = {**os.environ, "CONVEYOR_TOKEN": token, "CONVEYOR_QUEUE": "bench"}
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{round(seconds)}s", "--timeout", "10s"]
    argv += ["-s", str(HERE / "send.lua")]
    proc = subprocess.Popen([*argv, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        sys.exit(f"wrk failed: {out} {proc.stderr.read() if proc.stderr else ''}")
    summary = json.loads(out.strip().splitlines()[-1])
    return summary, usage.ru_utime + usage.ru_stime


def run_mode(
    cluster: Cluster, mode: str, args: argparse.Namespace, variant: tuple[str, dict[str, str]] = ("", {})
) -> dict[str, object]:
    db = cluster.database(f"http_bench_{mode.replace('-', '_')}")
    conveyor(db, "migrate")
    token = conveyor(db, "tokens", "create", "bench", "--role", "producer").stdout.strip()
    port = free_port()
    argv = [sys.executable, "-m", "conveyor", "--db", db, "serve", "--port", str(port), "--workers", str(args.workers)]
    if mode != "group":
        argv.append("--no-group-commit")
    serve = subprocess.Popen(
        argv,
        cwd=REPO,
        env={**os.environ, **variant[1]},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or serve.poll() is not None:
                    output = serve.stderr.read().decode(errors="replace") if serve.stderr else ""
                    sys.exit(f"conveyor serve did not start: {output}")
                time.sleep(0.2)
        time.sleep(1.0)
        wrk(url, token, args.warmup, args.connections, args.threads)  # warm-up: connections, caches, plans
        time.sleep(1.0)  # the warm-up's last requests are answered after wrk stopped listening
        with psycopg.connect(db) as conn:
            before = int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])  # type: ignore[index]
        server_pids = [serve.pid, *children(serve.pid)]
        server0, pg0, load0 = cpu_seconds(server_pids), cpu_seconds(cluster.pids()), os.getloadavg()[0]
        summary, wrk_cpu = wrk(url, token, args.seconds, args.connections, args.threads)
        server1, pg1 = cpu_seconds(server_pids), cpu_seconds(cluster.pids())
        time.sleep(1.0)
        with psycopg.connect(db) as conn:
            after = int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])  # type: ignore[index]
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    elapsed = summary["duration_us"] / 1e6
    stored = after - before
    # wrk stops reading when its time is up: the requests then in flight (at most one per connection)
    # are committed and answered, but not counted.
    if not summary["accepted"] <= stored <= summary["accepted"] + args.connections:
        sys.exit(f"{mode}: the database holds {stored} new jobs but wrk counted {summary['accepted']} 202s")
    return {
        "mode": mode,
        "variant": variant[0],
        "workers": args.workers,
        "connections": args.connections,
        "seconds": round(elapsed, 2),
        "accepted": summary["accepted"],
        "stored": stored,
        "refused": summary["refused"],
        "errors": summary["connect_errors"] + summary["read_errors"] + summary["write_errors"] + summary["timeouts"],
        "jobs_per_s": round(summary["accepted"] / elapsed),
        "p50_ms": round(summary["p50_us"] / 1000, 2),
        "p90_ms": round(summary["p90_us"] / 1000, 2),
        "p99_ms": round(summary["p99_us"] / 1000, 2),
        "max_ms": round(summary["max_us"] / 1000, 2),
        "server_cpu_cores": round((server1 - server0) / elapsed, 2),
        "postgres_cpu_cores": round((pg1 - pg0) / elapsed, 2),
        "wrk_cpu_cores": round(wrk_cpu / elapsed, 2),
        "server_cpu_us_per_job": round(1e6 * (server1 - server0) / max(1, summary["accepted"]), 1),
        "load_average_at_start": round(load0, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--workers", type=int, default=2, help="conveyor serve processes")
    parser.add_argument("--modes", default="group,per-request")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--variants",
        default="=",
        help="'A=;B=NAME=1,NAME2=x': every mode once per variant (environment of the server), interleaved",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install wrk")
    cluster = Cluster()
    try:
        print(json.dumps({"postgres": cluster.settings(), "command": " ".join(sys.argv)}), flush=True)
        variants = []
        for part in args.variants.split(";"):
            name, _, env = part.partition("=")
            variants.append((name, dict(kv.split("=", 1) for kv in env.split(",") if kv)))
        for _ in range(args.repeat):
            for variant in variants:
                for mode in args.modes.split(","):
                    print(json.dumps(run_mode(cluster, mode, args, variant)), flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
