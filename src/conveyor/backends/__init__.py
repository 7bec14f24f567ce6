"""Storage backends, one per database engine, all implementing :class:`conveyor.backends.base.Backend`."""

from __future__ import annotations

import os
import stat
from urllib.parse import unquote

from conveyor._errors import ConfigurationError
from conveyor.backends._redact import redact_url
from conveyor.backends.base import Backend

DEFAULT_DATABASE_URL = "sqlite:///conveyor.db"


def in_memory_url(url: str) -> bool:
    """Whether ``url`` names a private in-memory database, which lives and dies with one process
    (``memory://``, ``sqlite:///:memory:``)."""
    scheme, _, rest = url.partition("://")
    return scheme == "memory" or (scheme == "sqlite" and unquote(rest) in (":memory:", "/:memory:"))


#: The longest path SQLite opens, in bytes once absolute: its unix VFS holds a path in 512 bytes
#: (MAX_PATHNAME) and refuses one that leaves no room for the '-journal' it adds to it.
SQLITE_LONGEST_PATH = 512 - len("-journal")


def sqlite_url(path: str) -> str:
    """The ``sqlite:///`` URL of a file path: its '%', '?' and '#' percent-encoded, as a URL's path is
    (``what?.db`` is ``sqlite:///what%3F.db``), so that the URL names that file again when it is read."""
    return "sqlite:///" + path.replace("%", "%25").replace("?", "%3F").replace("#", "%23")


def _sqlite_path(path: str, url: str) -> str:
    """The file a sqlite URL's path names, its percent-escapes decoded (``%3F`` is '?', ``%23`` '#',
    ``%25`` '%'; a '%' that starts no escape is itself).

    Refuse what it would open other than the file it seems to name: a new, empty database named
    'x.db?mode=ro' or 'x.db#main', a URI SQLite reads itself ('file::memory:', a private in-memory
    database whose jobs are lost with the process), control characters. Then refuse a file no retry
    can open (see :func:`_check_sqlite_file`)."""
    raw, question, options = path.partition("?")
    if not raw:
        raise ConfigurationError(f"sqlite URL has no file path: {redact_url(url)!r} (try sqlite:///conveyor.db)")
    if question:
        raise ConfigurationError(
            f"sqlite URLs take no options (?{options} in {redact_url(url)!r}): '?' starts a URL's query string. "
            f"Conveyor opens the file itself, read-write in WAL mode; name the file alone (sqlite:///{raw}), or, "
            f"if '?' is part of its name, percent-encode it as '%3F' ({sqlite_url(unquote(path))})"
        )
    if "#" in raw:
        raise ConfigurationError(
            f"a sqlite URL names a plain file path, without '#' (it starts a URL's fragment; in a file's name "
            f"percent-encode it as '%23'): {redact_url(url)!a}"
        )
    try:
        name = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise ConfigurationError(f"a sqlite URL's percent-escapes must spell UTF-8 text: {redact_url(url)!a}") from None
    if name.startswith("file:") or any(ord(c) < 0x20 or c == "\x7f" for c in name):
        raise ConfigurationError(
            f"a sqlite URL names a plain file path, without a 'file:' URI or control characters: {redact_url(url)!a}"
        )
    if name != raw and not os.path.exists(name) and os.path.exists(raw):
        # Before escapes were decoded 'a%20b.db' opened the file of that name: do not start a new, empty
        # database beside it without a word.
        raise ConfigurationError(
            f"the sqlite URL {redact_url(url)!r} names the file {_shown(name)}, which does not exist, while "
            f"{_shown(raw)} does: a URL's path is percent-encoded, so write a '%' in a file's name as '%25' "
            f"({sqlite_url(raw)})"
        )
    if name != ":memory:":
        _check_sqlite_file(name)
    return name


def _check_sqlite_file(path: str) -> None:
    """Refuse a database file that no process of this user can ever open as it stands, which SQLite
    reports as 'unable to open database file', a failure a worker would otherwise wait out for ever:
    a name longer than the file system or SQLite takes, a directory, a parent that is missing or is
    a file, a file or directory this user may not write. A missing directory is refused too: Conveyor
    never creates one (see docs/decisions.md)."""
    shown = _shown(path)
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    existing = _nearest_directory(parent, shown)
    name_max = _pathconf(existing, "PC_NAME_MAX", 255)
    parts = [os.fsencode(part) for part in os.path.relpath(full, existing).split(os.sep)]
    for part in parts[:-1]:
        if len(part) > name_max:
            raise ConfigurationError(
                f"cannot open the sqlite file {shown}: a directory name of {len(part)} bytes is past this file "
                f"system's limit of {name_max} bytes (NAME_MAX)"
            )
    if len(parts[-1]) + len("-journal") > name_max:
        raise ConfigurationError(
            f"cannot open the sqlite file {shown}: its file name is {len(parts[-1])} bytes long, which with the "
            f"'-journal' SQLite adds to it is past this file system's limit of {name_max} bytes (NAME_MAX)"
        )
    longest = min(_pathconf(existing, "PC_PATH_MAX", 4096) - 1, SQLITE_LONGEST_PATH)
    length = max(len(os.fsencode(full)), len(os.fsencode(os.path.realpath(full))))
    if length > longest:
        raise ConfigurationError(
            f"cannot open the sqlite file {shown}: its path is {length} bytes long once absolute, and SQLite "
            f"opens paths of at most {longest} bytes; name a file nearer the root"
        )
    if existing != parent:
        hint = f" (an absolute path takes four slashes: {sqlite_url('/' + path)})" if not os.path.isabs(path) else ""
        raise ConfigurationError(
            f"cannot open the sqlite file {shown}: the directory {_shown(parent)} does not exist; create it first{hint}"
        )
    if os.path.isdir(full):
        raise ConfigurationError(
            f"cannot open the sqlite file {shown}: it is a directory; name a file in it "
            f"({sqlite_url(os.path.join(path, 'conveyor.db'))})"
        )
    # Root may write whatever the mode bits say: os.access answers for the user this process runs as.
    if os.path.exists(full) and not os.access(full, os.R_OK | os.W_OK):
        raise ConfigurationError(
            f"cannot open the sqlite file {shown}: this user (uid {os.getuid()}) may not read and write it (its "
            "mode, its owner, or a read-only file system)"
        )
    creates = not all(os.path.exists(full + suffix) for suffix in ("", "-wal", "-shm"))
    if creates and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"cannot open the sqlite file {shown}: this user (uid {os.getuid()}) may not create files in "
            f"{_shown(parent)}, where SQLite keeps the database and its -wal and -shm files"
        )


