"""The chaos suite, long form: ``python -m bench.chaos --jobs 100000`` (docs/reliability.md).

The same harness as the CI form (``tests/chaos``): a throwaway PostgreSQL cluster behind a TCP
proxy, two plain workers and one prefork tree (2 x 4 slots each), the job mix with its hostile
handlers, the checker over the whole history. What it adds: many more jobs, sent at a steady rate
over ``--seconds`` (so that throughput, depth and latency can be compared window by window), a
vacuum blocker (a transaction held open ``--blocker-seconds``) alone in its own phase, then every
other fault, spread over the rest of the run:

    0 ........ baseline ........ blocker (60 s) ...... after ...... faults ...... end of sends, drain

It prints the checker's summary, the 5 s windows (jobs finished per second, enqueue-to-finish
latency, depth, dead rows in the jobs table, the faults active in each window) and, per restart,
the time to recover; and writes them to ``bench/chaos/results/<stamp>.{json,md}``. It takes the
benchmark lock (``/tmp/conveyor-bench.lock``) for the whole run. Exit status 1 if the checker found
a problem.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import shlex
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from tests.chaos import mix_app as mix
from tests.chaos._checker import Report
from tests.chaos._faults import Fault
from tests.chaos._scenario import Scenario, run

from ._lock import bench_lock

RESULTS = Path(__file__).resolve().parent / "results"

#: Share of each task in the mix (the rest is ``fast``); crash and hang jobs are counted, not shared.
SHARES = {
    mix.LONG: 0.001,
    mix.FLAKY: 0.01,
    mix.DOOMED: 0.003,
    mix.PERMANENT: 0.005,
    mix.NUL_RESULT: 0.002,
    mix.NUL_ERROR: 0.001,
    mix.NUL_FLAKY: 0.001,
    mix.SYSTEM_EXIT: 0.001,
    mix.KEYBOARD: 0.001,
}
#: Faults after the blocker phase, in this order, evenly spread.
FAULTS = [
    "pg_restart", "kill_worker", "proxy_cut", "stop_worker", "kill_child", "pg_restart", "kill_tree",
    "proxy_cut", "kill_worker", "pg_restart", "stop_worker", "kill_child", "proxy_cut", "kill_tree",
    "pg_restart", "kill_worker", "proxy_cut",
]  # fmt: skip


def composition(jobs: int, hostile: bool, crash: int, hang: int) -> dict[str, int]:
    shares = {t: s for t, s in SHARES.items() if hostile or t not in mix.HOSTILE}
    out = {t: max(1, round(jobs * s)) for t, s in shares.items()}
    if hostile:
        out[mix.CRASH] = crash
        out[mix.HANG] = hang
    out[mix.FAST] = jobs - sum(out.values())
    return out


def split(total: dict[str, int], fraction: float) -> tuple[dict[str, int], dict[str, int]]:
    """``total`` as (sent before the workers start, sent at a steady rate during the run)."""
    first = {t: round(n * fraction) for t, n in total.items()}
    return first, {t: n - first[t] for t, n in total.items()}


def schedule(seconds: float, blocker_seconds: float, with_blocker: bool) -> list[Fault]:
    """Baseline, the blocker alone, a pause to recover, then every other fault to the end."""
    baseline = max(15.0, 0.125 * seconds)
    faults: list[Fault] = []
    start = baseline
    if with_blocker:
        faults.append(Fault(baseline, "vacuum_blocker"))
        start = baseline + blocker_seconds + max(15.0, 0.125 * seconds)
    end = seconds - 5
    step = (end - start) / len(FAULTS)
    if step < 3:
        raise SystemExit(f"--seconds {seconds:g} leaves {step:.1f}s between faults; give at least 3")
    faults.extend(Fault(round(start + i * step, 1), kind) for i, kind in enumerate(FAULTS))
    return faults


#: Conveyor's statements the sampler times, by a fragment of their text (queries.sql).
STATEMENTS = {"acquire": "%picked AS MATERIALIZED%", "finish": "%INSERT INTO archive%"}
Sample = dict[str, Any]


class Sampler:
    """Every second, on a direct connection (not through the proxy): live jobs in the table (depth),
    its dead row versions (what vacuum could not remove yet), and the calls, rows and execution
    time of Conveyor's acquire and finish statements so far (pg_stat_statements)."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, url: str, t0: float) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self._thread = threading.Thread(target=self._run, args=(url, t0), name="chaos-sampler", daemon=True)
        self._thread.start()

    def _sample(self, conn: psycopg.Connection[tuple[Any, ...]], t: float) -> Sample:
        depth = conn.execute("SELECT count(*) FROM jobs").fetchone()
        dead = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
        out: Sample = {"t": t, "depth": depth[0] if depth else None, "dead": dead[0] if dead else None}
        for name, pattern in STATEMENTS.items():
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0), coalesce(sum(rows), 0), coalesce(sum(total_exec_time), 0) "
                "FROM pg_stat_statements WHERE query LIKE %s AND dbid = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (pattern,),
            ).fetchone()
            out[name] = (int(row[0]), int(row[1]), float(row[2])) if row else None
        return out

    def _run(self, url: str, t0: float) -> None:
        conn: psycopg.Connection[tuple[Any, ...]] | None = None
        while not self._stop.wait(1.0):
            t = time.time() - t0
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(url, autocommit=True, connect_timeout=2)
                self.samples.append(self._sample(conn, t))
            except psycopg.Error:
                self.samples.append({"t": t, "depth": None, "dead": None})
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def finish(self, url: str, t0: float) -> dict[str, Any]:
        """Per 5 s window, from the archive: enqueue-to-finish latency p50 and p99 (s)."""
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                """
                SELECT floor((extract(epoch FROM finished_at) - %(t0)s) / 5)::int AS w,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - enqueued_at)),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - enqueued_at))
                FROM archive WHERE task = %(fast)s GROUP BY w ORDER BY w
                """,
                {"t0": t0, "fast": mix.FAST},
            ).fetchall()
        return {
            "latency": {int(w): (float(p50), float(p99)) for w, p50, p99 in rows},
            "samples": self.samples,
        }


