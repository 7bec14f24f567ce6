"""Periodic schedules, changed live: list, add, pause, resume, set, remove."""

from __future__ import annotations

import json

import click
from rich.table import Table

from conveyor._errors import printable
from conveyor.cli._common import actor, app_of, cell, console, dump, parse_json

_ACTOR = click.option("--actor", "who", default=None, help="Who (default: the OS user); kept in the audit log.")


@click.group()
def schedules() -> None:
    """List, add, change, pause and resume periodic schedules (workers pick changes up live)."""


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedules_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule with its next tick."""
    rows = app_of(ctx).admin.schedules()
    if as_json:
        dump(
            [
                {
                    "name": s.name,
                    "cron": s.cron,
                    "task": s.task,
                    "queue": s.queue,
                    "payload": json.loads(s.payload),
                    "paused": s.paused,
                    "next_run_at": s.next_run_at.isoformat(),
                    "last_run_at": s.last_run_at.isoformat() if s.last_run_at else None,
                }
                for s in rows
            ]
        )
        return
    table = Table(title="Schedules")
    for column in ("name", "cron", "task", "queue", "state", "next tick", "last tick"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for s in rows:
        table.add_row(
            cell(s.name),
            cell(s.cron),
            cell(s.task),
            cell(s.queue),
            "paused" if s.paused else "active",
            s.next_run_at.strftime("%Y-%m-%d %H:%M"),
            s.last_run_at.strftime("%Y-%m-%d %H:%M") if s.last_run_at else "-",
        )
    console.print(table)


@schedules.command("add")
@click.argument("name")
@click.option("--cron", "expression", required=True, help='Five cron fields, UTC (e.g. "*/5 * * * *").')
@click.option("--task", required=True)
@click.option("--queue", default=None, help="Queue of its jobs (default: the task's queue with --app, else default).")
@click.option("--payload", default="{}", show_default=True, help="A JSON object.")
@click.option("--priority", default=0, show_default=True, type=int)
@_ACTOR
@click.pass_context
def schedules_add(
    ctx: click.Context,
    name: str,
    expression: str,
    task: str,
    queue: str | None,
    payload: str,
    priority: int,
    who: str | None,
) -> None:
    """Add (or redefine) a schedule at runtime."""
    schedule = app_of(ctx).admin.add_schedule(
        name,
        expression,
        task,
        queue=queue,
        payload=parse_json(payload, "--payload"),
        priority=priority,
        actor=actor(who),
    )
    click.echo(
        f"schedule {printable(schedule.name)}: {schedule.cron} -> {printable(schedule.task)} on "
        f"{printable(schedule.queue)}, next tick {schedule.next_run_at.isoformat()}"
    )


@schedules.command("pause")
@click.argument("name")
@_ACTOR
@click.pass_context
def schedules_pause(ctx: click.Context, name: str, who: str | None) -> None:
    """Stop firing a schedule until it is resumed."""
    app_of(ctx).admin.pause_schedule(name, actor=actor(who))
    click.echo(f"schedule {printable(name)} paused")


@schedules.command("resume")
@click.argument("name")
@_ACTOR
@click.pass_context
def schedules_resume(ctx: click.Context, name: str, who: str | None) -> None:
    """Fire a paused schedule again (from its next tick after now; missed ticks are not fired)."""
    app_of(ctx).admin.resume_schedule(name, actor=actor(who))
    click.echo(f"schedule {printable(name)} resumed")


@schedules.command("set")
@click.argument("name")
@click.option("--cron", "expression", required=True, help="The new cron expression.")
@_ACTOR
@click.pass_context
def schedules_set(ctx: click.Context, name: str, expression: str, who: str | None) -> None:
    """Change a schedule's cron expression."""
    schedule = app_of(ctx).admin.set_schedule(name, expression, actor=actor(who))
    click.echo(f"schedule {printable(name)}: {schedule.cron}")


@schedules.command("remove")
@click.argument("name")
@_ACTOR
@click.pass_context
def schedules_remove(ctx: click.Context, name: str, who: str | None) -> None:
    """Delete a schedule (a worker whose app still declares it adds it back when it starts)."""
    app_of(ctx).admin.remove_schedule(name, actor=actor(who))
    click.echo(f"schedule {printable(name)} removed")
