"""API tokens for ``conveyor serve``: create (the secret is shown once), list, revoke."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import click
from rich.table import Table

from conveyor.cli._common import actor, app_of, cell, console, dump, fail

_ACTOR = click.option("--actor", "who", default=None, help="Who (default: the OS user); kept in the audit log.")
_DURATION = re.compile(r"^(\d{1,9})([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@click.group()
def tokens() -> None:
    """Bearer tokens of the HTTP API: roles producer, operator, admin; optional queues and expiry."""


def _expiry(text: str | None, now: datetime) -> datetime | None:
    if text is None:
        return None
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        fail(f"--expires-in must be a positive duration such as 3600, 90m, 12h or 30d, got {text!r}")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > 100 * 365 * 86400:
        fail("--expires-in is at most 100 years")
    return now + timedelta(seconds=seconds)


@tokens.command("create")
@click.argument("name")
@click.option("--role", required=True, type=click.Choice(["producer", "operator", "admin"]))
@click.option("--queue", "queues", multiple=True, help="Limit the token to this queue (repeat for more).")
@click.option("--expires-in", default=None, help="Expire after this long: 3600, 90m, 12h, 30d (default: never).")
@_ACTOR
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def tokens_create(
    ctx: click.Context,
    name: str,
    role: str,
    queues: tuple[str, ...],
    expires_in: str | None,
    who: str | None,
    as_json: bool,
) -> None:
    """Make a token NAME (the actor of its actions in the audit log). Its secret is printed once,
    on stdout, and never stored: only its SHA-256 is."""
    token, bearer = app_of(ctx).admin.create_token(
        name,
        role,
        queues=list(queues) or None,
        expires_at=_expiry(expires_in, app_of(ctx).clock.now()),
        actor=actor(who),
    )
    if as_json:
        dump({"name": token.name, "id": token.id, "role": token.role, "token": bearer})
        return
    click.echo(bearer)
    click.echo(
        f"token {token.name!r} ({token.role}) made; the line above is its secret, shown this once: keep it safe",
        err=True,
    )


@tokens.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def tokens_list(ctx: click.Context, as_json: bool) -> None:
    """Every token (secrets are never stored, so never shown)."""
    rows = app_of(ctx).admin.tokens()
    if as_json:
        dump(
            [
                {
                    "name": t.name,
                    "id": t.id,
                    "role": t.role,
                    "queues": list(t.queues) if t.queues is not None else None,
                    "created_at": t.created_at.isoformat(),
                    "expires_at": t.expires_at.isoformat() if t.expires_at else None,
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                }
                for t in rows
            ]
        )
        return
    table = Table(title="API tokens")
    for column in ("name", "id", "role", "queues", "created", "expires", "state"):
        table.add_column(column)
    now = app_of(ctx).clock.now()
    for t in rows:
        state = "revoked" if t.revoked_at else "expired" if t.expires_at and t.expires_at <= now else "active"
        table.add_row(
            cell(t.name),
            t.id,
            t.role,
            cell(",".join(t.queues)) if t.queues else "all",
            t.created_at.strftime("%Y-%m-%d %H:%M"),
            t.expires_at.strftime("%Y-%m-%d %H:%M") if t.expires_at else "never",
            state,
        )
    console.print(table)


@tokens.command("revoke")
@click.argument("name")
@_ACTOR
@click.pass_context
def tokens_revoke(ctx: click.Context, name: str, who: str | None) -> None:
    """Revoke token NAME for good (a running service refuses it within --token-cache seconds)."""
    app_of(ctx).admin.revoke_token(name, actor=actor(who))
    click.echo(f"token {name!r} revoked")
