"""Loads named SQL statements and numbered migrations shipped next to each backend.

A backend keeps its SQL in ``sql/queries.sql`` as blocks introduced by ``-- name: NAME``; the
comment lines under the name say why the statement is shaped so. Whole-line comments stay in the
file: the statements are loaded without them, so that a comment can never hold what the driver
would read as a placeholder (a ``%(name)s`` in one made psycopg ask for a parameter). Migrations are
``sql/NNNN_description.sql`` files, applied in number order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

from conveyor._errors import ConfigurationError

_NAME = re.compile(r"^--\s*name:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")
_COMMENT = re.compile(r"^\s*--")
_MIGRATION = re.compile(r"^(\d{4})_[A-Za-z0-9_]+\.sql$")


def load_queries(package: str) -> dict[str, str]:
    """Return ``{name: statement}`` from ``package``'s ``sql/queries.sql``, whole-line comments left out."""
    text = resources.files(package).joinpath("sql", "queries.sql").read_text(encoding="utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            if name is not None:
                queries[name] = "\n".join(lines).strip()
            name, lines = match.group(1), []
        elif name is not None and not _COMMENT.match(line):
            lines.append(line)
    if name is not None:
        queries[name] = "\n".join(lines).strip()
    return queries


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(package: str) -> list[Migration]:
    """Return ``package``'s migrations (``sql/NNNN_*.sql``) in version order."""
    folder = resources.files(package).joinpath("sql")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    return found


def pending(done: Iterable[int], migrations: Sequence[Migration]) -> list[Migration]:
    """The migrations not among the ``done`` versions. Raises :class:`ConfigurationError` if a newer
    Conveyor migrated this database (a version past the newest known): its schema may hold what this
    version's statements do not expect, and nothing here can undo a migration."""
    done = set(done)
    newest = max((m.version for m in migrations), default=0)
    ahead = max(done, default=0)
    if ahead > newest:
        raise ConfigurationError(
            f"this database was migrated by a newer Conveyor (its schema is at migration {ahead}; this "
            f"version knows up to {newest}): upgrade Conveyor here, or give this version a database of its own"
        )
    return [m for m in migrations if m.version not in done]