def statement_cost(samples: list[Sample], name: str, t0: float, t1: float) -> tuple[float | None, float | None]:
    """Mean execution time (ms) and rows per call of statement ``name`` between two times, from the
    counters sampled around them (a restart resets the counters: that interval is left out)."""
    inside = [s for s in samples if t0 <= s["t"] <= t1 and s.get(name) is not None]
    calls = rows = 0
    total = 0.0
    for a, b in itertools.pairwise(inside):
        dc, dr, dt = (b[name][i] - a[name][i] for i in range(3))
        if dc < 0:
            continue
        calls, rows, total = calls + dc, rows + dr, total + dt
    if not calls:
        return None, None
    return total / calls, rows / calls


def windows(report: Report) -> list[dict[str, Any]]:
    """The 5 s windows: finish rate, fast-job latency, depth and dead rows, faults active."""
    latency: dict[int, tuple[float, float]] = report.extra.get("latency", {})
    samples: list[Sample] = report.extra.get("samples", [])
    out = []
    for start, rate in report.throughput:
        i = int(start // report.window)
        inside = [s for s in samples if start <= s["t"] < start + report.window]
        depths = [s["depth"] for s in inside if s["depth"] is not None]
        deads = [s["dead"] for s in inside if s["dead"] is not None]
        acquire_ms, acquire_rows = statement_cost(samples, "acquire", start - 1, start + report.window)
        finish_ms, _ = statement_cost(samples, "finish", start - 1, start + report.window)
        t0, t1 = report.t_start + start, report.t_start + start + report.window
        active = sorted({f["fault"] for f in report.faults if f["t"] < t1 and max(f["t_end"], f["t"]) >= t0})
        p50, p99 = latency.get(i, (None, None))
        out.append({
            "window": f"{start:.0f}-{start + report.window:.0f}",
            "jobs_per_s": round(rate),
            "latency_p50_s": None if p50 is None else round(p50, 3),
            "latency_p99_s": None if p99 is None else round(p99, 2),
            "depth_max": max(depths) if depths else None,
            "dead_rows_max": max(deads) if deads else None,
            "acquire_ms": None if acquire_ms is None else round(acquire_ms, 2),
            "acquire_rows": None if acquire_rows is None else round(acquire_rows, 1),
            "finish_ms": None if finish_ms is None else round(finish_ms, 2),
            "faults": active,
        })  # fmt: skip
    return out


def phases(report: Report, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean finish rate and median p99 latency before, during and after the blocker and the faults."""
    blocker = next((f for f in report.faults if f["fault"] == "vacuum_blocker"), None)
    others = [f for f in report.faults if f["fault"] != "vacuum_blocker"]
    cuts: list[tuple[str, float, float]] = []
    first = min((f["t"] for f in report.faults), default=report.t_end) - report.t_start
    cuts.append(("baseline (no fault)", 0.0, first))
    if blocker is not None:
        b0, b1 = blocker["t"] - report.t_start, blocker["t_end"] - report.t_start
        f0 = min((f["t"] for f in others), default=report.t_end) - report.t_start
        cuts += [("vacuum blocker held", b0, b1), ("after the blocker", b1, f0)]
    if others:
        f0 = min(f["t"] for f in others) - report.t_start
        f1 = max(f["t_end"] for f in others) - report.t_start
        cuts.append(("faults phase", f0, f1))
    out = []
    for name, a, b in cuts:
        inside = [r for r in rows if a <= float(r["window"].split("-")[0]) and float(r["window"].split("-")[1]) <= b]
        if not inside:
            continue
        rates = [r["jobs_per_s"] for r in inside]
        p99s = sorted(r["latency_p99_s"] for r in inside if r["latency_p99_s"] is not None)
        deads = [r["dead_rows_max"] for r in inside if r["dead_rows_max"] is not None]
        drains = sorted(
            x["jobs_per_s"] for x in report.extra.get("bursts", []) if a <= x["at"] < b and x["jobs_per_s"] is not None
        )
        acquire_ms, acquire_rows = statement_cost(report.extra.get("samples", []), "acquire", a, b)
        out.append({
            "phase": name, "from_s": round(a), "to_s": round(b), "windows": len(inside),
            "acquire_ms": None if acquire_ms is None else round(acquire_ms, 2),
            "acquire_rows": None if acquire_rows is None else round(acquire_rows, 1),
            "jobs_per_s_mean": round(sum(rates) / len(rates)), "jobs_per_s_min": min(rates),
            "latency_p99_s_median": p99s[len(p99s) // 2] if p99s else None,
            "dead_rows_max": max(deads) if deads else None,
            "burst_drain_jobs_per_s": drains,
        })  # fmt: skip
    return out


def markdown(report: Report, meta: dict[str, Any], rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> str:
    lines = [f"# Chaos run {meta['stamp']}", "", f"`{meta['command']}` ({meta['commit']})", "", "```"]
    lines += [report.format(), "```", "", "## Phases", ""]
    lines += ["| phase | s | jobs/s mean | jobs/s min | p99 latency s (median of windows) | dead rows max | "
              "acquire ms/call (rows/call) | bursts drained at (jobs/s) |"]  # fmt: skip
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in summary:
        lines.append(
            f"| {p['phase']} | {p['from_s']}-{p['to_s']} | {p['jobs_per_s_mean']} | {p['jobs_per_s_min']} | "
            f"{p['latency_p99_s_median']} | {p['dead_rows_max']} | {p['acquire_ms']} ({p['acquire_rows']}) | "
            f"{', '.join(f'{x:,}' for x in p['burst_drain_jobs_per_s'])} |"
        )
    lines += [
        "",
        "## Bursts",
        "",
        "| at s | jobs | drained in s | jobs/s | faults active |",
        "| --- | --- | --- | --- | --- |",
    ]
    for x in report.extra.get("bursts", []):
        t0 = report.t_start + x["at"]
        t1 = t0 + (x["drain_s"] or 0)
        active = sorted({f["fault"] for f in report.faults if f["t"] <= t1 and max(f["t_end"], f["t"]) >= t0})
        lines.append(f"| {x['at']} | {x['jobs']:,} | {x['drain_s']} | {x['jobs_per_s']} | {', '.join(active)} |")
    lines += ["", "## Restarts", "", "| at s | restart took s | first finish after s | rate back to half s |"]
    lines += ["| --- | --- | --- | --- |"]
    for r in report.recoveries:
        lines.append(f"| {r['at']} | {r['restart_s']} | {r['first_finish_s']} | {r['half_rate_back_s']} |")
    lines += ["", "## 5 s windows", ""]
    lines += ["| window s | jobs/s | p50 s | p99 s | depth | dead rows | acquire ms (rows) | finish ms | faults |"]
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['window']} | {r['jobs_per_s']} | {r['latency_p50_s']} | {r['latency_p99_s']} | "
            f"{r['depth_max']} | {r['dead_rows_max']} | {r['acquire_ms']} ({r['acquire_rows']}) | "
            f"{r['finish_ms']} | {', '.join(r['faults'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in all (default 100,000)")
    parser.add_argument("--seconds", type=float, default=240.0, help="how long the sends are spread over")
    parser.add_argument("--blocker-seconds", type=float, default=60.0, help="how long the transaction is held")
    parser.add_argument("--no-blocker", action="store_true", help="no vacuum blocker phase")
    parser.add_argument("--no-hostile", action="store_true", help="only well-behaved jobs")
    parser.add_argument("--crash", type=int, default=10, help="jobs that os._exit their worker (each twice)")
    parser.add_argument("--hang", type=int, default=10, help="jobs whose first attempt hangs past its timeout")
    parser.add_argument("--upfront", type=float, default=0.05, help="share of the jobs sent before the workers start")
    parser.add_argument("--burst-every", type=float, default=15.0, help="seconds between bursts (0: none)")
    parser.add_argument("--burst-share", type=float, default=0.6, help="share of the jobs sent in bursts")
    parser.add_argument("--visibility-timeout", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="run log and worker logs (default: a temp dir, removed if all went well)",
    )
    parser.add_argument("--no-save", action="store_true", help="do not write bench/chaos/results")
    args = parser.parse_args(argv)
    # The producer's pool reports every failed reconnection while the server restarts: expected here.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

    total = composition(args.jobs, not args.no_hostile, args.crash, args.hang)
    count = int(args.seconds // args.burst_every) if args.burst_every > 0 else 0
    size = round(args.jobs * args.burst_share / count) if count else 0
    bursts = [(args.burst_every * (k + 0.5), size) for k in range(count)]
    rest = {**total, mix.FAST: total[mix.FAST] - size * count}
    if rest[mix.FAST] < 0:
        raise SystemExit("--burst-share leaves no room for the other jobs")
    upfront, paced = split(rest, args.upfront / max(1e-9, 1 - args.burst_share))
    scenario = Scenario(
        name="long",
        upfront=upfront,
        paced=paced,
        bursts=bursts,
        produce_seconds=args.seconds,
        faults=schedule(args.seconds, args.blocker_seconds, not args.no_blocker),
        mix=mix.MixConfig(visibility_timeout=args.visibility_timeout, long_seconds=2 * args.visibility_timeout),
        blocker_seconds=args.blocker_seconds,
        drain_timeout=300,
        seed=args.seed,
    )
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"conveyor-chaos-{stamp}-"))
    t = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - t:7.1f}s] {message}", flush=True)

    log(f"{args.jobs:,} jobs: {sum(upfront.values()):,} up front, {sum(paced.values()):,} at "
        f"{sum(paced.values()) / args.seconds:.0f}/s, {count} bursts of {size:,}; {len(scenario.faults)} faults; "
        f"files in {workdir}")  # fmt: skip
    with bench_lock():
        report = run(scenario, workdir, log=log, probe=Sampler())
    rows = windows(report)
    summary = phases(report, rows)
    meta = {
        "stamp": stamp,
        "command": "python -m bench.chaos " + shlex.join(sys.argv[1:] if argv is None else argv),
        "commit": _commit(),
        "jobs": args.jobs,
        "composition": total,
        "schedule": [[f.at, f.kind] for f in scenario.faults],
    }
    print(report.format())
    print()
    print(markdown(report, meta, rows, summary).split("## Phases", 1)[1])
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        data = {**meta, "report": report.to_json(), "windows": rows, "phases": summary}
        data["report"].pop("samples", None)
        data["report"].pop("latency", None)
        (RESULTS / f"{stamp}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        (RESULTS / f"{stamp}.md").write_text(markdown(report, meta, rows, summary))
        log(f"results in {RESULTS}/{stamp}.md")
    if report.problems():
        log(f"run log, events and worker logs kept in {workdir}")
        return 1
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)  # tens of MB of run log: kept only when something failed
    return 0


def _commit() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=False).stdout
    return (done.stdout.strip() or "unknown") + (" + uncommitted changes" if dirty.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
