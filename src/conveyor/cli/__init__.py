"""The ``conveyor`` command line: a presenter over the producer API and the operator API (``app.admin``).

Every error the user can cause ends in one line on stderr and a non-zero exit, never a traceback.
One module per group of commands; none of them touches the storage seam."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from conveyor._errors import ConveyorError, exit_code, first_line, printable
from conveyor.cli._common import configure_logging, settings
from conveyor.cli.dlq import audit, dlq
from conveyor.cli.jobs import contract, job, migrate, publish, send, stats
from conveyor.cli.monitor import alerts, workers
from conveyor.cli.scale import scale
from conveyor.cli.schedules import schedules
from conveyor.cli.serve import serve
from conveyor.cli.tokens import tokens
from conveyor.cli.topics import topics
from conveyor.cli.worker import worker

_DB_HELP = "Database URL (default: $CONVEYOR_DATABASE_URL, else the embedded sqlite:///conveyor.db)."
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
    default=None,
    help=_DB_HELP,
)
@click.option("--app", "app_path", metavar="MODULE:ATTR", envvar="CONVEYOR_APP", default=None, help=_APP_HELP)
@click.option("-v", "--verbose", count=True, help=_VERBOSE_HELP)
@click.pass_context
def cli(ctx: click.Context, database_url: str | None, app_path: str | None, verbose: int) -> None:
    """Conveyor: a durable, at-least-once task queue on SQL.

    --db, --app and -v may be given before or after the command (conveyor migrate --db URL)."""
    source = ctx.get_parameter_source("database_url")
    settings(ctx).update(
        database_url=database_url,
        db_given=source is not None and source.name != "DEFAULT",
        db_from_env=source is not None and source.name == "ENVIRONMENT",
        app_path=app_path,
        verbose=verbose,
    )
    configure_logging(verbose)


def _set_db(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        settings(ctx).update(database_url=value, db_given=True, db_from_env=False)


def _set_app(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        settings(ctx)["app_path"] = value


def _add_verbose(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    if value:
        found = settings(ctx)
        found["verbose"] = found.get("verbose", 0) + value
        configure_logging(found["verbose"])


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


for _command in (
    migrate,
    worker,
    serve,
    tokens,
    send,
    stats,
    job,
    dlq,
    audit,
    schedules,
    topics,
    publish,
    contract,
    workers,
    alerts,
    scale,
):
    cli.add_command(_command)


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
    """Entry point: run the CLI; user errors end in one line on stderr and exit code 1 or 2 (74, EX_IOERR, for
    a damaged database)."""
    _tolerant_output()
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
        click.echo(f"conveyor: error: {printable(exc.format_message())}{hint}", err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"conveyor: error: {printable(exc.format_message())}", err=True)
        return exc.exit_code
    except ConveyorError as exc:
        click.echo(f"conveyor: error: {printable(first_line(exc))}", err=True)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    return result if isinstance(result, int) else 0


def _tolerant_output() -> None:
    """Output that cannot be encoded (a table's "…" on an ASCII terminal, PYTHONIOENCODING=ascii) is
    escaped rather than a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (stream.encoding or "").lower().replace("-", "") != "utf8":
            reconfigure(errors="backslashreplace")


if __name__ == "__main__":
    sys.exit(main())
