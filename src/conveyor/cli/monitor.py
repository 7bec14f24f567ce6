"""What operators watch from a shell: the worker processes and the alerts (the same reads as the
HTTP API's ``/v1/workers`` and ``/v1/alerts`` and the dashboard's pages)."""

from __future__ import annotations

import click
from rich.table import Table

from conveyor.cli._common import app_of, cell, console, dump


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """Worker processes seen in the last hour: queues, slots, jobs held now, last heartbeat."""
    app = app_of(ctx)
    rows = app.admin.workers()
    if as_json:
        dump([w.to_json() for w in rows])
        return
    now = app.clock()
    table = Table(title="Conveyor workers")
    for column in ("worker", "host", "pid", "queues", "slots", "in flight", "last seen", "alive"):
        table.add_column(column, justify="right" if column in ("pid", "slots", "in flight", "last seen") else "left")
    for w in rows:
        seen = f"{max(0.0, (now - w.last_seen).total_seconds()):.0f}s ago"
        table.add_row(
            cell(w.id), cell(w.host), str(w.pid), cell(",".join(w.queues)), str(w.concurrency),
            str(len(w.in_flight)), seen, "yes" if w.alive else "no",
        )  # fmt: skip
    console.print(table)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--firing", is_flag=True, help="Only the alerts firing now.")
@click.pass_context
def alerts(ctx: click.Context, as_json: bool, firing: bool) -> None:
    """Alert states as `conveyor serve` last evaluated them (empty until it has run)."""
    rows = [a for a in app_of(ctx).admin.alerts() if a.state == "firing" or not firing]
    if as_json:
        dump([a.to_json() for a in rows])
        return
    table = Table(title="Conveyor alerts")
    for column in ("rule", "queue", "state", "since", "value", "threshold", "message"):
        table.add_column(column, justify="right" if column in ("value", "threshold") else "left")
    for a in rows:
        table.add_row(
            cell(a.rule), cell(a.queue or "-"), a.state, a.since.isoformat(timespec="seconds"),
            f"{a.value:g}", f"{a.threshold:g}", cell(a.message),
        )  # fmt: skip
    console.print(table)
