"""Commands on jobs and queues: migrate, send, stats, job, publish, contract."""

from __future__ import annotations

import json

import click
from rich.table import Table

from conveyor._errors import printable
from conveyor._job import JobStatus
from conveyor.cli._common import app_of, cell, console, dump, parse_json


@click.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Apply pending schema migrations."""
    applied = app_of(ctx).admin.migrate()
    click.echo(f"applied {len(applied)} migration(s)" + (": " + ", ".join(applied) if applied else ""))


@click.command()
@click.argument("queue")
@click.argument("task")
@click.option("--payload", default="{}", show_default=True, help="The job's arguments, a JSON object.")
@click.option("--headers", default=None, help="Extra headers, a JSON object.")
@click.option("--delay", default=None, type=float, help="Seconds before the job may run.")
@click.option("--priority", default=None, type=int, help="Higher runs first (a 32-bit integer).")
@click.option("--idempotency-key", default=None, help="Duplicates inside the dedup window are not enqueued.")
@click.option("--ordering-key", default=None, help="Jobs with the same key run one at a time, in order.")
@click.option("--ttl", default=None, type=float, help="Expire if not started in S s.")
@click.option("--max-attempts", default=None, type=int, help="Attempts before the DLQ (1 to 1,000,000).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
def send(
    ctx: click.Context,
    queue: str,
    task: str,
    payload: str,
    headers: str | None,
    delay: float | None,
    priority: int | None,
    idempotency_key: str | None,
    ordering_key: str | None,
    ttl: float | None,
    max_attempts: int | None,
    as_json: bool,
) -> None:
    """Enqueue one job for TASK on QUEUE."""
    job = app_of(ctx).send(
        task,
        parse_json(payload, "--payload"),
        queue=queue,
        delay=delay,
        priority=priority,
        idempotency_key=idempotency_key,
        ordering_key=ordering_key,
        ttl=ttl,
        max_attempts=max_attempts,
        headers=parse_json(headers, "--headers") if headers else None,
    )
    if as_json:
        dump({"id": str(job.id)})
    else:
        click.echo(str(job.id))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Per queue: pending, scheduled, processing, completed, dead, expired, oldest pending age."""
    rows = app_of(ctx).admin.queues()
    if as_json:
        dump([{name: getattr(r, name) for name in r.__slots__} for r in rows])
        return
    table = Table(title="Conveyor queues")
    for column in ("queue", "pending", "scheduled", "processing", "completed", "dead", "expired", "oldest pending"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for r in rows:
        age = "-" if r.oldest_pending_age is None else f"{r.oldest_pending_age:.1f}s"
        counts = (r.pending, r.scheduled, r.processing, r.completed, r.dead, r.expired)
        table.add_row(cell(r.queue), *(str(n) for n in counts), age)
    console.print(table)


def print_status(status: JobStatus) -> None:
    """One job, a field per line (``unreadable`` only when something is), its error and traceback last."""
    data = status.to_json()
    error = data.pop("error")
    if not data["unreadable"]:
        del data["unreadable"]
    for key, value in data.items():
        click.echo(f"{key:>16}: {json.dumps(value) if isinstance(value, dict) else printable(value)}")
    if error:
        click.echo(f"{'error':>16}: {printable(error['type'])}: {printable(error['message'], multiline=True)}")
        if error["traceback"]:
            click.echo(printable(error["traceback"].rstrip(), multiline=True))


@click.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job: state, attempts, result or error."""
    status = app_of(ctx).admin.job(job_id)
    if as_json:
        dump(status.to_json())
    else:
        print_status(status)


@click.command()
@click.argument("topic")
@click.option("--payload", default="{}", show_default=True, help="A JSON object.")
@click.option("--headers", default=None, help="A JSON object (subscription filters match on these).")
@click.option("--json", "as_json", is_flag=True, help="Print the job ids as JSON.")
@click.pass_context
def publish(ctx: click.Context, topic: str, payload: str, headers: str | None, as_json: bool) -> None:
    """Publish to TOPIC: one job per matching subscription, in one transaction."""
    jobs = app_of(ctx).publish(
        topic, parse_json(payload, "--payload"), headers=parse_json(headers, "--headers") if headers else None
    )
    if as_json:
        dump([str(j.id) for j in jobs])
    else:
        click.echo(f"published to {len(jobs)} subscription(s)")


@click.command()
@click.option("--format", "fmt", type=click.Choice(["md", "json", "yaml"]), default="md", show_default=True)
@click.pass_context
def contract(ctx: click.Context, fmt: str) -> None:
    """Print every queue's declared policy and every topic's subscriptions: the queue contract
    (with --app, the App's declared queues and tasks too)."""
    from conveyor._contract import build, render

    click.echo(render(build(app_of(ctx)), fmt), nl=False)
