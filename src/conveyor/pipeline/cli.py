"""Command line of the pipeline: ``conveyor export`` and ``conveyor pipeline report|reconcile|enqueue``.

Mounted into the main ``conveyor`` CLI, and runnable alone as ``python -m conveyor.pipeline``. Bad
input ends in one line on stderr and a non-zero exit, never a traceback. Importing this module does
not import Spark: the commands do, when they run.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.table import Column, Table

from conveyor._errors import ConveyorError, first_line, printable
from conveyor.backends import DEFAULT_DATABASE_URL
from conveyor.pipeline.spark import DEFAULT_MASTER

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from conveyor import App
    from conveyor.pipeline._input import InputFiles

F = TypeVar("F", bound=Callable[..., Any])

console = Console(stderr=True)
out = Console()

_db_option = click.option(
    "--db",
    "db",
    default=None,
    help="Database URL (default: the --db of `conveyor`, else $CONVEYOR_DATABASE_URL, else sqlite:///conveyor.db).",
)


def _check_master(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a master URL Spark cannot take before anything runs (a usage error, one line)."""
    if value is None:
        return None
    from conveyor.pipeline.errors import PipelineError
    from conveyor.pipeline.spark import check_master

    try:
        return check_master(value)
    except PipelineError as exc:
        raise click.BadParameter(printable(str(exc).removeprefix("--master ")), ctx, param) from None


_master_option = click.option(
    "--master",
    default=None,
    callback=_check_master,
    help=f"Spark master URL: local[N], spark://host:7077, yarn, k8s://... (default: {DEFAULT_MASTER}, or the "
    "one spark-submit was given).",
)
_sla_options = [
    click.option(
        "--sla",
        "sla",
        multiple=True,
        metavar="QUEUE=SECONDS",
        help="A queue's SLA: the longest acceptable wait before a job starts (repeatable).",
    ),
    click.option(
        "--default-sla",
        default="300",
        show_default=True,
        help="SLA in seconds for queues without --sla (or a declared SLA with --app).",
    ),
    click.option(
        "--app",
        "app_path",
        default=None,
        metavar="MODULE:APP",
        help="Your App (default: the --app of `conveyor`): each queue's declared SLA and max_depth are used; "
        "--sla flags override them.",
    ),
]


def _with_sla(fn: F) -> F:
    for option in reversed(_sla_options):
        fn = option(fn)
    return fn


def _resolve_slas(
    ctx: click.Context, sla: tuple[str, ...], default_sla: str, app: App | None
) -> tuple[dict[str, timedelta], timedelta, dict[str, int]]:
    """Per-queue SLAs, the default SLA and the declared max_depths: the App's declarations (own
    --app, else the --app of `conveyor`), overridden by --sla flags. Raises PipelineError."""
    from conveyor.pipeline._sla import declared, parse_sla, sla_micros

    slas, depths = declared(app) if app is not None else ({}, {})
    slas.update(parse_sla(list(sla)))
    default_us = sla_micros(default_sla, "--default-sla")
    return (
        {q: timedelta(microseconds=us) for q, us in slas.items()},
        timedelta(microseconds=default_us),
        depths,
    )


def _load_app(ctx: click.Context, app_path: str | None) -> App | None:
    """The App named by the command's --app, else by the --app of `conveyor`, else None. Only its
    declarations are read; it opens no connection the command would keep."""
    if app_path:
        from conveyor.worker.supervisor import load_app

        app = load_app(app_path)
        ctx.call_on_close(app.close)
        return app
    root = ctx.find_root()
    if root is not ctx and isinstance(root.obj, dict) and root.obj.get("app_path"):
        from conveyor.cli._common import app_of

        return app_of(ctx, database=False)  # the main CLI's --app, loaded on first use: its declarations
    return None


def _resolve_db(ctx: click.Context, db: str | None) -> tuple[str, bool]:
    """The database URL to use and whether the user named one (own --db, the parent's --db, or env)."""
    if db:
        return db, True
    parent = ctx.find_root()
    if parent is not ctx and isinstance(parent.obj, dict) and parent.obj.get("database_url"):
        source = parent.get_parameter_source("database_url")
        explicit = source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")
        return str(parent.obj["database_url"]), explicit
    env = os.environ.get("CONVEYOR_DATABASE_URL")
    if env:
        return env, True
    return DEFAULT_DATABASE_URL, False


