"""Turns a results file (JSON lines) into the markdown table, and checks the targets of issue 4."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench._common import ROOT

LIBS = ["conveyor", "pgqueuer", "procrastinate", "celery", "dramatiq", "rq"]
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench:results:begin -->"
END = "<!-- bench:results:end -->"


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    meta: dict[str, Any] = {}
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("figure") == "meta":
            meta = row
        else:
            rows.append(row)
    return meta, rows


def median(rows: list[dict[str, Any]], figure: str, lib: str, key: str) -> float | None:
    values = [r[key] for r in rows if r.get("figure") == figure and r.get("lib") == lib and r.get("ok") and r.get(key)]
    return statistics.median(values) if values else None


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit == "ms":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def cell(rows: list[dict[str, Any]], figure: str, lib: str, key: str, unit: str) -> str:
    """The median of the successful runs; else what a timed-out run did before its time box."""
    value = median(rows, figure, lib, key)
    if value is not None:
        return fmt(value, unit)
    partial = [r for r in rows if r.get("figure") == figure and r.get("lib") == lib and r.get(key)]
    if partial:
        r = partial[-1]
        return f"{fmt(r[key], unit)} (timed out: {r.get('done', 0):,} of {r.get('n', 0):,} done)"
    return "—"


def render(path: Path) -> str:
    meta, rows = load(path)
    libs = [lib for lib in LIBS if any(r.get("lib") == lib for r in rows)]
    m = meta.get("machine", {})
    v = meta.get("versions", {})
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(meta.get("at", time.time())))
    out = [
        f"Run of {when}: `{meta.get('command', 'python -m bench')}` → "
        f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`",
        "",
        f"Machine: {m.get('nproc')} cores, {m.get('ram_gib')} GiB RAM, PostgreSQL {m.get('postgres')} "
        f"(synchronous_commit={m.get('postgres_synchronous_commit')}, "
        f"shared_buffers={m.get('postgres_shared_buffers')}, "
        f"autovacuum={m.get('postgres_autovacuum', '?')}, "
        f"one durable single-row commit ≈ {m.get('postgres_commit_ms')} ms), "
        f"Redis {m.get('redis')}, Python {m.get('python')}; load average at start {m.get('loadavg_start')} "
        "(the machine is shared: compare within one run).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in sorted(v.items())),
        "",
        f"Tree: commit {meta.get('git', {}).get('commit')}"
        + (
            f", with uncommitted changes in {', '.join(meta['git']['modified'])}"
            if meta.get("git", {}).get("modified")
            else ""
        ),
        "",
    ]
    if libs and any(r.get("figure") in ("batch", "single", "drain", "latency") for r in rows):
        s = meta.get("sizes", {})
        out += [
            "| figure (one worker process × 10 slots; rq: 1 slot) | " + " | ".join(libs) + " |",
            "| --- | " + " | ".join("---:" for _ in libs) + " |",
        ]
        lines = [
            (f"(1) batch enqueue of {s.get('batch', 0):,}, jobs/s", "batch", "rate", ""),
            (f"(2) single enqueue of {s.get('single', 0):,}, jobs/s", "single", "rate", ""),
            (f"(3) drain of {s.get('drain', 0):,}, jobs/s (first start → last completion)", "drain", "rate", ""),
            ("(3) drain, jobs/s counting the worker's own start-up", "drain", "rate_spawn", ""),
            ("(4) pickup latency p50, ms", "latency", "p50_ms", "ms"),
            ("(4) pickup latency p99, ms", "latency", "p99_ms", "ms"),
        ]
        for title, figure, key, unit in lines:
            cells = [cell(rows, figure, lib, key, unit) for lib in libs]
            if any(c != "—" for c in cells):
                out.append(f"| {title} | " + " | ".join(cells) + " |")
        out.append("")

    alone = conveyor_alone(rows, meta)
    if alone:
        out += ["| Conveyor alone | value |", "| --- | ---: |", *[f"| {k} | {val} |" for k, val in alone], ""]
    checks = targets(rows)
    if checks:
        out += ["| target | measured | met |", "| --- | --- | --- |"]
        out += [f"| {t} | {measured} | {'yes' if ok else 'no'} |" for t, measured, ok in checks]
        out.append("")
    failed = [r for r in rows if not r.get("ok")]
    if failed:
        out.append("Failed figures: " + "; ".join(f"{r.get('figure')}/{r.get('lib')}" for r in failed))
        out.append("")
    return "\n".join(out)


def conveyor_alone(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[tuple[str, str]]:
    s = meta.get("sizes", {})
    items: list[tuple[str, str]] = []

    def add(title: str, figure: str, lib: str = "conveyor", key: str = "rate") -> None:
        value = median(rows, figure, lib, key)
        if value is not None:
            items.append((title, f"{value:,.0f} jobs/s"))

    add("drain, 1 process × 10 slots (`async def` handler)", "drain")
    add("drain, 1 process × 10 slots (`def` handler, thread pool)", "drain_sync_def")
    add("drain, 2 processes × 10 slots", "drain_2proc")
    add("drain, run right before the raw-SQL loop (6)", "drain_next_to_raw")
    add("drain on empty tables (median of the alternating runs)", "drain_empty")
    add(
        f"drain with {s.get('scheduled', 0):,} scheduled + {s.get('archived', 0):,} archived rows (median)",
        "drain_big_tables",
    )
    add("SQLite drain, 1 process × 10 slots", "sqlite_drain")
    add("MySQL (MariaDB) drain, 1 process × 10 slots", "mysql_drain")
    add("MySQL (MariaDB) batch enqueue", "mysql_batch")
    add("not default: drain with a fixed `--prefetch 20` (2 × concurrency, the old default)", "drain_prefetch20")
    add("not default: drain, worker sessions with synchronous_commit=off (PGOPTIONS)", "drain_async_commit")
    add("not default: drain with durable acks (`PostgresBackend(durable_acks=True)`)", "drain_durable_acks")
    for figure, what in (
        ("latency_async_commit", "worker sessions with synchronous_commit=off (PGOPTIONS)"),
        ("latency_durable_acks", "durable acks"),
    ):
        p50 = median(rows, figure, "conveyor", "p50_ms")
        p99 = median(rows, figure, "conveyor", "p99_ms")
        if p50 is not None and p99 is not None:
            items.append((f"not default: pickup p50 / p99, {what}", f"{p50:.2f} / {p99:.2f} ms"))
    for batch in sorted({r["batch"] for r in rows if r.get("lib") == "raw-sql" and r.get("ok")}):
        rates = [r["rate"] for r in rows if r.get("lib") == "raw-sql" and r.get("ok") and r["batch"] == batch]
        title = f"(6) raw acquire+finish SQL, batches of {batch}, one connection (median)"
        items.append((title, f"{statistics.median(rates):,.0f} jobs/s"))
    for r in rows:
        if r.get("workload") == "rss" and r.get("ok"):
            for count, kib in r.get("rss_kib", []):
                items.append((f"worker RSS after {count:,} jobs", f"{kib / 1024:.1f} MiB"))
            items.append(("worker RSS growth", f"{r['rss_growth'] * 100:+.1f} %"))
            items.append((f"drain rate over the {r['n']:,} jobs", f"{r['rate']:,.0f} jobs/s"))
    return items


def targets(rows: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    checks: list[tuple[str, str, bool]] = []
    peers = [lib for lib in LIBS[1:] if median(rows, "drain", lib, "rate")]
    ours = median(rows, "drain", "conveyor", "rate")
    if ours and peers:
        best = max(peers, key=lambda lib: median(rows, "drain", lib, "rate") or 0)
        theirs = median(rows, "drain", best, "rate") or 1
        checks.append(
            (
                "PostgreSQL drain ≥ 2× best peer",
                f"{ours:,.0f} vs {best} {theirs:,.0f} = {ours / theirs:.2f}×",
                ours >= 2 * theirs,
            )
        )
    peers = [lib for lib in LIBS[1:] if median(rows, "batch", lib, "rate")]
    ours = median(rows, "batch", "conveyor", "rate")
    if ours and peers:
        best = max(peers, key=lambda lib: median(rows, "batch", lib, "rate") or 0)
        theirs = median(rows, "batch", best, "rate") or 1
        checks.append(
            (
                "batch enqueue ≥ 2× best peer's bulk API",
                f"{ours:,.0f} vs {best} {theirs:,.0f} = {ours / theirs:.2f}×",
                ours >= 2 * theirs,
            )
        )
    p50 = median(rows, "latency", "conveyor", "p50_ms")
    p99 = median(rows, "latency", "conveyor", "p99_ms")
    if p50 is not None and p99 is not None:
        checks.append(("pickup p50 ≤ 3 ms, p99 ≤ 10 ms", f"p50 {p50:.2f} ms, p99 {p99:.2f} ms", p50 <= 3 and p99 <= 10))
    empty = median(rows, "drain_empty", "conveyor", "rate")
    big = median(rows, "drain_big_tables", "conveyor", "rate")
    if empty and big:
        checks.append(
            (
                "drain with 1M scheduled + 10M archived within 10 % of empty",
                f"{big:,.0f} vs {empty:,.0f} = {big / empty - 1:+.1%}",
                big >= 0.9 * empty,
            )
        )
    for r in rows:
        if r.get("workload") == "rss" and r.get("ok") and r.get("rss_kib"):
            g = r["rss_growth"]
            first, last = r["rss_kib"][0][0], r["rss_kib"][-1][0]
            checks.append((f"RSS flat ± 10 % from {first:,} to {last:,} jobs", f"{g:+.1%}", abs(g) <= 0.10))
    # The limit: the best batch size's median over the repeats.
    by_batch: dict[int, list[float]] = {}
    for r in rows:
        if r.get("lib") == "raw-sql" and r.get("ok"):
            by_batch.setdefault(r["batch"], []).append(r["rate"])
    raw = [statistics.median(v) for v in by_batch.values()]
    ours = median(rows, "drain_next_to_raw", "conveyor", "rate") or median(rows, "drain", "conveyor", "rate")
    if raw and ours:
        limit = max(raw)
        checks.append(
            (
                "drain within 2× of the raw-SQL limit",
                f"{ours:,.0f} vs {limit:,.0f} = {limit / ours:.2f}× slower",
                ours * 2 >= limit,
            )
        )
    sqlite = median(rows, "sqlite_drain", "conveyor", "rate")
    if sqlite:
        checks.append(("SQLite drain ≥ 2,500 jobs/s", f"{sqlite:,.0f} jobs/s", sqlite >= 2500))
    return checks


def write_docs(table: str) -> None:
    """Replace the results block of docs/benchmarks.md with ``table``."""
    text = DOCS.read_text() if DOCS.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOCS.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