def _nearest_directory(path: str, shown: str) -> str:
    """The nearest directory that exists at or above ``path``; ConfigurationError where a file stands
    in the way or this user may not search a directory on the way."""
    while True:
        try:
            found = os.stat(path)
        except PermissionError:
            raise ConfigurationError(
                f"cannot open the sqlite file {shown}: this user (uid {os.getuid()}) may not reach {_shown(path)}"
            ) from None
        except OSError:  # missing, a file above it, or a name too long to look up
            if os.path.dirname(path) == path:
                return path
            path = os.path.dirname(path)
            continue
        if not stat.S_ISDIR(found.st_mode):
            raise ConfigurationError(f"cannot open the sqlite file {shown}: {_shown(path)} is not a directory")
        return path


def _pathconf(path: str, name: str, default: int) -> int:
    """A file system's limit (``os.pathconf``), or ``default`` where it has none to say."""
    try:
        value = os.pathconf(path, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if value > 0 else default


def _shown(path: str) -> str:
    """A path for a message, its middle left out when it is long (a 5,000-character name)."""
    return repr(path) if len(path) <= 80 else f"{path[:40]!r}...{path[-30:]!r} ({len(path)} characters)"


def open_backend(url: str) -> Backend:
    """Open the backend a database URL names.

    ``postgresql://user@host:port/db`` (or ``postgres://``), ``mysql://user@host:port/db`` (MySQL or
    MariaDB, with the ``mysql`` extra), ``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db``, ``memory://`` (a private in-memory SQLite database, for tests).
    Raises :class:`ConfigurationError` for anything else; its message never shows a password."""
    engine, target = _parse(url)
    if engine == "postgres":
        from conveyor.backends.postgres import PostgresBackend

        return PostgresBackend(target)
    if engine == "mysql":
        try:
            from conveyor.backends.mysql import MysqlBackend
        except ImportError as exc:  # PyMySQL missing
            raise ConfigurationError(
                f"a mysql:// URL needs the PyMySQL driver ({exc}): pip install 'conveyor[mysql]'"
            ) from None
        return MysqlBackend(target)
    if engine == "sqlite":
        from conveyor.backends.sqlite import SqliteBackend

        return SqliteBackend(target)
    from conveyor.backends.sqlite import MemoryBackend

    return MemoryBackend()


def same_database(a: str, b: str) -> bool:
    """Whether two database URLs name the same database as :func:`open_backend` reads them:
    ``postgres://`` is ``postgresql://`` and a password or an option changes nothing (not a host
    spelled another way: ``localhost`` may be a socket); a SQLite file named relative to the working
    directory is the file named absolute; two private in-memory databases are never the same. A
    malformed ``a`` raises ConfigurationError; a ``b`` open_backend would refuse is another database."""
    one = _identity(*_parse(a))
    try:
        other = _identity(*_parse(b))
    except ConfigurationError:
        return False
    return one[0] != "memory" and one == other


def _identity(engine: str, target: str) -> tuple[str, ...]:
    if engine == "sqlite":
        return engine, os.path.abspath(target)
    if engine == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(target)
        except Exception:  # malformed: compared as written (opening it says why)
            return engine, target
        named = (str(params.get(k) or "") for k in ("host", "port", "dbname", "user"))
        host, port, dbname, user = named
        return engine, host, port or "5432", dbname or user, user
    if engine == "mysql":
        from conveyor.backends.mysql._url import connect_kwargs

        kwargs = connect_kwargs(target)
        named = (str(kwargs.get(k) or "") for k in ("host", "port", "database", "user"))
        return (engine, *named)
    return (engine,)


def check_url(url: str) -> None:
    """Raise the :class:`ConfigurationError` :func:`open_backend` would for ``url``'s scheme or sqlite
    path, without opening anything: a supervisor checks once what each of its processes would fail on."""
    _parse(url)


def _parse(url: str) -> tuple[str, str]:
    """The engine a URL names (``postgres``, ``mysql``, ``sqlite``, ``memory``) and what its backend opens."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a database URL must be a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"not a database URL: {redact_url(url)!r} (expected postgresql://..., mysql://... or sqlite:///path.db)"
        )
    if scheme in ("postgresql", "postgres"):
        return "postgres", "postgresql://" + rest
    if scheme == "mysql":
        from conveyor.backends.mysql._url import connect_kwargs

        connect_kwargs(url)  # a malformed URL is refused here, before any process opens it
        return "mysql", url
    if scheme == "sqlite":
        return "sqlite", _sqlite_path(rest[1:] if rest.startswith("/") else rest, url)
    if scheme == "memory":
        return "memory", ""
    raise ConfigurationError(
        f"unsupported database URL scheme {scheme!r} in {redact_url(url)!r} "
        "(supported: postgresql, mysql, sqlite, memory)"
    )
