"""Keep database passwords out of every message and log line.

A URL is shown to users in error messages (a bad scheme, a malformed URL) and libraries log their
own connection errors, some of which quote the connection string. :func:`redact_url` is what
Conveyor's messages show instead of a URL, and :func:`hide` registers a password with a logging
filter on the database drivers' loggers, which replaces it wherever it would appear."""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import unquote

_MASK = "***"
# ``password=...`` in a query string or a libpq keyword/value string (quoted or not).
_KEYWORD_PASSWORD = re.compile(r"(?P<key>\bpassword\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its password (``user:password@``, ``password=``) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        # Up to the last '@': a password with an unescaped '@' in it is still hidden whole.
        userinfo, _, host = rest.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon and "/" not in user:
            rest = f"{user}:{_MASK}@{host}"
    return scheme + sep + _KEYWORD_PASSWORD.sub(lambda m: m.group("key") + _MASK, rest)


def passwords_in(url: str) -> set[str]:
    """The password of ``url`` as written and percent-decoded (empty if it has none)."""
    found: set[str] = set()
    _, sep, rest = url.partition("://")
    rest = rest if sep else url
    if "@" in rest:
        user, colon, password = rest.rpartition("@")[0].partition(":")
        if colon and password and "/" not in user:
            found.add(password)
    for match in _KEYWORD_PASSWORD.finditer(rest):
        value = match.group("value").strip("'")
        if value:
            found.add(value)
    return found | {unquote(p) for p in found}


class _HideSecrets(logging.Filter):
    """Replaces registered passwords in the records of the logger it is attached to."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self.secrets
        if secrets:
            message = record.getMessage()
            if any(s in message for s in secrets):
                for secret in sorted(secrets, key=len, reverse=True):
                    message = message.replace(secret, _MASK)
                record.msg, record.args = message, None
        return True


_FILTER = _HideSecrets()
_LOCK = threading.Lock()
# The drivers' loggers: psycopg's pool logs every failed connection attempt at WARNING.
_LOGGERS = ("psycopg", "psycopg.pool")


def hide(url: str) -> set[str]:
    """Register the password of ``url`` with the drivers' loggers' filter; return the passwords."""
    secrets = passwords_in(url)
    if secrets:
        with _LOCK:
            _FILTER.secrets |= secrets
            for name in _LOGGERS:
                logger = logging.getLogger(name)
                if _FILTER not in logger.filters:
                    logger.addFilter(_FILTER)
    return secrets


def scrub(text: str, secrets: set[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, _MASK)
    return text
