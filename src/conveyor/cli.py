"""The ``conveyor`` command line: migrate, run workers, send jobs, inspect queues, operate the DLQ.

Every error the user can cause ends in one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import getpass
import json
import logging
import math
import sys
import time
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn
from uuid import UUID

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from conveyor._app import App
from conveyor._errors import ConveyorError, JobNotFoundError
from conveyor._ids import uuid7
from conveyor._job import JobStatus
from conveyor._limits import MAX_JSON_DEPTH, check_worker_options
from conveyor.backends import DEFAULT_DATABASE_URL
from conveyor.backends.base import (
    DeadListParams,
    DeadPurgeParams,
    DeadReplayParams,
    JobRecord,
    QueuesStatsParams,
)

console = Console()


class CliError(click.ClickException):
    """An error shown to the user as one line."""


class _FiniteFloat(click.FloatRange):
    """A FloatRange that also refuses nan and inf (NaN compares false, so it passes every range)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


#: Most rows a listing prints at once.
_MAX_LIMIT = 1_000_000


def _fail(message: str) -> NoReturn:
    raise CliError(message)


def _settings(ctx: click.Context) -> dict[str, Any]:
    """The global options (--db, --app, -v), wherever on the command line they were given."""
    obj: dict[str, Any] = ctx.find_root().ensure_object(dict)
    return obj


def _app(ctx: click.Context) -> App:
    """The App the command works on, made on first use: by then every --db/--app is parsed,
    including those given after the subcommand."""
    settings = _settings(ctx)
    app: App | None = settings.get("app")
    if app is None:
        if settings.get("app_path"):
            from conveyor.worker.supervisor import load_app

            app = load_app(settings["app_path"])
            if settings["db_given"] or not app.database_url:
                app.database_url = settings["database_url"]
        else:
            app = App(settings["database_url"])
        settings["app"] = app
        ctx.find_root().call_on_close(app.close)
    return app


def _dump(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


# Terminal control characters (ESC starts an escape sequence), bidi overrides and line separators in
# a name could rewrite what an operator sees; they are shown escaped, as repr() would.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _printable(value: object, multiline: bool = False) -> str:
    """``value`` as text safe to print on a terminal: control characters escaped (``\\x1b``);
    with ``multiline``, newlines and tabs are kept (error messages, tracebacks)."""
    text = str(value)
    if text.isprintable():
        return text
    out = []
    for char in text:
        if multiline and char in "\n\t":
            out.append(char)
        elif char in _BIDI or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


def _cell(value: object) -> Text:
    """A table cell: printable, and never read as rich markup (a queue named "[red]" stays literal)."""
    return Text(_printable(value))


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)
    # The connection pool logs every failed attempt; Conveyor's own error says why it gave up, in
    # one line. Its attempts are shown with -v.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR if verbose == 0 else logging.NOTSET)


_DB_HELP = "Database URL (or $CONVEYOR_DATABASE_URL)."
_APP_HELP = (
    "module:attribute of your App ($CONVEYOR_APP): send and publish then apply its queue policies "
    "(backpressure, dedup windows) and task defaults; contract prints its declared queues and tasks."
)
_VERBOSE_HELP = "More logging (-v info, -vv debug)."


@click.group()
@click.option(
    "--db",
    "database_url",
    metavar="URL",
    envvar="CONVEYOR_DATABASE_URL",
    default=DEFAULT_DATABASE_URL,
    show_default=True,
    help=_DB_HELP,
)
@click.option("--app", "app_path", metavar="MODULE:ATTR", envvar="CONVEYOR_APP", default=None, help=_APP_HELP)
@click.option("-v", "--verbose", count=True, help=_VERBOSE_HELP)
@click.pass_context
def cli(ctx: click.Context, database_url: str, app_path: str | None, verbose: int) -> None:
    """Conveyor: a durable, at-least-once task queue on SQL.

    --db, --app and -v may be given before or after the command (conveyor migrate --db URL)."""
    source = ctx.get_parameter_source("database_url")
    settings = _settings(ctx)
    settings.update(
        database_url=database_url,
        db_given=source is not None and source.name != "DEFAULT",
        app_path=app_path,
        verbose=verbose,
    )
    _configure_logging(verbose)


