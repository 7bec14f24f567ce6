"""Dead letters (list, show, replay, purge) and the audit log."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from conveyor._admin import MAX_REPLAY_RATE, MIN_REPLAY_RATE
from conveyor.cli._common import FiniteFloat, actor, app_of, cell, console, dump, fail
from conveyor.cli.jobs import print_status


@click.group()
def dlq() -> None:
    """Inspect, replay and purge dead letters."""


@dlq.command("list")
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--error-type", default=None)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_list(
    ctx: click.Context, queue: str | None, task: str | None, error_type: str | None, limit: int, as_json: bool
) -> None:
    """List dead letters, newest first."""
    rows = app_of(ctx).admin.dead_letters(queue=queue, task=task, error_type=error_type, limit=limit)
    if as_json:
        dump([r.dead_letter_json() for r in rows])
        return
    table = Table(title=f"Dead letters ({len(rows)} shown; details: conveyor dlq show ID)")
    for column in ("id", "queue", "task", "attempts", "reason", "error"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=36 if column == "id" else None)
    for r in rows:
        table.add_row(
            str(r.id),
            cell(r.queue),
            cell(r.task.rsplit(".", 1)[-1]),
            str(r.attempts),
            cell(r.reason or ""),
            cell(r.error.type if r.error else ""),
        )
    console.print(table)


@dlq.command("show")
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one dead letter in full (payload, headers, error, traceback)."""
    status = app_of(ctx).admin.dead_letter(job_id)
    if as_json:
        dump(status.to_json())
    else:
        print_status(status)


def _selection(ids: tuple[str, ...], all_: bool, queue: str | None, task: str | None, error_type: str | None) -> Any:
    """The ``ids`` argument of an admin action: the ids given, or None to select by filter."""
    if ids and all_:
        fail("give job ids or --all, not both")
    if not ids and not all_:
        fail("give one or more job ids, or --all with --queue")
    if all_ and not queue:
        fail("--all needs --queue (replaying or purging every queue at once is too easy a mistake)")
    if ids and (queue or task or error_type):
        fail("--queue, --task and --error-type select with --all; give them without ids")
    return list(ids) if ids else None


@dlq.command("replay")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "all_", is_flag=True, help="Every dead letter of --queue (narrow with --task/--error-type).")
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--error-type", default=None)
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@click.option(
    "--rate",
    default=None,
    type=FiniteFloat(MIN_REPLAY_RATE, MAX_REPLAY_RATE),
    help="At most N jobs per second (0.01 to 1000000), so that a big replay cannot flood the workers.",
)
@click.option("--actor", "who", default=None, help="Who (default: the OS user).")
@click.option("--json", "as_json", is_flag=True, help="Print the (dead id, new id) pairs as JSON.")
@click.pass_context
def dlq_replay(
    ctx: click.Context,
    ids: tuple[str, ...],
    all_: bool,
    queue: str | None,
    task: str | None,
    error_type: str | None,
    reason: str,
    rate: float | None,
    who: str | None,
    as_json: bool,
) -> None:
    """Re-enqueue dead letters to their source queue with fresh attempts (audited)."""
    selection = _selection(ids, all_, queue, task, error_type)
    # Only on a terminal: elsewhere (a script, a pipe, cron) the bar drew nothing but left a blank line on stderr,
    # before the skipped-ids note or an error's one line.
    bar_on = Console(stderr=True)
    admin = app_of(ctx).admin
    written = [0, 0]  # (done, total) after the last chunk written

    def progressed(done: int, total: int) -> None:
        written[:] = [done, total]
        progress.update(bar, completed=done, total=total)

    with Progress(console=bar_on, transient=True, disable=as_json or not bar_on.is_terminal) as progress:
        bar = progress.add_task("replaying", total=None)
        try:
            result = admin.replay(
                selection,
                queue=queue if all_ else None,
                task=task if all_ else None,
                error_type=error_type if all_ else None,
                reason=reason,
                actor=actor(who),
                rate=rate,
                on_progress=progressed,
            )
        except KeyboardInterrupt:
            # Each chunk is its own transaction: those written stay replayed. "conveyor: aborted" said nothing of
            # them, and the operator of a paced replay could not tell how far it went.
            fail(
                f"interrupted after {written[0]} of {written[1] or 'the'} selected dead letter(s) were done (the chunk "
                "under way may be done too): the others are still dead letters; conveyor audit lists the replays"
            )
    if as_json:
        dump([{"dead_id": str(d), "new_id": str(n)} for d, n in result.replayed])
    else:
        total = len(result.replayed) + len(result.skipped)
        click.echo(f"replayed {len(result.replayed)} of {total} dead letter(s)")
    if result.skipped and not all_:
        click.echo(f"{len(result.skipped)} id(s) were not unreplayed dead letters and were skipped", err=True)


@dlq.command("purge")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "all_", is_flag=True, help="Every dead letter of --queue (narrow with --task/--error-type).")
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--error-type", default=None)
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@click.option("--actor", "who", default=None, help="Who (default: the OS user).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def dlq_purge(
    ctx: click.Context,
    ids: tuple[str, ...],
    all_: bool,
    queue: str | None,
    task: str | None,
    error_type: str | None,
    reason: str,
    who: str | None,
    yes: bool,
) -> None:
    """Delete dead letters for good (audited). Asks first, unless --yes; without a terminal to ask
    on (a script, a pipe, cron) it refuses to purge without --yes."""
    if not yes and not sys.stdin.isatty():
        fail("dlq purge deletes dead letters for good and there is no terminal to confirm it on: pass --yes")
    admin = app_of(ctx).admin
    selection = _selection(ids, all_, queue, task, error_type)
    selected = admin.select(selection, queue=queue, task=task, error_type=error_type)
    if not yes:
        click.confirm(f"purge {len(selected)} dead letter(s) for good?", abort=True)
    result = admin.purge(selected, reason=reason, actor=actor(who))
    click.echo(f"purged {result.purged} dead letter(s)")


@click.command()
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--job", "job", default=None, metavar="ID", help="Only the actions naming this job.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def audit(ctx: click.Context, limit: int, job: str | None, as_json: bool) -> None:
    """Operator actions (replays, purges, schedule and topic changes), newest first."""
    entries = app_of(ctx).admin.audit(limit, job=job)
    if as_json:
        dump([e.to_json() for e in entries])
        return
    table = Table(title="Audit log")
    for column in ("at", "actor", "action", "jobs", "reason"):
        table.add_column(column)
    for e in entries:
        table.add_row(
            e.at.strftime("%Y-%m-%d %H:%M:%S"), cell(e.actor), cell(e.action), str(len(e.job_ids)), cell(e.reason)
        )
    console.print(table)
