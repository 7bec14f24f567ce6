"""Shared fixtures. Tests talk to real services; a missing service is a failure, never a skip."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql

POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _with_db(url: str, dbname: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{dbname}"


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The admin URL of the test PostgreSQL server; fails (not skips) if it cannot be reached."""
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:  # pragma: no cover - a broken environment
        pytest.fail(f"PostgreSQL at {POSTGRES_URL} is required and unreachable: {exc}")
    return POSTGRES_URL


@pytest.fixture
def postgres_database(postgres_server_url: str) -> Iterator[str]:
    """A fresh, empty database for one test; dropped afterwards. Yields its URL."""
    name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with_db(postgres_server_url, name)
    finally:
        with psycopg.connect(postgres_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def postgres_database_in(postgres_server_url: str) -> Iterator[Callable[[str], str]]:
    """Fresh databases of a given encoding, dropped afterwards: ``postgres_database_in("LATIN1")``
    creates one and gives its URL."""
    names: list[str] = []

    def create(encoding: str) -> str:
        name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(postgres_server_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                    sql.Identifier(name), sql.Literal(encoding)
                )
            )
        names.append(name)
        return _with_db(postgres_server_url, name)

    yield create
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{os.fspath(tmp_path)}/conveyor.db"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """A fresh database URL for each engine."""
    if request.param == "sqlite":
        return f"sqlite:///{os.fspath(tmp_path)}/conveyor.db"
    return str(request.getfixturevalue("postgres_database"))


# Hypothesis profiles. "ci" (the default) is derandomized, so that every run tries the same
# examples and a failure in CI reproduces anywhere; "soak" (`--hypothesis-profile soak`) draws many
# more examples from random seeds, for a long local run.
settings.register_profile(
    "ci",
    max_examples=40,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("soak", settings.get_profile("ci"), max_examples=1000, derandomize=False)
settings.load_profile("ci")


def make_dead_letters(db: str, n: int = 1, queue: str = "doomed") -> list[str]:
    """``n`` dead letters on ``queue`` (task of the same name), made by the real worker policy: a
    handler that rejects, drained by the testing kit."""
    from conveyor import App, Reject
    from conveyor.testing import drain

    with App(db, migrate=True) as app:

        @app.task(name=queue, queue=queue, max_attempts=1)
        def reject(n: int = 0) -> None:
            raise Reject("always")

        jobs = [reject.delay(n=i) for i in range(n)]
        assert drain(app, [queue]).dead == n
        return [str(j.id) for j in jobs]


def jobs_vacuums(url: str) -> int:
    """How many times the jobs table of the PostgreSQL database at ``url`` was vacuumed by hand."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
    assert row is not None
    return int(row[0])


def terminate_other_sessions(conn: psycopg.Connection[Any]) -> int:
    """Kill every other session on ``conn``'s database, as a server restart would; return how many.

    Waits (up to 5 s each) until the sessions have exited."""
    row = conn.execute(
        "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return int(row[0])
