"""Rendering the report as one self-contained HTML page (inline CSS and SVG, no scripts)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any

from conveyor.pipeline._svg import bar_chart, line_chart

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}th{background:#f4f4f4}
td.t,th.t{text-align:left}.muted{color:#777;font-size:12px}svg{display:block;margin:8px 0}
"""


def _cell(value: Any) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        if value != value:  # NaN
            return "&ndash;"
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return escape(str(value))


def table_html(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], limit: int = 25, total: int | None = None
) -> str:
    """An HTML table of the first ``limit`` rows; text columns are left-aligned.

    ``total`` is the whole table's row count when ``rows`` are only its first rows; the page then
    says how many more the Parquet table holds."""
    if not rows:
        return '<p class="muted">none</p>'
    total = len(rows) if total is None else max(total, len(rows))
    text = {c for c in columns if any(isinstance(r.get(c), str) for r in rows)}
    head = "".join(f'<th class="{"t" if c in text else ""}">{escape(c)}</th>' for c in columns)
    body = []
    for r in rows[:limit]:
        cells = "".join(f'<td class="{"t" if c in text else ""}">{_cell(r.get(c))}</td>' for c in columns)
        body.append(f"<tr>{cells}</tr>")
    shown = min(limit, len(rows))
    more = f'<p class="muted">{total - shown:,} more rows in the Parquet table</p>' if total > shown else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def queue_label(queue: Any) -> Any:
    """A queue name for display, one label per name: the empty name (only raw SQL can store it) as
    :data:`EMPTY_QUEUE_LABEL`, which would otherwise be a blank cell, a blank chart label and a blank
    row in the command's table.

    ``(empty)`` is a valid queue name too, so a name that reads as the label after any number of
    backslashes (``(empty)``, ``\\(empty)``, ...) is shown with one backslash more: the two queues
    get two rows and two chart series (one label for both merged their series into one)."""
    if queue == "":
        return EMPTY_QUEUE_LABEL
    if isinstance(queue, str) and queue.lstrip("\\") == EMPTY_QUEUE_LABEL:
        return "\\" + queue
    return queue


#: How the queue named '' is shown.
EMPTY_QUEUE_LABEL = "(empty)"


def render_report(
    summary: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    charts: Mapping[str, Mapping[str, Sequence[tuple[datetime, float]]]],
    totals: Mapping[str, int],
) -> str:
    """The whole report page.

    ``tables`` holds the head of each long table (``latency``, ``outcomes``, ``failures``,
    ``poison``) and every per-queue row (``latency_by_queue``, ``outcomes_by_queue``, ``sla``,
    ``capacity``); ``totals`` is each table's whole row count. The queue named '' (raw SQL can store
    one) is shown as :data:`EMPTY_QUEUE_LABEL`."""
    tables = {
        name: [{**r, "queue": queue_label(r["queue"])} if "queue" in r else r for r in rows]
        for name, rows in tables.items()
    }
    charts = {name: {queue_label(q): points for q, points in series.items()} for name, series in charts.items()}
    latency_q = tables["latency_by_queue"]
    queues = [str(r["queue"]) for r in latency_q]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Conveyor job history report</title>",
        f"<style>{_CSS}</style></head><body><h1>Conveyor job history report</h1>",
        f'<p class="muted">generated {escape(str(summary["generated_at"]))}; '
        f"archive jobs {summary['jobs']['archive']:,}, live jobs {summary['jobs']['live']:,}"
        + (f"; since {escape(str(summary['since']))}" if summary.get("since") else "")
        + "</p>",
        "<h2>Throughput</h2>",
        line_chart("Enqueued per minute", charts.get("enqueued", {}), "jobs/min"),
        line_chart("Completed per minute", charts.get("completed", {}), "jobs/min"),
        "<h2>Depth over time</h2>",
        line_chart("Jobs enqueued and not yet ended", charts.get("depth", {}), "jobs", step=True),
        "<h2>Latency</h2>",
    ]
    for metric, label in (
        ("wait", "Wait (ready → first start)"),
        ("run", "Run (last delivery)"),
        ("e2e", "End to end"),
    ):
        series = {f"p{q}": [r[f"{metric}_p{q}_s"] for r in latency_q] for q in (50, 95, 99)}
        parts.append(bar_chart(f"{label}, seconds", queues, series, "seconds"))
    lat_cols = ["queue", "priority"] + [f"{m}_{s}" for m in ("wait", "run", "e2e") for s in ("p50_s", "p95_s", "p99_s")]
    parts.append(table_html(tables["latency"], lat_cols, limit=100, total=totals.get("latency")))
    parts.append("<h2>SLA breaches</h2>")
    parts.append(
        bar_chart(
            "Share of jobs that waited longer than the SLA",
            [str(r["queue"]) for r in tables["sla"]],
            {"breach rate": [r["breach_rate"] for r in tables["sla"]]},
        )
    )
    parts.append(
        table_html(tables["sla"], ["queue", "sla_s", "started", "breaches", "breach_rate", "worst_wait_s"], limit=100)
    )
    per_queue = tables["outcomes_by_queue"]
    parts.append("<h2>Retries and dead letters</h2>")
    parts.append(
        bar_chart(
            "Retry and DLQ rates",
            [str(r["queue"]) for r in per_queue],
            {"retry rate": [r["retry_rate"] for r in per_queue], "DLQ rate": [r["dlq_rate"] for r in per_queue]},
        )
    )
    parts.append(
        table_html(
            tables["outcomes"],
            [
                "queue",
                "task",
                "jobs",
                "completed",
                "dead",
                "expired",
                "retried_jobs",
                "retries",
                "retry_rate",
                "dlq_rate",
            ],
            limit=50,
            total=totals.get("outcomes"),
        )
    )
    parts.append("<h2>Duplicate deliveries (deliveries &gt; attempts)</h2>")
    parts.append(
        table_html(per_queue, ["queue", "jobs", "duplicate_jobs", "extra_deliveries", "duplicate_rate"], limit=100)
    )
    parts.append("<h2>Failure taxonomy (error type &times; task)</h2>")
    parts.append(
        table_html(
            tables["failures"],
            ["task", "error_type", "jobs", "dead", "recovered", "queues", "example_message"],
            total=totals.get("failures"),
        )
    )
    parts.append("<h2>Poison candidates</h2>")
    parts.append(
        table_html(
            tables["poison"],
            ["job_id", "queue", "task", "state", "attempts", "deliveries", "lost_deliveries", "reason", "error_type"],
            total=totals.get("poison"),
        )
    )
    parts.append("<h2>Capacity plan</h2>")
    parts.append(
        table_html(
            tables["capacity"],
            [
                "queue",
                "arrival_rate",
                "peak_arrival_rate",
                "mean_service_s",
                "concurrency",
                "peak_concurrency",
                "suggested_workers",
                "drain_rate",
                "sla_s",
                "high_water_mark",
                "scale_out_1_depth",
                "scale_out_2_depth",
                "scale_in_depth",
                "max_depth",
                "declared_max_depth",
            ],
            limit=100,
        )
    )
    parts.append(
        '<p class="muted">Rates are jobs per second. Concurrency is Little\'s law (arrival rate &times; mean service '
        "time); the high-water mark is drain rate &times; SLA; scale out one step at the first threshold, two at the "
        "second, scale in below the last. max_depth is the deepest the queue was seen, declared_max_depth the "
        "high-water mark the queue declares (above the computed mark it admits more than it drains within its SLA). "
        "Definitions: docs/pipeline.md.</p>"
    )
    parts.append("<h2>Summary</h2><pre>" + escape(json.dumps(summary, indent=2, default=str)) + "</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)
