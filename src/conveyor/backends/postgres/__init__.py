"""The PostgreSQL backend (psycopg 3): SKIP LOCKED acquire, batched outcomes, NOTIFY wake-ups."""

from __future__ import annotations

from conveyor.backends.postgres._backend import PostgresBackend
from conveyor.backends.postgres._listener import PostgresListener

__all__ = ["PostgresBackend", "PostgresListener"]
