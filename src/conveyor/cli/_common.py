"""What every command shares: the global options (--db, --app, -v, on either side of the command),
the App made on first use, one-line errors, and output that is safe to print on a terminal."""

from __future__ import annotations

import getpass
import json
import logging
import math
import sys
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.text import Text

from conveyor._app import App
from conveyor._errors import ConfigurationError, printable
from conveyor._limits import MAX_JSON_DEPTH
from conveyor._stderr import log_to_stderr

console = Console()

#: Most rows a listing prints at once.
MAX_LIMIT = 1_000_000


class CliError(click.ClickException):
    """An error shown to the user as one line."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


class FiniteFloat(click.FloatRange):
    """A FloatRange that also refuses nan and inf (NaN compares false, so it passes every range)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def settings(ctx: click.Context) -> dict[str, Any]:
    """The global options (--db, --app, -v), wherever on the command line they were given."""
    obj: dict[str, Any] = ctx.find_root().ensure_object(dict)
    return obj


def shared(app: App) -> App:
    """``app``, if other processes can reach its database; else the command fails: a private in-memory
    database dies with the command, and what it sent or ran with it (or saw in it) would be lost."""
    if app.in_memory:
        fail(
            f"{app.database_url} is a private in-memory database, which lives and dies with one process: no other "
            "command, worker or service could reach it; give a file (sqlite:///conveyor.db), a PostgreSQL or MySQL URL"
        )
    return app


def given_database(ctx: click.Context, app: App) -> str | None:
    """Point an app module's App at the database --db or $CONVEYOR_DATABASE_URL names, if one does;
    return that URL. An App given its backend on another database fails the command."""
    found = settings(ctx)
    if not found["db_given"]:
        return None
    url: str = found["database_url"]
    try:
        app.database_url = url
    except ConfigurationError as e:
        fail(f"{e} (the URL is $CONVEYOR_DATABASE_URL's)" if found.get("db_from_env") else str(e))
    return url


def app_of(ctx: click.Context, database: bool = True) -> App:
    """The App the command works on, made on first use: by then every --db/--app is parsed,
    including those given after the subcommand. ``database``: the command uses its database, which
    must then be one other processes can reach (see :func:`shared`); False for a command that only
    reads what the App declares (the pipeline's report)."""
    found = settings(ctx)
    app: App | None = found.get("app")
    if app is None:
        if found.get("app_path"):
            from conveyor.worker.supervisor import load_app

            app = load_app(found["app_path"])
            given_database(ctx, app)
        else:
            app = App(found["database_url"])
        found["app"] = app
        ctx.find_root().call_on_close(app.close)
    return shared(app) if database else app


def actor(given: str | None) -> str:
    """Who an audited action is recorded as: ``--actor``, else ``user@cli``."""
    if given:
        return given
    try:
        return f"{getpass.getuser()}@cli"
    except (KeyError, OSError):
        return "cli"


def dump(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def parse_json(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{what} is not valid JSON: {exc}")
    except RecursionError:
        fail(f"{what} is nested too deeply (at most {MAX_JSON_DEPTH} levels)")
    except ValueError:
        # Valid JSON that Python will not read: an integer past its int conversion limit.
        fail(f"{what} holds an integer of more than {sys.get_int_max_str_digits():,} digits")
    if not isinstance(value, dict):
        fail(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def cell(value: object) -> Text:
    """A table cell: printable, and never read as rich markup (a queue named "[red]" stays literal)."""
    return Text(printable(value))


def configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    log_to_stderr(level, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)
    # The connection pool logs every failed attempt; Conveyor's own error says why it gave up, in
    # one line. Its attempts are shown with -v.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR if verbose == 0 else logging.NOTSET)
