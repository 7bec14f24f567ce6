"""Reading ``timestamptz`` values no ``datetime`` holds.

PostgreSQL stores times a ``datetime`` cannot hold: ``infinity`` and ``-infinity``, years before 1
(``4000-01-01 BC``) and after 9999. Only raw SQL writes them into Conveyor's tables (an operator's hand
edit, another writer, a migration of another system's rows), but psycopg refuses to read one
(``DataError``), and that failed every statement whose rows held it: one job whose ``run_at`` was
``-infinity`` failed each acquire of its queue, after the leases were taken, so no job of the queue ran,
and ``job show`` and ``GET /v1/jobs/ID`` failed on it. Read here, a time before the first ``datetime``
is that first one and a time after the last is the last, as SQLite's and MySQL's rows are read
(``backends._convert.from_db_time``): the job is due at once, never expires, or expired long ago."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import psycopg
from psycopg import abc
from psycopg.abc import AdaptContext
from psycopg.adapt import AdaptersMap, Buffer, Loader
from psycopg.pq import Format

_TIMESTAMPTZ = "timestamptz"
_FIRST = datetime.min.replace(tzinfo=UTC)
_LAST = datetime.max.replace(tzinfo=UTC)


def _before_first(data: Buffer, binary: bool) -> bool:
    """Whether a time psycopg could not read lies before the first ``datetime`` (else after the last)."""
    if binary:
        # Microseconds since 2000-01-01 as a signed 64-bit integer (-infinity is its least value).
        return int.from_bytes(bytes(data), "big", signed=True) < 0
    text = bytes(data)
    return text.startswith(b"-") or text.endswith(b" BC")


def adapters() -> AdaptersMap:
    """psycopg's adapters with ``timestamptz`` read as above, for a connection's ``context``."""
    types = AdaptersMap(psycopg.adapters)
    oid = types.types[_TIMESTAMPTZ].oid
    for fmt in (Format.TEXT, Format.BINARY):
        types.register_loader(oid, _clamped(types.get_loader(oid, fmt), fmt == Format.BINARY))
    return types


def _clamped(found: type[abc.Loader] | None, binary: bool) -> type[Loader]:
    """A loader that reads a time as ``found`` does (psycopg's own, its C one where installed: not a class
    Python can derive from, so it is called), and one ``found`` refuses as the first or last ``datetime``."""
    assert found is not None
    base = found

    class Clamped(Loader):
        format = Format.BINARY if binary else Format.TEXT

        def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
            super().__init__(oid, context)
            self.read = base(oid, context).load

        def load(self, data: Buffer) -> datetime:
            try:
                return cast(datetime, self.read(data))
            except psycopg.DataError:
                return _FIRST if _before_first(data, binary) else _LAST

    return Clamped
