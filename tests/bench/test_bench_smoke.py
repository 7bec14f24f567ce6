"""The benchmark suite's smoke form runs in CI so that it never rots (bench/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "batch",
    "single",
    "drain",
    "latency",
    "sqlite_drain",
    "mysql_drain",
    "mysql_batch",
    "drain_next_to_raw",
    "raw_sql_b10",
    "drain_big_tables",
    "rss",
}


@pytest.mark.timeout(180)
def test_bench_smoke_writes_every_figure(tmp_path: Path, postgres_server_url: str) -> None:
    out = tmp_path / "smoke.jsonl"
    env = dict(os.environ, BENCH_WORK_DIR=str(tmp_path / "work"))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--pg", postgres_server_url, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    meta = [r for r in rows if r["figure"] == "meta"]
    assert len(meta) == 1 and meta[0]["machine"]["nproc"] >= 1
    figures = {r["figure"]: r for r in rows if r["figure"] != "meta"}
    assert set(figures) == EXPECTED, sorted(figures)
    failed = {name: r.get("error") for name, r in figures.items() if not r.get("ok")}
    assert not failed, failed
    for name in (
        "batch",
        "single",
        "drain",
        "sqlite_drain",
        "mysql_drain",
        "mysql_batch",
        "raw_sql_b10",
        "drain_big_tables",
        "rss",
    ):
        assert figures[name]["rate"] > 0, name
    assert figures["drain"]["done"] == figures["drain"]["n"]
    assert 0 < figures["latency"]["p50_ms"] <= figures["latency"]["p99_ms"]
    assert [count for count, _ in figures["rss"]["rss_kib"]] == [500, 2000]
    table = out.with_suffix(".md").read_text()
    assert "| (3) drain of 300, jobs/s" in table and "| target | measured | met |" in table
    # The smoke form is meant to take seconds (issue 4: under a minute).
    assert elapsed < 60, f"bench smoke took {elapsed:.0f}s"


@pytest.mark.timeout(120)
def test_the_pgbench_floor_runs_conveyors_own_acquire_and_finish(postgres_database: str) -> None:
    # The floor's script is built from queries.sql: when the finish statement gained the queue
    # counters (`pg_backend_pid() %% 8`, psycopg's escaped percent), pgbench failed on it and the
    # independent harness lost its limit figure without a test noticing.
    proc = subprocess.run(
        [sys.executable, "-m", "bench.floors", "pgbench", "--db", postgres_database, "--n", "2000",
         "--batch", "100", "--clients", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH-RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(lines[-1].removeprefix("BENCH-RESULT "))
    assert result["ok"], result["error"]
    assert (result["left_in_jobs"], result["archived"], result["failed"]) == (0, 2000, 0)
    assert result["rate"] > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["queue_async", "queue_split", "queue_threads"])
def test_the_queue_floors_run_every_job_through_conveyors_statements(postgres_database: str, kind: str) -> None:
    # The body is the no-op here (the harness runs the Redis one): what is checked is the plumbing,
    # each job acquired once, handed to a slot and finished by jobs_finish_many.
    proc = subprocess.run(
        [sys.executable, "-m", "bench.floors", kind, "--db", postgres_database, "--n", "1500", "--batch", "100"],
        cwd=ROOT, capture_output=True, text=True, timeout=110, env={**os.environ, "BENCH_BODY": "noop"},
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH-RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(lines[-1].removeprefix("BENCH-RESULT "))
    assert (result["ok"], result["done"]) == (True, 1500)
    assert result["switches_per_job"] > 0  # its threads or its loop wait for the database
    with psycopg.connect(postgres_database) as conn:
        counts = conn.execute("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM archive)").fetchone()
    assert counts == (0, 1500)


def test_the_independent_report_checks_the_targets_met_before_issue_13(tmp_path: Path) -> None:
    # Section kept of bench.independent: the SQLite drain, big tables against empty ones, the RSS drain.
    results: list[dict[str, object]] = [
        {"figure": "sqlite_drain", "lib": "conveyor", "ok": True, "rate": 3000.0},
        *({"figure": "drain_empty", "lib": "conveyor", "ok": True, "rate": r} for r in (9000.0, 10000.0, 11000.0)),
        *({"figure": "drain_big_tables", "lib": "conveyor", "ok": True, "rate": r} for r in (8000.0, 8500.0, 9900.0)),
        {"figure": "rss", "lib": "conveyor", "ok": True, "rate": 5000.0, "rss_growth": 0.02},
        {"figure": "drain_def_io", "lib": "conveyor", "ok": True, "rate": 4000.0, "worker_switches_per_job": 21.5},
    ]
    text = _report(tmp_path, results)
    assert "| SQLite drain ≥ 2,500 jobs/s |  | 3,000 jobs/s | 1.20 | yes |" in text
    # The medians: 8,500 against 10,000 is 0.85, more than 10 % slower.
    assert "≥ 0.90 × empty |  | 8,500 vs 10,000 | 0.85 | no |" in text
    assert "| worker RSS flat (± 10 %) over the long drain |  | 1.020 × the RSS at a tenth of it | 1.02 | yes |" in text
    assert "| drain_def_io | conveyor |  | 1 | 4,000 |  |  |  | 21.5 |" in text


def test_the_independent_report_gives_the_drain_targets_as_time_per_job(tmp_path: Path) -> None:
    results: list[dict[str, object]] = [
        {"figure": "floor_body_async", "lib": "floor", "ok": True, "rate": 10_000.0},  # 100 µs a body
        {"figure": "floor_queue_async", "lib": "floor", "ok": True, "rate": 8_000.0},  # adds 25 µs
        {"figure": "drain_async_io", "lib": "conveyor", "ok": True, "rate": 5_000.0},  # adds 100 µs
        {"figure": "floor_body_threads", "lib": "floor", "ok": True, "rate": 5_000.0},  # 200 µs a body
        {"figure": "drain_def_io", "lib": "conveyor", "ok": True, "rate": 4_000.0},  # adds 50 µs
    ]
    text = _report(tmp_path, results)
    # 0.80 of the floor leaves a quarter of the body's time; 0.70 leaves 3/7 of it (no minimal queue: a dash).
    assert "| async def |  | 100 | 100 | 25 | 25 |" in text
    assert "| def |  | 200 | 50 | — | 86 |" in text


def _report(tmp_path: Path, figures: list[dict[str, object]]) -> str:
    """The markdown ``bench.independent --report`` renders from these figures (after a meta line)."""
    meta = {"figure": "meta", "started": 0.0, "command": "python -m bench.independent", "cluster": {}, "git": {},
            "machine": {"postgres_commit_ms": 0.3, "loadavg_start": 0.1}}  # fmt: skip
    out = tmp_path / "independent.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in [meta, *figures]))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.independent", "--report", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out.with_suffix(".md").read_text()


def test_the_compiled_copy_refuses_a_directory_it_did_not_build(tmp_path: Path) -> None:
    # bench.compiled replaces DIR/src: only one it built itself, never a foreign src/ (the repository's own, say:
    # the copy below stands in for it, so that a regression deletes nothing of the checkout), a file or "".
    foreign = tmp_path / "foreign"
    (foreign / "src").mkdir(parents=True)
    (foreign / "src" / "keep.txt").write_text("mine")
    for target, says in [
        (str(foreign), "did not build"),
        (str(ROOT / "pyproject.toml"), "not a directory"),
        ("", "usage"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.compiled", target], cwd=ROOT, capture_output=True, text=True
        )
        assert proc.returncode != 0 and says in proc.stderr, (target, proc.stderr[-2000:])
    assert (foreign / "src" / "keep.txt").read_text() == "mine"
