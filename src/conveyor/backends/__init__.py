"""Storage backends, one per database engine, all implementing :class:`conveyor.backends.base.Backend`."""

from __future__ import annotations

from conveyor._errors import ConfigurationError
from conveyor.backends._redact import redact_url
from conveyor.backends.base import Backend

DEFAULT_DATABASE_URL = "sqlite:///conveyor.db"


def in_memory_url(url: str) -> bool:
    """Whether ``url`` names a private in-memory database, which lives and dies with one process
    (``memory://``, ``sqlite:///:memory:``)."""
    scheme, _, rest = url.partition("://")
    return scheme == "memory" or (scheme == "sqlite" and rest in (":memory:", "/:memory:"))


def _check_sqlite_path(path: str, url: str) -> None:
    """Refuse what a sqlite URL's path would open other than the file it seems to name: a new, empty
    database named 'x.db?mode=ro' or 'x.db#main', a URI SQLite reads itself ('file::memory:', a private
    in-memory database whose jobs are lost with the process), control characters."""
    name, question, options = path.partition("?")
    if not name:
        raise ConfigurationError(f"sqlite URL has no file path: {redact_url(url)!r} (try sqlite:///conveyor.db)")
    if question:
        raise ConfigurationError(
            f"sqlite URLs take no options (?{options} in {redact_url(url)!r}): Conveyor opens the file "
            f"itself, read-write in WAL mode; name the file alone (sqlite:///{name})"
        )
    if "#" in name or name.startswith("file:") or any(ord(c) < 0x20 or c == "\x7f" for c in name):
        raise ConfigurationError(
            f"a sqlite URL names a plain file path, without '#', a 'file:' URI or control characters: "
            f"{redact_url(url)!a}"
        )


def open_backend(url: str) -> Backend:
    """Open the backend a database URL names.

    ``postgresql://user@host:port/db`` (or ``postgres://``), ``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db``, ``memory://`` (a private in-memory SQLite database, for tests).
    Raises :class:`ConfigurationError` for anything else; its message never shows a password."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a database URL must be a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"not a database URL: {redact_url(url)!r} (expected postgresql://... or sqlite:///path.db)"
        )
    if scheme in ("postgresql", "postgres"):
        from conveyor.backends.postgres import PostgresBackend

        return PostgresBackend("postgresql://" + rest)
    if scheme == "sqlite":
        from conveyor.backends.sqlite import SqliteBackend

        path = rest[1:] if rest.startswith("/") else rest
        _check_sqlite_path(path, url)
        return SqliteBackend(path)
    if scheme == "memory":
        from conveyor.backends.sqlite import MemoryBackend

        return MemoryBackend()
    raise ConfigurationError(
        f"unsupported database URL scheme {scheme!r} in {redact_url(url)!r} (supported: postgresql, sqlite, memory)"
    )
