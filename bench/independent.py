"""Issue 13's harness: the conditions of the independent measurement, reproduced in bench/.

``flock /tmp/conveyor-bench.lock .venv/bin/python -m bench.independent [--repeats 2]``

- A PostgreSQL cluster of its own with default settings (bench/_cluster.py: autovacuum on), started
  for the run and removed after it; Redis on 127.0.0.1:6379 db 13 (flushed before each figure).
- The job body of the drain and pickup figures is one Redis ``INCR`` (``BENCH_BODY=redis``: the
  async client in ``async def`` handlers, the sync client in ``def`` ones); the handler stamps its
  start as its first statement (the side channel) and then runs the body.
- The floors, in the same run, next to the figures they bound (bench/floors.py): the handlers'
  body alone (the stamp, then the ``INCR``; also the ``INCR`` alone, the floor before session 23)
  10 at a time in asyncio and in 10 threads; the pickup floor (one durable insert + NOTIFY, a
  listener thread claiming with one UPDATE ... SKIP LOCKED RETURNING); pgbench driving the bare
  acquire + finish SQL with 2 clients and batches of 100. Beside the body floors, the queue floors
  (since session 24): a minimal worker on Conveyor's own statements running the same body, in
  asyncio and in threads; reported in parentheses (how far the shape gets), not as targets.
- Batch enqueue at 1,000, 20,000 and 100,000 jobs per call, with empty and 1 KiB payloads; the
  peers' bulk APIs build their messages inside the timed call.
- Pickup: the producer stamps right before ``delay()``, the body's first statement stamps the start;
  the sends start 1 s after a 20,000-job drain on the same worker.
- One worker process × 10 slots for every library (the no-op drain against pgbench: 2 processes).
- What was met before stays met, on the same cluster in the same run (section ``kept``, first round
  only, no-op body as in the suite): the SQLite drain (≥ 2,500 jobs/s), the drain with 1,000,000
  scheduled jobs in its queue and 10,000,000 archived rows against drains on empty tables, alternated
  three times (within 10 %), and the worker's RSS from 100,000 to 1,000,000 jobs (flat ± 10 %).

Each target is a ratio of two figures of the same run (medians over ``--repeats``). Results:
``bench/results/independent-<stamp>.jsonl`` (first line: meta, with the command) and ``.md``.
``--variants 'A=;B=NAME=1'`` runs every Conveyor figure once per variant (environment of the driver
and its worker), interleaved, for an A/B of a lever in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._cluster import Cluster
from bench._common import ROOT
from bench.run import POSTGRES_PEERS, Runner, Sizes, ensure_peers, fill_ready, git_state, machine, vacuum

RESULTS = ROOT / "bench" / "results"
SECTIONS = ("body", "pickup", "limit", "batch", "single", "peers", "kept")
# The drain targets: handler kind, the least share of its body floor, and the figures of the body floor,
# the minimal queue (bench.floors queue_*) and Conveyor's drain.
DRAIN_TARGETS = (
    ("async def", 0.8, "floor_body_async", "floor_queue_async", "drain_async_io"),
    ("def", 0.7, "floor_body_threads", "floor_queue_threads", "drain_def_io"),
    ("def, --pin", 0.7, "floor_body_threads", "floor_queue_threads", "drain_def_io_pinned"),
    (
        "def, --pin, floors pinned",
        0.7,
        "floor_body_threads_pinned",
        "floor_queue_threads_pinned",
        "drain_def_io_pinned",
    ),
)


def flush_redis() -> None:
    subprocess.run(["redis-cli", "-n", "13", "FLUSHDB"], capture_output=True, check=False)


class Harness:
    def __init__(self, args: argparse.Namespace, runner: Runner) -> None:
        self.args = args
        self.r = runner
        self.round = 0
        self.variants: list[tuple[str, dict[str, str]]] = []
        for part in args.variants.split(";"):
            name, _, env = part.partition("=")
            pairs = dict(kv.split("=", 1) for kv in env.split(",") if kv)
            self.variants.append((name, pairs))

    def conveyor(self, fn: Callable[[], dict[str, Any] | None]) -> None:
        """Run a Conveyor figure once per variant, in the variant's environment. The order turns
        every round: with a fixed order, the figure run first after another section was slower in 3
        of 3 rounds, and after the order was swapped the other variant was (a position effect whose
        cause was not isolated; bench/results/independent-20261124-032652 and -032902)."""
        turn = self.round % len(self.variants)
        for name, env in self.variants[turn:] + self.variants[:turn]:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                result = fn()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            if result is not None:
                result["variant"] = name
                self.rewrite_last(result)

    def rewrite_last(self, result: dict[str, Any]) -> None:
        lines = self.r.out.read_text().splitlines()
        lines[-1] = json.dumps(result, sort_keys=True)
        self.r.out.write_text("\n".join(lines) + "\n")

    def floor(self, kind: str, label: str, **extra: Any) -> dict[str, Any] | None:
        argv = [sys.executable, "-m", "bench.floors", kind]
        db_name = None
        if kind in ("pickup", "pgbench", "queue_async", "queue_split", "queue_threads"):
            db_name = self.r.fresh_db()
            argv += ["--db", self.r.url(db_name)]
        for key, value in extra.items():
            argv += [f"--{key}"] if value is True else [f"--{key}", str(value)]
        flush_redis()
        return self.r._call(argv, label, "floor", fresh_db=db_name)

    def lib(self, lib: str, workload: str, n: int, label: str, **extra: Any) -> dict[str, Any] | None:
        flush_redis()
        return self.r.run(lib, workload, n, label=label, **extra)

    # -- sections -------------------------------------------------------------------------------

    def body(self) -> None:
        a = self.args
        os.environ["BENCH_BODY"] = "redis"
        try:
            self.floor("body_async", "floor_body_async", n=a.n_drain)
            self.floor("body_async", "floor_body_async_bare", n=a.n_drain, bare=True)
            self.floor("queue_async", "floor_queue_async", n=a.n_drain)
            # The same minimal worker with its database work in a second process (session 37).
            self.floor("queue_split", "floor_queue_split", n=a.n_drain)
            self.conveyor(lambda: self.lib("conveyor", "drain", a.n_drain, "drain_async_io"))
            self.floor("body_threads", "floor_body_threads", n=a.n_drain)
            self.floor("body_threads", "floor_body_threads_bare", n=a.n_drain, bare=True)
            self.floor("queue_threads", "floor_queue_threads", n=a.n_drain)
            self.conveyor(lambda: self.lib("conveyor", "drain", a.n_drain, "drain_def_io", options={"sync": True}))
            # `conveyor worker --pin` (session 33), and the thread floors on one CPU as well.
            self.floor("body_threads", "floor_body_threads_pinned", n=a.n_drain, pin=True)
            self.floor("queue_threads", "floor_queue_threads_pinned", n=a.n_drain, pin=True)
            self.conveyor(
                lambda: self.lib(
                    "conveyor", "drain", a.n_drain, "drain_def_io_pinned", options={"sync": True, "pin": True}
                )
            )
        finally:
            os.environ.pop("BENCH_BODY", None)

    def pickup(self) -> None:
        a = self.args
        os.environ["BENCH_BODY"] = "redis"
        try:
            self.floor("pickup", "floor_pickup", n=a.n_pickup)
            self.conveyor(lambda: self.lib("conveyor", "latency", a.n_pickup, "pickup", warm=a.n_drain))
        finally:
            os.environ.pop("BENCH_BODY", None)

    def limit(self) -> None:
        a = self.args
        self.floor("pgbench", "floor_pgbench", n=a.n_pgbench, batch=100, clients=2)
        self.conveyor(
            lambda: self.lib("conveyor", "drain", a.n_noop_drain, "drain_noop_2proc", options={"processes": 2})
        )

    def batch(self) -> None:
        a = self.args
        libs = [lib for lib in self.libs() if lib in ("conveyor", "pgqueuer", "procrastinate", "rq")]
        for size in a.batch_sizes:
            for pad in a.payload_bytes:
                label = f"batch_{size}_{pad}b"
                for lib in libs:
                    if lib == "conveyor":
                        self.conveyor(
                            lambda size=size, label=label, pad=pad: self.lib(  # type: ignore[misc]
                                "conveyor", "batch", size, label, payload_bytes=pad
                            )
                        )
                    else:
                        self.lib(lib, "batch", size, label, payload_bytes=pad)

    def single(self) -> None:
        a = self.args
        for lib in self.libs():
            if lib == "conveyor":
                self.conveyor(lambda: self.lib("conveyor", "single", a.n_single, "single"))
            elif lib in POSTGRES_PEERS:
                self.lib(lib, "single", a.n_single, "single")

    def peers(self) -> None:
        """The drain with the I/O-bound body for the peers (drain ≥ 2× best peer stays met)."""
        a = self.args
        os.environ["BENCH_BODY"] = "redis"
        try:
            for lib in self.libs():
                if lib != "conveyor":
                    self.lib(lib, "drain", a.n_peer_drain, "drain_async_io", timeout=a.peer_timeout)
        finally:
            os.environ.pop("BENCH_BODY", None)

    def kept(self) -> None:
        """The targets met before issue 13, in the same run (the first round only: the big tables take
        minutes to generate and the RSS drain ~10): the SQLite drain, the drain on big tables against
        empty ones (alternated, as bench.run's scale), the worker's RSS over a long drain. No-op body,
        as in the suite that set these targets."""
        if self.round:
            return
        a, r = self.args, self.r
        self.conveyor(lambda: self.lib("conveyor", "drain", a.n_drain, "sqlite_drain", options={"sqlite": True}))
        big = r.fresh_db()
        print(f"  generating {a.n_scheduled:,} scheduled + {a.n_archived:,} archived rows ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "bench.fill", "--db", r.url(big), "--scheduled", str(a.n_scheduled),
             "--archived", str(a.n_archived)],
            cwd=ROOT, check=True, timeout=3600,
        )  # fmt: skip
        for _ in range(3):
            self.conveyor(lambda: self.lib("conveyor", "drain", a.n_big_drain, "drain_empty"))
            # The big database is reused: give it the vacuum autovacuum may not have got to yet.
            vacuum(r.url(big))
            self.conveyor(lambda: self.lib("conveyor", "drain", a.n_big_drain, "drain_big_tables", db_name=big))
        r.drop_db(big)

        def rss() -> dict[str, Any] | None:
            name = r.fresh_db()
            try:
                fill_ready(r, name, a.n_rss)
                return self.lib("conveyor", "rss", a.n_rss, "rss", db_name=name, rss_at=f"{a.n_rss // 10},{a.n_rss}",
                                prefilled=1, timeout=3600)  # fmt: skip
            finally:
                r.drop_db(name)

        self.conveyor(rss)

    def libs(self) -> list[str]:
        return [lib.strip() for lib in self.args.libs.split(",") if lib.strip()]


# -- the report ---------------------------------------------------------------------------------


def medians(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Median of each figure's numbers, by (figure, lib, variant)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        if r.get("figure") == "meta" or not r.get("ok"):
            continue
        if "worker_switches_per_job" in r:  # the drains' workers; the floors count their own process
            r = {**r, "switches_per_job": r["worker_switches_per_job"]}
        if "cpu_us_per_job" in r:
            r = {**r, "worker_cpu_us_per_job": r["cpu_us_per_job"]}
        groups.setdefault((r["figure"], r["lib"], r.get("variant", "")), []).append(r)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, rs in groups.items():
        out[key] = {
            k: statistics.median(float(r[k]) for r in rs)
            for k in ("rate", "p50_ms", "p99_ms", "worker_cpu_us_per_job", "rss_growth", "switches_per_job")
            if all(r.get(k) is not None for r in rs)
        }
        out[key]["count"] = len(rs)
    return out


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    m = medians(results)
    variants = sorted({k[2] for k in m if k[1] == "conveyor"})
    lines = [
        f"Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(meta['started']))}: `{meta['command']}`",
        "",
        f"PostgreSQL: {meta['cluster']}; durable single-row commit ≈ {meta['machine']['postgres_commit_ms']} ms; "
        f"load average at start {meta['machine']['loadavg_start']:.2f}, at end {meta.get('loadavg_end', 0) or 0:.2f}; "
        f"tree: {meta['git']}",
        "",
        "| figure | lib | variant | runs | jobs/s | p50 ms | p99 ms | CPU µs/job | context switches/job |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (figure, lib, variant), nums in sorted(m.items()):
        rate = f"{nums['rate']:,.0f}" if "rate" in nums else ""
        p50 = f"{nums['p50_ms']:.2f}" if "p50_ms" in nums else ""
        p99 = f"{nums['p99_ms']:.2f}" if "p99_ms" in nums else ""
        cpu = f"{nums['worker_cpu_us_per_job']:.0f}" if "worker_cpu_us_per_job" in nums else ""
        switches = f"{nums['switches_per_job']:.1f}" if "switches_per_job" in nums else ""
        cells = [figure, lib, variant, f"{nums['count']:.0f}", rate, p50, p99, cpu, switches]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| target | variant | measured | ratio | met |", "| --- | --- | --- | ---: | --- |"]

    def get(figure: str, lib: str, key: str, variant: str = "") -> float | None:
        return m.get((figure, lib, variant), {}).get(key)

    def target(
        name: str, variant: str, a: float | None, b: float | None, what: str, ok: Callable[[float], bool]
    ) -> None:
        if a is None or b is None or b == 0:
            lines.append(f"| {name} | {variant} | — | — | — |")
            return
        ratio = a / b
        lines.append(f"| {name} | {variant} | {what.format(a=a, b=b)} | {ratio:.2f} | {'yes' if ok(ratio) else 'no'} |")

    for v in variants:
        target("async drain ≥ 0.80 × asyncio body floor", v, get("drain_async_io", "conveyor", "rate", v),
               get("floor_body_async", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.8)  # fmt: skip
        target("def drain ≥ 0.70 × thread body floor", v, get("drain_def_io", "conveyor", "rate", v),
               get("floor_body_threads", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.7)  # fmt: skip
        # `conveyor worker --pin` (one CPU), against the floor as the issue defines it and against
        # the same floor run on one CPU too.
        target("def drain, --pin ≥ 0.70 × thread body floor", v, get("drain_def_io_pinned", "conveyor", "rate", v),
               get("floor_body_threads", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.7)  # fmt: skip
        target("(def drain, --pin vs the thread body floor pinned)", v,
               get("drain_def_io_pinned", "conveyor", "rate", v), get("floor_body_threads_pinned", "floor", "rate"),
               "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.7)  # fmt: skip
        target("(def drain, --pin vs the minimal threaded queue pinned)", v,
               get("drain_def_io_pinned", "conveyor", "rate", v), get("floor_queue_threads_pinned", "floor", "rate"),
               "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.7)  # fmt: skip
        # The floors before session 23 ran the INCR without the stamp every handler writes first.
        target("(async drain vs the bare INCR floor)", v, get("drain_async_io", "conveyor", "rate", v),
               get("floor_body_async_bare", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.8)  # fmt: skip
        target("(def drain vs the bare INCR floor)", v, get("drain_def_io", "conveyor", "rate", v),
               get("floor_body_threads_bare", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.7)  # fmt: skip
        # A minimal worker on the same statements (bench.floors queue_*): how far the shape itself gets.
        target("(minimal async queue vs the body floor)", v, get("floor_queue_async", "floor", "rate"),
               get("floor_body_async", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.8)  # fmt: skip
        target("(minimal queue, database work in a second process, vs the body floor)", v,
               get("floor_queue_split", "floor", "rate"), get("floor_body_async", "floor", "rate"),
               "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.8)  # fmt: skip
        target("(async drain vs the minimal async queue)", v, get("drain_async_io", "conveyor", "rate", v),
               get("floor_queue_async", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.8)  # fmt: skip
        target("(minimal threaded queue vs the body floor)", v, get("floor_queue_threads", "floor", "rate"),
               get("floor_body_threads", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.7)  # fmt: skip
        target("(def drain vs the minimal threaded queue)", v, get("drain_def_io", "conveyor", "rate", v),
               get("floor_queue_threads", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.7)  # fmt: skip
        target("pickup p50 ≤ 1.25 × floor", v, get("pickup", "conveyor", "p50_ms", v),
               get("floor_pickup", "floor", "p50_ms"), "{a:.2f} vs {b:.2f} ms", lambda r: r <= 1.25)  # fmt: skip
        target("pickup p99 ≤ 1.5 × floor", v, get("pickup", "conveyor", "p99_ms", v),
               get("floor_pickup", "floor", "p99_ms"), "{a:.2f} vs {b:.2f} ms", lambda r: r <= 1.5)  # fmt: skip
        target("no-op drain, 2 processes ≥ 0.5 × pgbench", v, get("drain_noop_2proc", "conveyor", "rate", v),
               get("floor_pgbench", "floor", "rate"), "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.5)  # fmt: skip
        pg_single = [(lib, get("single", lib, "rate")) for lib in POSTGRES_PEERS]
        best = max(((lib, x) for lib, x in pg_single if x), key=lambda t: t[1], default=(None, None))
        target(f"single enqueue ≥ best PostgreSQL peer ({best[0]})", v, get("single", "conveyor", "rate", v),
               best[1], "{a:,.0f} vs {b:,.0f}", lambda r: r >= 1.0)  # fmt: skip
        for figure in sorted({k[0] for k in m if k[0].startswith("batch_")}, key=lambda f: (int(f.split("_")[1]), f)):
            peers = [(k[1], x["rate"]) for k, x in m.items() if k[0] == figure and k[1] != "conveyor" and "rate" in x]
            best = max(peers, key=lambda t: t[1], default=(None, None))
            target(f"{figure} ≥ 2 × best peer ({best[0]})", v, get(figure, "conveyor", "rate", v), best[1],
                   "{a:,.0f} vs {b:,.0f}", lambda r: r >= 2.0)  # fmt: skip
        peers = [(k[1], x["rate"]) for k, x in m.items() if k[0] == "drain_async_io" and k[1] not in ("conveyor",)]
        best = max(peers, key=lambda t: t[1], default=(None, None))
        target(f"drain (Redis body) ≥ 2 × best peer ({best[0]})", v, get("drain_async_io", "conveyor", "rate", v),
               best[1], "{a:,.0f} vs {b:,.0f}", lambda r: r >= 2.0)  # fmt: skip
        # Met before issue 13 (section kept): still met in this run.
        target("SQLite drain ≥ 2,500 jobs/s", v, get("sqlite_drain", "conveyor", "rate", v), 2500.0,
               "{a:,.0f} jobs/s", lambda r: r >= 1.0)  # fmt: skip
        target("drain on big tables (--n-scheduled, --n-archived) ≥ 0.90 × empty", v,
               get("drain_big_tables", "conveyor", "rate", v), get("drain_empty", "conveyor", "rate", v),
               "{a:,.0f} vs {b:,.0f}", lambda r: r >= 0.9)  # fmt: skip
        growth = get("rss", "conveyor", "rss_growth", v)
        target("worker RSS flat (± 10 %) over the long drain", v, None if growth is None else 1 + growth, 1.0,
               "{a:.3f} × the RSS at a tenth of it", lambda r: abs(r - 1) <= 0.1)  # fmt: skip
    lines += own_time(get, variants)
    return "\n".join(lines) + "\n"


def own_time(get: Callable[..., float | None], variants: list[str]) -> list[str]:
    """The drain targets as time per job: what the queue adds to the body's own wall time (1/drain -
    1/floor), against what the target leaves it (a drain at ``ratio`` of the floor adds (1/ratio - 1) of
    the body's time). Unlike the ratio this moves little when the body gets faster or slower. ``get`` is
    the report's lookup of a figure's median: (figure, lib, key, variant)."""
    rows = []
    for path, ratio, floor, queue, drain in DRAIN_TARGETS:
        body = get(floor, "floor", "rate")
        if not body:
            continue
        minimal = get(queue, "floor", "rate")
        for v in variants:
            rate = get(drain, "conveyor", "rate", v)
            if not rate:
                continue
            cells = [
                path,
                v,
                f"{1e6 / body:.0f}",
                f"{1e6 / rate - 1e6 / body:.0f}",
                f"{1e6 / minimal - 1e6 / body:.0f}" if minimal else "—",
                f"{(1 / ratio - 1) * 1e6 / body:.0f}",
            ]
            rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "",
        "| drain | variant | body µs/job | Conveyor adds µs/job | the minimal queue adds | the target allows |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--libs", default="conveyor,pgqueuer,procrastinate,rq,dramatiq,celery")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--variants", default="=", help="'A=;B=ENV=1,ENV2=x': Conveyor figures once per variant")
    parser.add_argument("--n-drain", type=int, default=20_000)
    parser.add_argument("--n-peer-drain", type=int, default=5_000)
    parser.add_argument("--peer-timeout", type=float, default=120.0)
    parser.add_argument("--n-pickup", type=int, default=200)
    parser.add_argument("--n-pgbench", type=int, default=200_000)
    parser.add_argument("--n-noop-drain", type=int, default=50_000)
    parser.add_argument("--n-single", type=int, default=2_000)
    parser.add_argument("--n-rss", type=int, default=1_000_000, help="kept: RSS drain, sampled at a tenth and the end")
    # 20,000 jobs drained in 1.2-1.5 s (session 26): too short to tell a cold cache from the tables' cost.
    parser.add_argument("--n-big-drain", type=int, default=100_000, help="kept: jobs of each big-table/empty drain")
    parser.add_argument("--n-scheduled", type=int, default=1_000_000, help="kept: scheduled jobs of the big tables")
    parser.add_argument("--n-archived", type=int, default=10_000_000, help="kept: archived rows of the big tables")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 20_000, 100_000])
    parser.add_argument("--payload-bytes", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1024])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="only (re)write the .md of this results file")
    args = parser.parse_args()
    if args.report is not None:
        results = [json.loads(line) for line in args.report.read_text().splitlines()]
        text = report(results, results[0])
        args.report.with_suffix(".md").write_text(text)
        print(text)
        return
    try:
        import redis  # noqa: F401  (the job body of the drain, pickup and floor figures)
    except ImportError:
        sys.exit("redis-py is missing from this interpreter: .venv/bin/python -m pip install -e '.[bench]'")
    if any(lib != "conveyor" for lib in args.libs.split(",")):
        ensure_peers(offline=False)  # bench/.venv-peers, created once (as `python -m bench` does)

    cluster = Cluster()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    RESULTS.mkdir(exist_ok=True)
    out = args.out or RESULTS / f"independent-{stamp}.jsonl"
    work = Path(tempfile.mkdtemp(prefix="conveyor-independent-"))
    try:
        args.pg = cluster.admin
        runner = Runner(args, Sizes(timeout=300.0), out, work)
        meta: dict[str, Any] = {
            "figure": "meta",
            "command": "python -m bench.independent " + " ".join(sys.argv[1:]),
            "started": time.time(),
            "machine": machine(cluster.admin),
            "cluster": cluster.settings(),
            "git": git_state(),
        }
        out.write_text(json.dumps(meta, sort_keys=True) + "\n")
        harness = Harness(args, runner)
        sections = [s for s in args.sections.split(",") if s]
        for i in range(args.repeats):
            print(f"== round {i + 1} of {args.repeats}, load {os.getloadavg()[0]:.2f}", flush=True)
            harness.round = i
            for section in sections:
                getattr(harness, section)()
        meta["loadavg_end"] = os.getloadavg()[0]
        results = [json.loads(line) for line in out.read_text().splitlines()]
        text = report(results, meta)
        out.with_suffix(".md").write_text(text)
        print(text)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
