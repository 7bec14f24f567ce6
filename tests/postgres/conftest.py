"""Fixtures for the PostgreSQL-specific tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from conveyor.backends.postgres import PostgresBackend


@pytest.fixture
def pg(postgres_database: str) -> Iterator[PostgresBackend]:
    """A migrated PostgresBackend on a fresh database; closed afterwards."""
    backend = PostgresBackend(postgres_database)
    backend.migrate()
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def pg_in(postgres_database_in: Callable[[str], str]) -> Iterator[Callable[[str], PostgresBackend]]:
    """Migrated PostgresBackends on fresh databases of a given encoding (``pg_in("LATIN1")``); closed
    afterwards."""
    backends: list[PostgresBackend] = []

    def create(encoding: str) -> PostgresBackend:
        backend = PostgresBackend(postgres_database_in(encoding))
        backends.append(backend)
        backend.migrate()
        return backend

    yield create
    for backend in backends:
        backend.close()


@pytest.fixture
def admin(postgres_database: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection of the test's own on the test database (to inspect or sabotage)."""
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        yield conn
