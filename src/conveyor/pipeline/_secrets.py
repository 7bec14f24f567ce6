"""Keeping database passwords out of every message and log line the pipeline writes.

Errors from drivers and URL parsers quote the URL they were given, password and all. The pipeline
passes each message through :func:`redact` before it is shown, and the CLI puts
:class:`RedactingFilter` on the log handlers while a command runs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, unquote, urlsplit

MASK = "***"

# user:password@ in anything shaped like a URL (the password runs to the last @ before the host,
# so a password holding an @ is masked whole), and password=... in key=value connection strings,
# URL queries and JDBC properties.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/:@\s'\"]*:)[^\s'\"]*(@)")
_KEY_PASSWORD = re.compile(r"((?:password|passwd|pwd)\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s&;,'\")]+)", re.IGNORECASE)


def _passwords(url: str) -> Iterator[str]:
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if not password and "@" in url:
        # Not a URL urlsplit understands (no scheme, say): user:password@host all the same.
        userinfo = url.split("://", 1)[-1].rsplit("@", 1)[0]
        password = userinfo.split(":", 1)[1] if ":" in userinfo else None
    if password:
        yield password
        yield unquote(password)
        yield quote(password, safe="")
    for match in _KEY_PASSWORD.finditer(url):
        yield match.group(2).strip("'\"")


def redact(text: str, *urls: str | None) -> str:
    """``text`` with every password masked: those of ``urls`` wherever they appear, and anything
    in password position of a URL or a ``password=`` setting."""
    for url in urls:
        if not url:
            continue
        for secret in sorted(set(_passwords(url)), key=len, reverse=True):
            if len(secret) >= 3:
                text = text.replace(secret, MASK)
    text = _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", text)
    return _KEY_PASSWORD.sub(rf"\g<1>{MASK}", text)


class RedactingFilter(logging.Filter):
    """A log filter that masks passwords in each record's formatted message."""

    def __init__(self, *urls: str | None) -> None:
        super().__init__()
        self.urls = urls

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message, *self.urls)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            # A traceback would print the exception's text unmasked: keep its one masked line.
            record.msg = f"{record.msg}: {redact(str(record.exc_info[1]), *self.urls)}"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


@contextmanager
def redacted_logs(*urls: str | None) -> Iterator[None]:
    """Mask passwords in everything logged while the block runs (root handlers and the fallback)."""
    handlers = [*logging.getLogger().handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    flt = RedactingFilter(*urls)
    for handler in handlers:
        handler.addFilter(flt)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(flt)