def _user_errors(fn: F) -> F:
    """Turn pipeline and Spark input errors into one-line click errors, without passwords.

    While the command runs, log lines are masked too (:mod:`conveyor.pipeline._secrets`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from conveyor.pipeline._secrets import redact, redacted_logs

        urls = _known_urls(kwargs)
        try:
            with redacted_logs(*urls):
                return fn(*args, **kwargs)
        except click.UsageError:
            raise
        except click.ClickException as exc:
            raise click.ClickException(printable(redact(exc.format_message(), *urls))) from None
        except ConveyorError as exc:
            raise click.ClickException(printable(redact(first_line(exc), *urls))) from None
        except Exception as exc:
            # Spark reports bad input (an unreadable file, a type it cannot cast) as its own
            # exceptions; those are user errors too. Anything else is a bug and keeps its traceback.
            module = type(exc).__module__
            if module.startswith(("pyspark", "py4j")):
                raise click.ClickException(printable(redact(f"Spark: {first_line(exc)}", *urls))) from None
            raise

    return wrapper  # type: ignore[return-value]


def _known_urls(kwargs: dict[str, Any]) -> list[str]:
    """Every database URL a command may have been given (its options, the parent's --db, the env)."""
    urls = [str(kwargs[k]) for k in ("db", "business") if kwargs.get(k)]
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    if root is not None and isinstance(root.obj, dict) and root.obj.get("database_url"):
        urls.append(str(root.obj["database_url"]))
    if os.environ.get("CONVEYOR_DATABASE_URL"):
        urls.append(os.environ["CONVEYOR_DATABASE_URL"])
    return urls


class _Number(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A finite number within bounds: NaN, infinity and out-of-range values are one-line errors."""

    name = "number"

    def __init__(self, low: float, high: float, unit: str = "") -> None:
        self.low, self.high, self.unit = low, high, unit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (math.isfinite(number) and self.low <= number <= self.high):
            self.fail(f"{value!r} must be a finite number from {self.low:g} to {self.high:g}{self.unit}", param, ctx)
        return number


def _session(master: str | None, jars: list[str] | None = None) -> SparkSession:
    from conveyor.pipeline._progress import RichStages
    from conveyor.pipeline.spark import get_session

    # PySpark logs every failed query as a JSON blob with a Java stack trace; the command already
    # reports the error in one line.
    logging.getLogger("DataFrameQueryContextLogger").setLevel(logging.CRITICAL)
    with RichStages(console=console).stage(f"starting Spark ({master or 'default master'})"):
        return get_session(master, jars=jars or [])


@click.command("export")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Export directory.")
@click.option("--include-live", is_flag=True, help="Also write a snapshot of live (pending, processing) jobs.")
@click.option(
    "--settle",
    type=_Number(0, 86_400, " seconds"),
    default=5.0,
    show_default=True,
    help="Leave jobs that ended less than this many seconds ago for the next run.",
)
@click.option(
    "--via",
    type=click.Choice(["auto", "seam", "jdbc"]),
    default="auto",
    show_default=True,
    help="How to read the archive: with Spark over JDBC (PostgreSQL; needs libpostgresql-jdbc-java), through "
    "Conveyor's storage seam (every database), or auto: JDBC where it can run and the run has at least "
    "1,000,000 new rows (where it is measured faster), else the seam.",
)
@click.option(
    "--jdbc-partitions",
    type=click.IntRange(1, 10_000),
    default=None,
    help="With --via jdbc: slices of finished_at read in parallel (default: Spark's parallelism).",
)
@_master_option
@_db_option
@click.pass_context
@_user_errors
def export(
    ctx: click.Context,
    out_dir: str,
    include_live: bool,
    settle: float,
    via: str,
    jdbc_partitions: int | None,
    master: str | None,
    db: str | None,
) -> None:
    """Export the job archive incrementally to Parquet, partitioned by date and queue.

    Re-running resumes from the watermark stored in the directory and never duplicates a row."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from conveyor.pipeline.export import export as run_export

    url, _ = _resolve_db(ctx, db)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("exporting archive: 0 rows", total=None)
        result = run_export(
            url,
            out_dir,
            include_live=include_live,
            settle_seconds=settle,
            progress=lambda n: bar.update(task, description=f"exporting archive: {n:,} rows"),
            via=via,
            master=master,
            jdbc_partitions=jdbc_partitions,
        )
    live = f", live snapshot {result.live_rows:,} jobs" if include_live else ""
    out.print(
        f"export run {result.run} (via {result.via}): {result.archive_rows:,} new archive rows "
        f"({result.watermark.archive_rows:,} in total){live}, {result.files} files -> {shown(str(result.out_dir))}"
    )


@click.group("pipeline")
def pipeline() -> None:
    """Spark jobs over the job history: report, reconcile, bulk enqueue."""


@pipeline.command("report")
@click.option("--input", "input_dir", required=True, type=click.Path(), help="An export directory.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--since", default=None, help="Only jobs that ended since: 2026-01-31, 2026-01-31T12:00, 24h, 7d.")
@_with_sla
@_master_option
@click.pass_context
@_user_errors
def report(
    ctx: click.Context,
    input_dir: str,
    out_dir: str,
    since: str | None,
    sla: tuple[str, ...],
    default_sla: str,
    app_path: str | None,
    master: str | None,
) -> None:
    """Throughput, depth, latency, SLA, failures and a capacity plan, as Parquet tables and report.html."""
    from conveyor.pipeline._html import queue_label
    from conveyor.pipeline._outdir import claim_dir
    from conveyor.pipeline._progress import RichStages
    from conveyor.pipeline.export import input_paths
    from conveyor.pipeline.report import REPORT_MARKER, parse_since
    from conveyor.pipeline.report import report as run_report

    # Everything that can be checked without Spark is checked first: starting it takes seconds.
    input_paths(input_dir)
    slas, default, depths = _resolve_slas(ctx, sla, default_sla, _load_app(ctx, app_path))
    since_at = parse_since(since) if since else None
    claim_dir(out_dir, REPORT_MARKER, "a report", legacy=("summary.json", "report.html"))
    spark = _session(master)
    result = run_report(
        input_dir,
        out_dir,
        since=since_at,
        sla=slas,
        default_sla=default,
        declared_max_depth=depths,
        spark=spark,
        stages=RichStages(spark, console),
    )
    table = Table("jobs", "dead", "wait p95 s", "e2e p95 s", "SLA s", "breaches", "workers", "HWM")
    # Queue names are folded, never cut: a name is what the operator acts on.
    table.columns.insert(0, Column("queue", overflow="fold"))
    for queue, q in result.summary["queues"].items():
        table.add_row(
            shown(queue_label(queue)),
            f"{q.get('jobs', 0):,}",
            f"{q.get('dead', 0):,}",
            _num(q.get("wait_p95_s")),
            _num(q.get("e2e_p95_s")),
            _num(q.get("sla_s")),
            f"{q.get('sla_breaches', 0):,}",
            str(q.get("suggested_workers", "-")),
            str(q.get("high_water_mark", "-")),
        )
    out.print(table)
    out.print(f"report: {shown(str(Path(out_dir) / 'report.html'))} (tables and summary.json beside it)")


@pipeline.command("reconcile")
@click.option("--business", required=True, help="Business table: Parquet/CSV path, or a jdbc: URL.")
@click.option("--business-table", default=None, help="Table (or subquery) to read from a jdbc: URL.")
@click.option("--key-column", required=True, help="Column holding the idempotency key (or job id).")
@click.option("--status-column", required=True, help="Column holding the business status.")
@click.option(
    "--key-kind",
    type=click.Choice(["idempotency_key", "job_id"]),
    default="idempotency_key",
    show_default=True,
    help="What the key column holds.",
)
@click.option(
    "--pending-status",
    "pending_statuses",
    multiple=True,
    default=("pending",),
    show_default=True,
    help="A business status meaning 'not done yet' (repeatable, case-insensitive).",
)
@click.option(
    "--settled-status",
    "settled_statuses",
    multiple=True,
    help="A business status meaning 'done' (repeatable, case-insensitive). Given, a status in neither list is "
    "counted as 'no status' instead of settled.",
)
@click.option("--export-dir", default=None, type=click.Path(file_okay=False), help="Export to read (and refresh).")
@click.option("--queue", default=None, help="Only jobs of this queue; the queue lost records are requeued to.")
@click.option("--task", default=None, help="Task of requeued jobs.")
@click.option("--payload-column", "payload_columns", multiple=True, help="Business column to add to the payload.")
@click.option("--requeue-lost", is_flag=True, help="Re-enqueue lost records with their key as idempotency key.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), help="Write the per-record table.")
@_with_sla
@_db_option
@_master_option
@click.pass_context
@_user_errors
def reconcile(
    ctx: click.Context,
    business: str,
    business_table: str | None,
    key_column: str,
    status_column: str,
    key_kind: str,
    pending_statuses: tuple[str, ...],
    settled_statuses: tuple[str, ...],
    export_dir: str | None,
    queue: str | None,
    task: str | None,
    payload_columns: tuple[str, ...],
    requeue_lost: bool,
    out_dir: str | None,
    sla: tuple[str, ...],
    default_sla: str,
    app_path: str | None,
    db: str | None,
    master: str | None,
) -> None:
    """Classify every business record: ok, lost, stuck, dead, done_not_recorded."""
    from conveyor.pipeline.reconcile import reconcile as run_reconcile
    from conveyor.pipeline.spark import jdbc_jars

    url, explicit = _resolve_db(ctx, db)
    # With only --export-dir the export is read as it is; a named database is exported first.
    database_url = url if (explicit or export_dir is None or requeue_lost) else None
    app = _load_app(ctx, app_path)
    slas, default, _ = _resolve_slas(ctx, sla, default_sla, app)
    if not business.startswith("jdbc:") and not Path(business).exists():
        raise click.UsageError(f"--business {business}: no such file or directory")
    if export_dir is not None and database_url is None and not Path(export_dir).is_dir():
        raise click.UsageError(f"--export-dir {export_dir}: no such directory")
    # Everything that can be checked without Spark is checked first: starting it takes seconds.
    if requeue_lost:
        if queue is None or task is None:
            raise click.UsageError("--requeue-lost needs --queue and --task")
        from conveyor.pipeline.enqueue import check_target

        check_target(url, queue, task)
    elif database_url is not None:
        from conveyor.pipeline.export import check_database

        check_database(database_url)
    biz_input = None
    if not business.startswith("jdbc:"):
        from conveyor.pipeline.reconcile import check_business

        # Listed, CSV checked (UTF-8, headers) and the columns named found, before Spark starts.
        biz_input = check_business(business, key_column, status_column, payload_columns)
        _print_skipped(biz_input[0])
    spark = _session(master, jdbc_jars(business) if business.startswith("jdbc:") else [])
    from conveyor.pipeline._input import read_input
    from conveyor.pipeline._progress import RichStages
    from conveyor.pipeline.reconcile import log as reconcile_log

    # The command prints the result's warnings itself (after the counts): the copy reconcile logs for
    # Python callers would reach stderr a second time (through logging's last-resort handler).
    with RichStages(spark, console).stage("reconciling"), _silenced(reconcile_log):
        result = run_reconcile(
            business if biz_input is None else read_input(spark, *biz_input),
            key_column,
            status_column,
            database_url,
            export_dir=export_dir,
            key_kind=key_kind,  # type: ignore[arg-type]
            pending_statuses=pending_statuses,
            settled_statuses=settled_statuses or None,
            queue=queue,
            sla=slas,
            default_sla=default,
            out_dir=out_dir,
            requeue_lost=requeue_lost,
            task=task,
            payload_columns=payload_columns,
            business_table=business_table,
            spark=spark,
            app=app,
        )
    table = Table("class", "records")
    for name, count in result.counts.items():
        table.add_row(name, f"{count:,}")
    out.print(table)
    out.print(f"queue state as of {result.snapshot_at.isoformat()}")
    for warning in result.warnings:
        console.print(f"warning: {shown(warning)}")
    if result.no_key:
        out.print(
            f"no key: {result.no_key:,} records have no usable {shown(key_column)} (null, NaN or empty): "
            "they match no job and are never requeued"
        )
    if result.no_status:
        which = (
            "null, empty or in neither --pending-status nor --settled-status" if settled_statuses else "null or empty"
        )
        out.print(
            f"no status: {result.no_status:,} records have a key but no usable {shown(status_column)} ({which}): "
            "neither pending nor settled, never requeued"
        )
    if result.lost_keys:
        keys = ", ".join(shown(k) for k in result.lost_keys[:10]) + (" ..." if len(result.lost_keys) > 10 else "")
        out.print(f"lost: {keys}")
    if requeue_lost:
        left = f"; {result.not_requeued:,} left out: see the warning" if result.not_requeued else ""
        out.print(
            f"requeued {result.requeued:,} lost records ({result.already_queued:,} keys were already queued{left})"
        )
    if out_dir:
        out.print(f"per-record table: {shown(str(Path(out_dir) / 'reconcile'))}")


@pipeline.command("enqueue")
@click.option("--input", "input_path", required=True, type=click.Path(), help="Parquet or CSV file or directory.")
@click.option("--queue", required=True, help="Queue to enqueue onto.")
@click.option("--task", required=True, help="Task name of the jobs.")
@click.option("--key-column", default=None, help="Column to use as idempotency key (default: a hash of the row).")
@click.option("--payload-column", "payload_columns", multiple=True, help="Payload column (default: all).")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=500, show_default=True)
@click.option(
    "--priority", type=click.IntRange(-(2**31), 2**31 - 1), default=None, help="Job priority (default: the task's)."
)
@click.option(
    "--app",
    "app_path",
    default=None,
    metavar="MODULE:APP",
    help="Your App (default: the --app of `conveyor`): the queue's declared max_depth (backpressure) and "
    "dedup window apply to the sends.",
)
@_db_option
@_master_option
@click.pass_context
@_user_errors
def enqueue(
    ctx: click.Context,
    input_path: str,
    queue: str,
    task: str,
    key_column: str | None,
    payload_columns: tuple[str, ...],
    batch_size: int,
    priority: int | None,
    app_path: str | None,
    db: str | None,
    master: str | None,
) -> None:
    """Enqueue one job per input row from the Spark executors; re-runs and task retries enqueue nothing twice."""
    from conveyor.pipeline._input import csv_headers, known_columns, list_input, read_input
    from conveyor.pipeline._progress import RichStages
    from conveyor.pipeline.enqueue import check_columns, check_target, enqueue_dataframe

    url, _ = _resolve_db(ctx, db)
    if not Path(input_path).exists():
        raise click.UsageError(f"--input {input_path}: no such file or directory")
    # Everything that can be checked without Spark is checked first: starting it takes seconds.
    check_target(url, queue, task)
    app = _load_app(ctx, app_path)
    # The files are listed, CSV checked (UTF-8, headers) and the columns named checked against the
    # headers or Parquet schemas before Spark starts: that takes seconds.
    files = list_input(input_path)
    _print_skipped(files)
    headers = csv_headers(files) if files.format == "csv" else None
    check_columns(known_columns(files, headers), key_column, payload_columns)
    spark = _session(master)
    df = read_input(spark, files, headers)
    with RichStages(spark, console).stage(f"enqueueing onto {queue}"):
        result = enqueue_dataframe(
            df,
            url,
            queue,
            task,
            key_column=key_column,
            batch_size=batch_size,
            payload_columns=list(payload_columns) or None,
            priority=priority,
            app=app,
        )
    out.print(
        f"{result.rows:,} rows: {result.enqueued:,} jobs enqueued, "
        f"{result.duplicates:,} already queued (same idempotency key)"
    )


@contextlib.contextmanager
def _silenced(logger: logging.Logger) -> Iterator[None]:
    """``logger`` drops its records while the block runs (for what the command prints itself)."""
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


def _print_skipped(files: InputFiles) -> None:
    """Say which files of an input directory are not read (README.txt beside the CSV files)."""
    if files.skipped:
        names = ", ".join(shown(str(p.relative_to(files.path))) for p in files.skipped[:5])
        more = f" and {len(files.skipped) - 5:,} more" if len(files.skipped) > 5 else ""
        console.print(f"skipped {len(files.skipped):,} files that are not {files.format.upper()}: {names}{more}")


def shown(text: str) -> str:
    """``text`` safe to print to a terminal through rich: control, format and surrogate characters
    (NUL, ESC, bidi overrides, bytes that were not UTF-8) become backslash escapes, and rich's
    markup brackets are escaped."""
    from rich.markup import escape

    return escape(printable(text))


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


@click.group("conveyor-pipeline")
def main() -> None:
    """Conveyor's data pipeline (also mounted as `conveyor export` and `conveyor pipeline ...`)."""


main.add_command(export)
for _name, _command in pipeline.commands.items():
    main.add_command(_command, _name)
