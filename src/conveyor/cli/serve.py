"""``conveyor serve``: the HTTP API (Starlette on uvicorn), a presenter over app.admin and the producer API."""

from __future__ import annotations

import ipaddress

import click

from conveyor._errors import BackendError, ConfigurationError, printable
from conveyor._limits import preview
from conveyor.cli._common import FiniteFloat, app_of, fail, settings


def _proxies(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """``--forwarded-allow-ips`` as uvicorn reads it, or a usage error. uvicorn takes an entry that is not an
    address or a network as a literal name, which no TCP peer matches, and ``*`` only alone: a typo, a network
    written with its host bits (``10.0.0.1/8``) or ``*`` in a list trusted no proxy, without a word."""
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if "*" in entries:
        return "*"
    kept = []
    for entry in entries:
        try:
            kept.append(str(ipaddress.ip_network(entry, strict=False) if "/" in entry else ipaddress.ip_address(entry)))
        except ValueError:
            raise click.BadParameter(
                f"{preview(entry)} is not an IP address or network (a.b.c.d, a.b.c.d/nn, an IPv6 one, or '*')"
            ) from None
    return ",".join(kept)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--workers",
    "-w",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Server processes (each with its own group commit); about one per core.",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve WITHOUT bearer tokens: anyone who reaches the port may do anything. Local experiments only.",
)
@click.option(
    "--group-commit/--no-group-commit",
    default=True,
    show_default=True,
    help="Coalesce concurrent single-job sends into one transaction (off: one transaction per request).",
)
@click.option(
    "--token-cache",
    default=5.0,
    show_default=True,
    type=FiniteFloat(0, 3600),
    help="Seconds a token read from the database is trusted (a revoke takes effect within it).",
)
@click.option(
    "--max-body-bytes",
    default=16 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1024, 2**31 - 1),
    help="Largest request body (413 past it); payloads have their own limit (256 KiB by default).",
)
@click.option("--access-log", is_flag=True, help="Log every request (method, path, status; never headers).")
@click.option(
    "--forwarded-allow-ips",
    default="",
    metavar="IPS",
    callback=_proxies,
    help="Believe X-Forwarded-Proto/-For from these proxies (comma-separated addresses or networks; '*': any). "
    "Behind a TLS-terminating proxy the dashboard then sees https: its session cookie gets Secure. Default: none.",
)
@click.option(
    "--alert-interval",
    default=15.0,
    show_default=True,
    type=FiniteFloat(0, 86400),
    help="Seconds between alert evaluations (0: no alerts).",
)
@click.option(
    "--alert",
    "alerts",
    multiple=True,
    metavar="RULE[:QUEUE]=N|RULE=off",
    help="An alert threshold (dlq_depth, oldest_pending_age, depth, no_worker, long_transaction); repeatable.",
)
@click.option("--webhook", "webhooks", multiple=True, metavar="URL", help="POST every alert change here; repeatable.")
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    workers: int,
    insecure_no_auth: bool,
    group_commit: bool,
    token_cache: float,
    max_body_bytes: int,
    access_log: bool,
    forwarded_allow_ips: str,
    alert_interval: float,
    alerts: tuple[str, ...],
    webhooks: tuple[str, ...],
) -> None:
    """Serve the HTTP API: producers send jobs (202, or 429 + Retry-After), operators read queues
    and dead letters with bearer tokens (conveyor tokens create). OpenAPI at /openapi.json."""
    try:
        from conveyor.http import ServiceConfig
        from conveyor.http._factory import NO_AUTH_WARNING, to_environment
        from conveyor.http._serve import listen
        from conveyor.http._serve import serve as run_service
    except ImportError as exc:
        fail(f"conveyor serve needs the http extra: pip install 'conveyor[http]' ({exc})")
    found = settings(ctx)
    app = app_of(ctx)
    # Alert rules and webhooks are checked here, once, so that a bad one is one line and exit 1
    # rather than a service whose processes each fail to start.
    try:
        from conveyor._alerts import AlertRules, check_webhook

        AlertRules.parse(alerts, app.catalogue.queues)
        for url in webhooks:
            check_webhook(url)
    except ConfigurationError as exc:
        fail(printable(exc))
    if workers > 1 and port == 0:
        fail("--workers above 1 needs a --port (every process listens on the same one)")
    # Bound here, once, for every process: a port in use or a bad address is one line and exit 1
    # (before, a traceback, or with --workers a process failing and restarted forever; and a port
    # another service listened on was shared with it).
    try:
        sockets = listen(host, port, workers)
    except OSError as exc:
        fail(f"cannot listen on {preview(host)}:{port}: {printable(exc.strerror or exc).lower()}")
    except UnicodeError:  # a label of more than 63 characters, a character no host name may hold
        fail(f"cannot listen on {preview(host)}:{port}: not an address or a host name")
    # Opens the database once before the service starts: the embedded SQLite default is migrated
    # here, and a PostgreSQL schema that lacks migrations is reported at once. A database that
    # cannot be reached does not stop the service: it answers 503 (and /readyz says why) until the
    # database is back.
    try:
        pending = app.admin.ready()
        if pending:
            missing = ", ".join(pending)
            click.echo(f"conveyor serve: the database lacks migrations {missing}: run `conveyor migrate`", err=True)
        elif not insecure_no_auth and not any(t.revoked_at is None for t in app.admin.tokens()):
            click.echo(
                "conveyor serve: no token exists yet; make one with `conveyor tokens create NAME --role admin`",
                err=True,
            )
    except BackendError as exc:
        click.echo(
            f"conveyor serve: the database cannot be used now ({printable(exc)}); serving 503s until it can", err=True
        )
    if insecure_no_auth:
        click.secho(NO_AUTH_WARNING, fg="red", bold=True, err=True)
    config = ServiceConfig(
        auth=not insecure_no_auth,
        group_commit=group_commit,
        token_cache=token_cache,
        max_body_bytes=max_body_bytes,
        alert_interval=alert_interval,
        alerts=tuple(alerts),
        webhooks=tuple(webhooks),
    )
    app.close()
    to_environment(app.database_url, found.get("app_path"), config)
    port = sockets[0].getsockname()[1]  # the one the system chose for --port 0
    click.echo(f"conveyor serve: http://{host}:{port} ({workers} worker(s); OpenAPI at /openapi.json)", err=True)
    level = "info" if found.get("verbose") else "warning"
    ctx.exit(run_service(sockets, level, access_log, forwarded_allow_ips.strip()))