def _set_db(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _settings(ctx).update(database_url=value, db_given=True)


def _set_app(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _settings(ctx)["app_path"] = value


def _add_verbose(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    if value:
        settings = _settings(ctx)
        settings["verbose"] = settings.get("verbose", 0) + value
        _configure_logging(settings["verbose"])


def _accept_global_options(group: click.Group) -> None:
    """Let every command under ``group`` take --db, --app and -v after its name as well: users write
    ``conveyor migrate --db URL`` (the README did) as often as ``conveyor --db URL migrate``."""
    for command in group.commands.values():
        taken = {opt for param in command.params for opt in param.opts}
        extra = [
            click.Option(
                ["--db", "global_db"], metavar="URL", default=None, expose_value=False, callback=_set_db, help=_DB_HELP
            ),
            click.Option(
                ["--app", "global_app"],
                metavar="MODULE:ATTR",
                default=None,
                expose_value=False,
                callback=_set_app,
                help=_APP_HELP,
            ),
            click.Option(
                ["-v", "--verbose", "global_verbose"],
                count=True,
                expose_value=False,
                callback=_add_verbose,
                help=_VERBOSE_HELP,
            ),
        ]
        command.params.extend(o for o in extra if not taken.intersection(o.opts))
        if isinstance(command, click.Group):
            _accept_global_options(command)


@cli.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Apply pending schema migrations."""
    from conveyor.backends import open_backend

    # Not through the App: it migrates the embedded default on open, and then reports nothing applied.
    backend = open_backend(_settings(ctx)["database_url"])
    try:
        applied = backend.migrate()
    finally:
        backend.close()
    click.echo(f"applied {len(applied)} migration(s)" + (": " + ", ".join(applied) if applied else ""))


@cli.command()
@click.argument("app_path", metavar="APP")
@click.option(
    "--queues",
    default=None,
    help="Lanes: a,b drains a before b; a:3,b:1 shares slots 3:1 (default: all declared queues).",
)
@click.option(
    "--processes",
    "-p",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Worker processes (prefork).",
)
@click.option(
    "--concurrency",
    "-c",
    default=10,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Handler slots per process.",
)
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(1, 100_000),
    help="Leased jobs buffered per process (default: adaptive, 4 to 16 x concurrency).",
)
@click.option("--burst", is_flag=True, help="Drain the queues (scheduled retries included) and exit.")
@click.option(
    "--graceful-timeout",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds running handlers get to finish on SIGTERM.",
)
@click.option(
    "--visibility-timeout",
    default=30.0,
    show_default=True,
    type=float,
    help="Lease length of a fetched job before its task's own setting applies (seconds).",
)
@click.pass_context
def worker(
    ctx: click.Context,
    app_path: str,
    queues: str | None,
    processes: int,
    concurrency: int,
    prefetch: int | None,
    burst: bool,
    graceful_timeout: float,
    visibility_timeout: float,
) -> None:
    """Run workers for APP (module:attribute, e.g. myproject.tasks:app)."""
    from conveyor.worker.supervisor import load_app, run_processes

    load_app(app_path)
    # Checked here, before any process is forked: a child that refuses its options would be restarted forever.
    check_worker_options(
        concurrency=concurrency,
        prefetch=prefetch,
        visibility_timeout=visibility_timeout,
        graceful_timeout=graceful_timeout,
    )
    lanes, weights = _lanes(queues)
    options: dict[str, Any] = {
        "queues": lanes,
        "weights": weights,
        "concurrency": concurrency,
        "prefetch": prefetch,
        "burst": burst,
        "graceful_timeout": graceful_timeout,
        "visibility_timeout": visibility_timeout,
    }
    settings = _settings(ctx)
    db = settings["database_url"] if settings["db_given"] else None
    code = run_processes(app_path, db, processes, options)
    ctx.exit(code)


def _lanes(text: str | None) -> tuple[list[str] | None, dict[str, int] | None]:
    """``a,b`` (strict order) or ``a:3,b:1`` (weighted) → (queues, weights)."""
    if not text:
        return None, None
    queues: list[str] = []
    weights: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, weight = item.partition(":")
        queues.append(name)
        if sep:
            if not weight.isdigit() or int(weight) < 1:
                _fail(f"--queues: weight of {name!r} must be a positive integer, got {weight!r}")
            weights[name] = int(weight)
    if weights and len(weights) != len(queues):
        _fail("--queues: give a weight to every queue (a:3,b:1) or to none (a,b)")
    return queues, weights or None


def _parse_json(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(f"{what} is not valid JSON: {exc}")
    except RecursionError:
        _fail(f"{what} is nested too deeply (at most {MAX_JSON_DEPTH} levels)")
    if not isinstance(value, dict):
        _fail(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


@cli.command()
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
    job = _app(ctx).send(
        task,
        _parse_json(payload, "--payload"),
        queue=queue,
        delay=delay,
        priority=priority,
        idempotency_key=idempotency_key,
        ordering_key=ordering_key,
        ttl=ttl,
        max_attempts=max_attempts,
        headers=_parse_json(headers, "--headers") if headers else None,
    )
    if as_json:
        _dump({"id": str(job.id)})
    else:
        click.echo(str(job.id))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Per queue: pending, scheduled, processing, completed, dead, expired, oldest pending age."""
    rows = _app(ctx).backend.queues_stats(QueuesStatsParams(datetime.now(UTC)))
    if as_json:
        _dump([{name: getattr(r, name) for name in r.__slots__} for r in rows])
        return
    table = Table(title="Conveyor queues")
    for column in (
        "queue",
        "pending",
        "scheduled",
        "processing",
        "completed",
        "dead",
        "expired",
        "oldest pending",
    ):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for r in rows:
        age = "-" if r.oldest_pending_age is None else f"{r.oldest_pending_age:.1f}s"
        table.add_row(
            _cell(r.queue),
            str(r.pending),
            str(r.scheduled),
            str(r.processing),
            str(r.completed),
            str(r.dead),
            str(r.expired),
            age,
        )
    console.print(table)


def _status(app: App, job_id: str) -> JobStatus:
    try:
        return app.job(job_id)
    except JobNotFoundError as exc:
        _fail(str(exc))


def _print_status(status: JobStatus) -> None:
    data = status.to_json()
    error = data.pop("error")
    for key, value in data.items():
        click.echo(f"{key:>16}: {json.dumps(value) if isinstance(value, dict) else _printable(value)}")
    if error:
        click.echo(f"{'error':>16}: {_printable(error['type'])}: {_printable(error['message'], multiline=True)}")
        if error["traceback"]:
            click.echo(_printable(error["traceback"].rstrip(), multiline=True))


@cli.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job: state, attempts, result or error."""
    status = _status(_app(ctx), job_id)
    if as_json:
        _dump(status.to_json())
    else:
        _print_status(status)


# -- dead letters ------------------------------------------------------------------------------


@cli.group()
def dlq() -> None:
    """Inspect, replay and purge dead letters."""


def _record_row(r: JobRecord) -> dict[str, Any]:
    return {
        "id": str(r.id),
        "queue": r.queue,
        "task": r.task,
        "attempts": r.attempts,
        "deliveries": r.deliveries,
        "failed_at": r.finished_at.isoformat() if r.finished_at else None,
        "reason": r.reason,
        "error_type": r.error_type,
        "error_message": r.error_message,
        "idempotency_key": r.idempotency_key,
    }


def _dead_all(app: App, queue: str | None, task: str | None, error_type: str | None) -> list[JobRecord]:
    rows: list[JobRecord] = []
    while True:
        page = app.backend.dead_list(DeadListParams(queue, task, error_type, limit=1000, offset=len(rows)))
        rows.extend(page)
        if len(page) < 1000:
            return rows


@dlq.command("list")
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--error-type", default=None)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, _MAX_LIMIT))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_list(
    ctx: click.Context, queue: str | None, task: str | None, error_type: str | None, limit: int, as_json: bool
) -> None:
    """List dead letters, newest first."""
    rows = _app(ctx).backend.dead_list(DeadListParams(queue, task, error_type, limit=limit))
    if as_json:
        _dump([_record_row(r) for r in rows])
        return
    table = Table(title=f"Dead letters ({len(rows)} shown; details: conveyor dlq show ID)")
    for column in ("id", "queue", "task", "attempts", "reason", "error"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=36 if column == "id" else None)
    for r in rows:
        table.add_row(
            str(r.id),
            _cell(r.queue),
            _cell(r.task.rsplit(".", 1)[-1]),
            str(r.attempts),
            _cell(r.reason or ""),
            _cell(r.error_type or ""),
        )
    console.print(table)


@dlq.command("show")
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one dead letter in full (payload, headers, error, traceback)."""
    status = _status(_app(ctx), job_id)
    if status.state != "dead":
        _fail(f"job {job_id} is {status.state}, not a dead letter")
    if as_json:
        _dump(status.to_json())
    else:
        _print_status(status)


def _select(
    app: App, ids: Sequence[str], all_: bool, queue: str | None, task: str | None, error_type: str | None
) -> list[UUID]:
    if ids and all_:
        _fail("give job ids or --all, not both")
    if not ids and not all_:
        _fail("give one or more job ids, or --all with --queue")
    if all_:
        if not queue:
            _fail("--all needs --queue (replaying or purging every queue at once is too easy a mistake)")
        return [r.id for r in _dead_all(app, queue, task, error_type)]
    out: list[UUID] = []
    for raw in ids:
        try:
            out.append(UUID(raw))
        except ValueError:
            _fail(f"not a job id: {raw!r}")
    return out


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        return f"{getpass.getuser()}@cli"
    except (KeyError, OSError):
        return "cli"


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
    type=_FiniteFloat(0, 1_000_000, min_open=True),
    help="At most N jobs per second, so that a big replay cannot flood the workers.",
)
@click.option("--actor", default=None, help="Who (default: the OS user).")
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
    actor: str | None,
    as_json: bool,
) -> None:
    """Re-enqueue dead letters to their source queue with fresh attempts (audited)."""
    app = _app(ctx)
    selected = _select(app, ids, all_, queue, task, error_type)
    chunk = max(1, int(rate)) if rate else 500
    pairs: list[tuple[UUID, UUID]] = []
    with Progress(console=Console(stderr=True), transient=True, disable=as_json) as progress:
        bar = progress.add_task("replaying", total=len(selected))
        for start in range(0, len(selected), chunk):
            began = time.monotonic()
            part = selected[start : start + chunk]
            params = DeadReplayParams([(d, uuid7()) for d in part], _actor(actor), reason, datetime.now(UTC))
            pairs.extend(app.backend.dead_replay_many(params))
            progress.advance(bar, len(part))
            if rate and start + chunk < len(selected):
                time.sleep(max(0.0, len(part) / rate - (time.monotonic() - began)))
    if as_json:
        _dump([{"dead_id": str(d), "new_id": str(n)} for d, n in pairs])
    else:
        click.echo(f"replayed {len(pairs)} of {len(selected)} dead letter(s)")
    if len(pairs) < len(selected) and not all_:
        skipped = len(selected) - len(pairs)
        click.echo(f"{skipped} id(s) were not unreplayed dead letters and were skipped", err=True)


@dlq.command("purge")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "all_", is_flag=True, help="Every dead letter of --queue (narrow with --task/--error-type).")
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--error-type", default=None)
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@click.option("--actor", default=None, help="Who (default: the OS user).")
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
    actor: str | None,
    yes: bool,
) -> None:
    """Delete dead letters for good (audited). Asks first, unless --yes; without a terminal to ask
    on (a script, a pipe, cron) it refuses to purge without --yes."""
    if not yes and not sys.stdin.isatty():
        _fail("dlq purge deletes dead letters for good and there is no terminal to confirm it on: pass --yes")
    app = _app(ctx)
    selected = _select(app, ids, all_, queue, task, error_type)
    if not yes:
        click.confirm(f"purge {len(selected)} dead letter(s) for good?", abort=True)
    purged = app.backend.dead_purge_many(DeadPurgeParams(selected, _actor(actor), reason, datetime.now(UTC)))
    click.echo(f"purged {purged} dead letter(s)")


