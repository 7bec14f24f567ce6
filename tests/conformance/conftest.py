"""The ``backend`` fixture: every conformance test runs once per engine (sqlite, postgres, mysql, memory).

A test that asks for ``database_url`` itself (directly or through one of its fixtures), rather than
only for ``backend``, reaches the database by its own means: a second backend on the same database,
or the driver's own connection. An in-process memory backend has no database to reach, so such
tests run on the SQL engines only; every other test runs on memory too."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from conveyor.backends import open_backend
from conveyor.backends.base import Backend

ENGINES = ("sqlite", "postgres", "mysql", "memory")
#: Engines with a database a test can reach by URL.
SQL_ENGINES = ("sqlite", "postgres", "mysql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine" in metafunc.fixturenames:
        engines = SQL_ENGINES if "database_url" in metafunc.fixturenames else ENGINES
        metafunc.parametrize("engine", engines)


@pytest.fixture
def database_url(engine: str, request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """A fresh database URL for the test's engine (never memory, see the module docstring)."""
    if engine == "sqlite":
        return f"sqlite:///{os.fspath(tmp_path)}/conveyor.db"
    if engine == "postgres":
        return str(request.getfixturevalue("postgres_database"))
    if engine == "mysql":
        return str(request.getfixturevalue("mysql_database"))
    raise AssertionError(f"no database URL for engine {engine!r}")


@pytest.fixture
def backend(engine: str, request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A migrated backend of the test's engine on a fresh, empty database; closed afterwards."""
    url = "memory://" if engine == "memory" else str(request.getfixturevalue("database_url"))
    b = open_backend(url)
    assert b.engine == engine
    b.migrate()
    try:
        yield b
    finally:
        b.close()
