"""Read a ``mysql://`` URL into PyMySQL's connect arguments.

One reading, shared by the backend and the test suite's fixtures, so that a URL the tests accept is one
the backend accepts. Anything it cannot read exactly is refused: PyMySQL would otherwise connect to
another database than the URL seems to name (a silently dropped option, a truncated name)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from conveyor._errors import ConfigurationError, printable
from conveyor.backends._redact import redact_url

SCHEME = "mysql"
DEFAULT_PORT = 3306


def _seconds(value: str) -> int:
    if not (value.isascii() and value.isdigit() and 0 < int(value) <= 31_536_000):
        raise ValueError("a whole number of seconds from 1")
    return int(value)


#: The query options a URL may carry, each named as the PyMySQL argument it becomes, with its reader.
_OPTIONS: dict[str, Callable[[str], int]] = {"connect_timeout": _seconds}


class ConnectArgs(TypedDict, total=False):
    """PyMySQL's ``connect`` arguments a URL gives."""

    host: str
    port: int
    user: str
    password: str
    database: str
    connect_timeout: int


def connect_kwargs(url: str) -> ConnectArgs:
    """PyMySQL's ``connect`` arguments (host, port, user, password, database) for
    ``mysql://[user[:password]@]host[:port]/database[?connect_timeout=N]``.

    Percent-escapes are decoded, so a password holding '@', ':' or '/' is written ``%40``, ``%3A``, ``%2F``;
    the port defaults to 3306; without a user PyMySQL takes the login name, as the ``mysql`` client does.
    Raises :class:`ConfigurationError` for any other URL; its message never shows the password."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a database URL must be a string, got {type(url).__name__}")
    parts = _split(url)
    kwargs: ConnectArgs = {
        "host": _host(parts, url),
        "port": _port(parts, url),
        "password": _decoded(parts.password or "", "password", url),
        "database": _database(parts, url),
    }
    user = _decoded(parts.username or "", "user", url)
    if user:
        kwargs["user"] = user
    elif parts.password is not None:
        raise _malformed(url, "it has a password but no user")
    timeout = _options(parts, url).get("connect_timeout")
    if timeout is not None:
        kwargs["connect_timeout"] = timeout
    return kwargs


def _malformed(url: str, reason: str) -> ConfigurationError:
    return ConfigurationError(f"malformed MySQL URL {printable(redact_url(url))!r}: {reason}")


def _split(url: str) -> SplitResult:
    """The URL's parts; refuses control characters first, which urlsplit would drop without a word
    (a tab or newline) so that the URL read would not be the URL written."""
    if not url:
        raise _malformed(url, "it is empty (mysql://user:password@host:port/database)")
    if any(ord(c) < 0x20 or c == "\x7f" for c in url):
        raise _malformed(url, "it holds a control character")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise _malformed(url, "its host is not a valid address (an IPv6 address is written in brackets)") from None
    if parts.scheme != SCHEME:
        raise _malformed(url, f"its scheme must be {SCHEME}:// (mysql://user:password@host:port/database)")
    if parts.fragment or url.endswith("#"):
        raise _malformed(url, "it has a '#' fragment (in a password, percent-encode '#' as %23)")
    return parts


def _host(parts: SplitResult, url: str) -> str:
    host = parts.hostname
    if not host:
        raise _malformed(url, "it has no host (mysql://user@127.0.0.1:3306/database)")
    return _decoded(host, "host", url)


def _port(parts: SplitResult, url: str) -> int:
    """The port as written after the host, checked here rather than by urlsplit: its error quotes the text,
    which is part of the password when a password holds an unescaped '/', and older Pythons read '+1' as 1."""
    hostinfo = parts.netloc.rpartition("@")[2]
    text = hostinfo.rpartition("]")[2] if hostinfo.startswith("[") else hostinfo
    _, colon, port = text.partition(":")
    if not colon:
        return DEFAULT_PORT
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise _malformed(url, "its port is not a number from 1 to 65535 (in a password, percent-encode '/' as %2F)")
    return int(port)


def _database(parts: SplitResult, url: str) -> str:
    name = parts.path.removeprefix("/")
    if not name:
        raise _malformed(url, "it names no database (mysql://user@host:3306/database)")
    if "/" in name:
        raise _malformed(url, "its path must be one database name (percent-encode a '/' in it as %2F)")
    return _decoded(name, "database name", url)


def _decoded(text: str, what: str, url: str) -> str:
    """``text`` with its percent-escapes decoded; refuses escapes that are not UTF-8 and control
    characters, which the server would cut a name or password at (NUL) or store unreadably."""
    try:
        value = unquote(text, errors="strict")
        value.encode("utf-8")
    except UnicodeError:
        raise _malformed(url, f"its {what} is not UTF-8 text (percent-encode UTF-8 bytes, e.g. %C3%A9)") from None
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise _malformed(url, f"its {what} holds a control character")
    return value


def _options(parts: SplitResult, url: str) -> dict[str, int]:
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True) if parts.query else []
    except ValueError:
        raise _malformed(url, "its query string is not name=value pairs joined by '&'") from None
    options: dict[str, int] = {}
    for name, value in pairs:
        if name not in _OPTIONS:
            raise _malformed(url, f"unknown option {printable(name)!r} (known: {', '.join(sorted(_OPTIONS))})")
        if name in options:
            raise _malformed(url, f"option {name!r} is given twice")
        try:
            options[name] = _OPTIONS[name](value)
        except ValueError as exc:
            raise _malformed(url, f"option {name!r} must be {exc}") from None
    return options