@cli.command()
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, _MAX_LIMIT))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def audit(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Operator actions (replays, purges), newest first."""
    from conveyor.backends.base import AuditListParams

    entries = _app(ctx).backend.audit_list(AuditListParams(limit))
    if as_json:
        _dump(
            [
                {
                    "id": e.id,
                    "at": e.at.isoformat(),
                    "actor": e.actor,
                    "action": e.action,
                    "reason": e.reason,
                    "job_ids": [str(j) for j in e.job_ids],
                    "details": json.loads(e.details or "{}"),
                }
                for e in entries
            ]
        )
        return
    table = Table(title="Audit log")
    for column in ("at", "actor", "action", "jobs", "reason"):
        table.add_column(column)
    for e in entries:
        table.add_row(
            e.at.strftime("%Y-%m-%d %H:%M:%S"), _cell(e.actor), _cell(e.action), str(len(e.job_ids)), _cell(e.reason)
        )
    console.print(table)


# -- schedules ---------------------------------------------------------------------------------


@cli.group()
def schedules() -> None:
    """List, add, change, pause and resume periodic schedules (workers pick changes up live)."""


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedules_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule with its next tick."""
    rows = _app(ctx).backend.schedules_list()
    if as_json:
        _dump(
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
            _cell(s.name),
            _cell(s.cron),
            _cell(s.task),
            _cell(s.queue),
            "paused" if s.paused else "active",
            s.next_run_at.strftime("%Y-%m-%d %H:%M"),
            s.last_run_at.strftime("%Y-%m-%d %H:%M") if s.last_run_at else "-",
        )
    console.print(table)


def _cron(expression: str) -> Any:
    from conveyor._cron import Cron

    return Cron.parse(expression)


@schedules.command("add")
@click.argument("name")
@click.option("--cron", "expression", required=True, help='Five cron fields, UTC (e.g. "*/5 * * * *").')
@click.option("--task", required=True)
@click.option("--queue", default=None, help="Queue of its jobs (default: the task's queue with --app, else default).")
@click.option("--payload", default="{}", show_default=True, help="A JSON object.")
@click.option("--priority", default=0, show_default=True, type=int)
@click.pass_context
def schedules_add(
    ctx: click.Context, name: str, expression: str, task: str, queue: str | None, payload: str, priority: int
) -> None:
    """Add (or redefine) a schedule at runtime."""
    schedule = _app(ctx).add_schedule(
        name, expression, task, queue=queue, payload=_parse_json(payload, "--payload"), priority=priority
    )
    click.echo(
        f"schedule {_printable(schedule.name)}: {schedule.cron} -> {_printable(schedule.task)} on "
        f"{_printable(schedule.queue)}, next tick {schedule.next_run_at.isoformat()}"
    )


def _update(ctx: click.Context, name: str, **changes: Any) -> None:
    from conveyor.backends.base import SchedulesUpdateParams

    if not _app(ctx).backend.schedules_update(SchedulesUpdateParams(name, **changes)):
        _fail(f"no schedule named {name!r}")


@schedules.command("pause")
@click.argument("name")
@click.pass_context
def schedules_pause(ctx: click.Context, name: str) -> None:
    """Stop firing a schedule until it is resumed."""
    _update(ctx, name, paused=True)
    click.echo(f"schedule {_printable(name)} paused")


@schedules.command("resume")
@click.argument("name")
@click.pass_context
def schedules_resume(ctx: click.Context, name: str) -> None:
    """Fire a paused schedule again (from its next tick after now; missed ticks are not fired)."""
    schedule = next((s for s in _app(ctx).backend.schedules_list() if s.name == name), None)
    if schedule is None:
        _fail(f"no schedule named {name!r}")
    _update(ctx, name, paused=False, next_run_at=_cron(schedule.cron).next_after(datetime.now(UTC)))
    click.echo(f"schedule {_printable(name)} resumed")


@schedules.command("set")
@click.argument("name")
@click.option("--cron", "expression", required=True, help="The new cron expression.")
@click.pass_context
def schedules_set(ctx: click.Context, name: str, expression: str) -> None:
    """Change a schedule's cron expression."""
    cron = _cron(expression)
    _update(ctx, name, cron=cron.expression, next_run_at=cron.next_after(datetime.now(UTC)))
    click.echo(f"schedule {_printable(name)}: {cron.expression}")


@schedules.command("remove")
@click.argument("name")
@click.pass_context
def schedules_remove(ctx: click.Context, name: str) -> None:
    """Delete a schedule (a worker whose app still declares it adds it back when it starts)."""
    from conveyor.backends.base import SchedulesDeleteParams

    if not _app(ctx).backend.schedules_delete(SchedulesDeleteParams(name)):
        _fail(f"no schedule named {name!r}")
    click.echo(f"schedule {_printable(name)} removed")


# -- topics ------------------------------------------------------------------------------------


@cli.group()
def topics() -> None:
    """Fan-out topics: list, subscribe and unsubscribe queues."""


@topics.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def topics_list(ctx: click.Context, as_json: bool) -> None:
    """Every topic with its subscriptions."""
    from conveyor.backends.base import SubscriptionsListParams

    rows = _app(ctx).backend.subscriptions_list(SubscriptionsListParams())
    if as_json:
        _dump([{"topic": r.topic, "queue": r.queue, "task": r.task, "filter": json.loads(r.filter)} for r in rows])
        return
    table = Table(title="Topics and subscriptions")
    for column in ("topic", "queue", "task", "filter"):
        table.add_column(column)
    for r in rows:
        table.add_row(_cell(r.topic), _cell(r.queue), _cell(r.task), _cell(r.filter))
    console.print(table)


@topics.command("subscribe")
@click.argument("topic")
@click.argument("queue")
@click.option("--task", required=True, help="The task that handles the copies on QUEUE.")
@click.option("--filter", "filter_", default=None, help='Header conditions, e.g. \'{"region": {"in": ["eu"]}}\'.')
@click.pass_context
def topics_subscribe(ctx: click.Context, topic: str, queue: str, task: str, filter_: str | None) -> None:
    """Bind QUEUE to TOPIC."""
    sub = _app(ctx).subscribe(topic, queue, task, _parse_json(filter_, "--filter") if filter_ else None)
    click.echo(f"{_printable(topic)} -> {_printable(sub.queue)} ({_printable(sub.task)}) filter {sub.filter}")


@topics.command("unsubscribe")
@click.argument("topic")
@click.argument("queue")
@click.pass_context
def topics_unsubscribe(ctx: click.Context, topic: str, queue: str) -> None:
    """Remove QUEUE's subscription to TOPIC."""
    if not _app(ctx).unsubscribe(topic, queue):
        _fail(f"queue {queue!r} is not subscribed to {topic!r}")
    click.echo(f"{_printable(queue)} unsubscribed from {_printable(topic)}")


@cli.command()
@click.argument("topic")
@click.option("--payload", default="{}", show_default=True, help="A JSON object.")
@click.option("--headers", default=None, help="A JSON object (subscription filters match on these).")
@click.option("--json", "as_json", is_flag=True, help="Print the job ids as JSON.")
@click.pass_context
def publish(ctx: click.Context, topic: str, payload: str, headers: str | None, as_json: bool) -> None:
    """Publish to TOPIC: one job per matching subscription, in one transaction."""
    jobs = _app(ctx).publish(
        topic, _parse_json(payload, "--payload"), headers=_parse_json(headers, "--headers") if headers else None
    )
    if as_json:
        _dump([str(j.id) for j in jobs])
    else:
        click.echo(f"published to {len(jobs)} subscription(s)")


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["md", "json", "yaml"]), default="md", show_default=True)
@click.pass_context
def contract(ctx: click.Context, fmt: str) -> None:
    """Print every queue's declared policy and every topic's subscriptions: the queue contract
    (with --app, the App's declared queues and tasks too)."""
    from conveyor._contract import build, render

    click.echo(render(build(_app(ctx)), fmt), nl=False)


def _mount_pipeline() -> None:
    """Mount the Spark pipeline commands when their extra is installed."""
    try:
        from conveyor.pipeline.cli import export, pipeline
    except ImportError:
        return
    cli.add_command(export)
    cli.add_command(pipeline)


_mount_pipeline()
_accept_global_options(cli)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the CLI; user errors end in one line on stderr and exit code 1 or 2."""
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="conveyor", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("conveyor: aborted", err=True)
        return 1
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        hint = (
            f" (see 'conveyor {exc.ctx.command_path.partition(' ')[2]} --help')".replace("  ", " ")
            if exc.ctx is not None
            else ""
        )
        click.echo(f"conveyor: error: {_printable(exc.format_message())}{hint}", err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"conveyor: error: {_printable(exc.format_message())}", err=True)
        return exc.exit_code
    except ConveyorError as exc:
        first, *_ = str(exc).strip().splitlines() or [type(exc).__name__]
        click.echo(f"conveyor: error: {_printable(first)}", err=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
