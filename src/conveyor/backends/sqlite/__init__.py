"""The SQLite backend: the embedded default, one file, no server; also the in-memory test engine.

See :class:`SqliteBackend`. Its SQL lives in ``sql/queries.sql`` (named statements) and
``sql/NNNN_*.sql`` (migrations)."""

from __future__ import annotations

from conveyor.backends.sqlite._backend import MemoryBackend, SqliteBackend

__all__ = ["MemoryBackend", "SqliteBackend"]
