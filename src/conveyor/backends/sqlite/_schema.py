"""Applying the numbered migrations in ``sql/`` to one SQLite database, once, however many processes try."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator

from conveyor.backends._sql import Migration, load_migrations, pending
from conveyor.backends.sqlite._connection import Connections, MemoryConnection

_PACKAGE = "conveyor.backends.sqlite"


def statements(script: str) -> Iterator[str]:
    """Split a migration script into complete statements.

    ``executescript`` would commit the surrounding transaction first, so each statement is run
    on its own inside migrate's ``BEGIN IMMEDIATE`` instead, and a failed migration leaves no trace."""
    buffer: list[str] = []
    for line in script.splitlines(keepends=True):
        buffer.append(line)
        text = "".join(buffer)
        if sqlite3.complete_statement(text):
            if text.strip() and _has_code(text):
                yield text.strip()
            buffer = []
    rest = "".join(buffer)
    if _has_code(rest):
        raise ValueError(f"migration ends with an incomplete statement: {rest.strip()[:80]!r}")


def _has_code(text: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


def migrate(pool: Connections, queries: dict[str, str]) -> list[str]:
    """Apply every migration not yet recorded in ``schema_migrations``; return their names.

    The check and the apply share one ``BEGIN IMMEDIATE`` transaction: a second process calling
    this at the same time waits for the write lock, then finds the versions already recorded."""
    migrations: list[Migration] = load_migrations(_PACKAGE)
    applied: list[str] = []
    # Read first: a database that is current needs no write lock, so that opening it works on a
    # read-only file and while another process holds a long write transaction (a `conveyor stats`
    # waited out the busy timeout, then failed, though WAL lets readers through).
    with pool.read() as conn:
        ledger = conn.execute(queries["migrations_ledger_exists"]).fetchone() is not None
        if ledger and not pending([row[0] for row in conn.execute(queries["migrations_applied"])], migrations):
            return applied
    with pool.write() as conn:
        conn.execute(queries["migrations_table"])
        done = [row[0] for row in conn.execute(queries["migrations_applied"])]
        for migration in pending(done, migrations):
            for statement in statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                queries["migrations_record"],
                {"version": migration.version, "name": migration.name, "now": time.time()},
            )
            applied.append(migration.name)
    return applied


_template: MemoryConnection | None = None
_template_lock = threading.Lock()


def migrate_memory(target: MemoryConnection, queries: dict[str, str]) -> None:
    """Give a new in-memory database the fully migrated schema.

    The migrations run once per process, on a template database that every new one is then
    copied from (SQLite's online backup): a test suite that opens an in-memory database per
    test pays for a copy, not for every DDL statement."""
    global _template
    with _template_lock:
        if _template is None:
            template = MemoryConnection()
            migrate(template, queries)
            _template = template
        _template.copy_to(target)
