"""Fan-out topics: list, subscribe, unsubscribe."""

from __future__ import annotations

import json

import click
from rich.table import Table

from conveyor._errors import printable
from conveyor.cli._common import actor, app_of, cell, console, dump, parse_json

_ACTOR = click.option("--actor", "who", default=None, help="Who (default: the OS user); kept in the audit log.")


@click.group()
def topics() -> None:
    """Fan-out topics: list, subscribe and unsubscribe queues."""


@topics.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def topics_list(ctx: click.Context, as_json: bool) -> None:
    """Every topic with its subscriptions."""
    rows = app_of(ctx).admin.subscriptions()
    if as_json:
        dump([{"topic": r.topic, "queue": r.queue, "task": r.task, "filter": json.loads(r.filter)} for r in rows])
        return
    table = Table(title="Topics and subscriptions")
    for column in ("topic", "queue", "task", "filter"):
        table.add_column(column)
    for r in rows:
        table.add_row(cell(r.topic), cell(r.queue), cell(r.task), cell(r.filter))
    console.print(table)


@topics.command("subscribe")
@click.argument("topic")
@click.argument("queue")
@click.option("--task", required=True, help="The task that handles the copies on QUEUE.")
@click.option("--filter", "filter_", default=None, help='Header conditions, e.g. \'{"region": {"in": ["eu"]}}\'.')
@_ACTOR
@click.pass_context
def topics_subscribe(
    ctx: click.Context, topic: str, queue: str, task: str, filter_: str | None, who: str | None
) -> None:
    """Bind QUEUE to TOPIC."""
    sub = app_of(ctx).admin.subscribe(
        topic, queue, task, parse_json(filter_, "--filter") if filter_ else None, actor=actor(who)
    )
    click.echo(f"{printable(topic)} -> {printable(sub.queue)} ({printable(sub.task)}) filter {sub.filter}")


@topics.command("unsubscribe")
@click.argument("topic")
@click.argument("queue")
@_ACTOR
@click.pass_context
def topics_unsubscribe(ctx: click.Context, topic: str, queue: str, who: str | None) -> None:
    """Remove QUEUE's subscription to TOPIC."""
    app_of(ctx).admin.unsubscribe(topic, queue, actor=actor(who))
    click.echo(f"{printable(queue)} unsubscribed from {printable(topic)}")
