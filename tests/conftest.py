"""Shared fixtures. Tests talk to real services; a missing service is a failure, never a skip."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Any

import psycopg
import pymysql
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql

from conveyor._errors import ConfigurationError
from conveyor.backends._redact import redact_url
from conveyor.backends.mysql._url import connect_kwargs

POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("CONVEYOR_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


def _with_db(url: str, dbname: str) -> str:
    """``url`` naming the database ``dbname`` instead, its query string (options) kept."""
    address, question, query = url.partition("?")
    base, _, _ = address.rpartition("/")
    return f"{base}/{dbname}{question}{query}"


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


def mysql_connect(url: str, autocommit: bool = True) -> pymysql.connections.Connection[Any]:
    """A PyMySQL connection to ``url``, read as the backend reads it (autocommit unless told)."""
    return pymysql.connect(**{"connect_timeout": 5, **connect_kwargs(url)}, autocommit=autocommit)


@contextmanager
def driver_connection(url: str, autocommit: bool = False) -> Iterator[Any]:
    """A connection of the engine's own driver (sqlite3, psycopg, PyMySQL) to the database ``url`` names,
    as an application holds one: in a transaction unless ``autocommit``."""
    if url.startswith("sqlite:///"):
        with closing(
            sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None if autocommit else "")
        ) as conn:
            yield conn
    elif url.startswith("mysql://"):
        with closing(mysql_connect(url, autocommit)) as conn:
            yield conn
    else:
        with psycopg.connect(url, autocommit=autocommit) as pg:
            yield pg


def run_statements(url: str, *statements: str) -> None:
    """Run statements that return no rows (an operator's hand edit), autocommitted, with the engine's own driver."""
    with driver_connection(url, autocommit=True) as conn:
        for statement in statements:
            if url.startswith("mysql://"):
                with conn.cursor() as cur:
                    cur.execute(statement)
            else:
                conn.execute(statement)


def query_rows(url: str, query: str) -> list[tuple[Any, ...]]:
    """The rows of one statement, read with the engine's own driver."""
    with driver_connection(url, autocommit=True) as conn:
        if url.startswith("mysql://"):
            with conn.cursor() as cur:
                cur.execute(query)
                return list(cur.fetchall())
        return list(conn.execute(query).fetchall())


@pytest.fixture(scope="session")
def mysql_server_url() -> str:
    """The admin URL of the test MySQL/MariaDB server; fails (not skips) if it cannot be reached."""
    try:
        with mysql_connect(MYSQL_URL) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
    except (pymysql.Error, ConfigurationError) as exc:  # pragma: no cover - a broken environment
        pytest.fail(f"MySQL at {redact_url(MYSQL_URL)} is required and unreachable: {exc}")
    return MYSQL_URL


def create_mysql_database(server_url: str) -> str:
    """A new, empty database on the server of ``server_url``, named ``conveyor_t_<12 hex>``; returns its name.

    Its collation compares bytes without padding ('a' and 'a ' differ, as in PostgreSQL and SQLite):
    MariaDB's default, utf8mb4_general_ci, would make 'A', 'a' and 'a ' one queue name or one key."""
    name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
    with mysql_connect(server_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin")
    return name


def drop_mysql_database(server_url: str, name: str) -> None:
    """Drop the database ``name``, first killing the sessions still using it (as PostgreSQL's
    ``DROP DATABASE ... WITH (FORCE)``): one a test left in a transaction holds metadata locks that make
    DROP DATABASE wait for lock_wait_timeout, a day by default."""
    with mysql_connect(server_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM information_schema.PROCESSLIST WHERE db = %s AND id <> CONNECTION_ID()", (name,))
        for (session,) in cur.fetchall():
            try:
                cur.execute("KILL CONNECTION %s", (session,))
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != 1094:  # ER_NO_SUCH_THREAD: it ended by itself meanwhile.
                    raise
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def mysql_database(mysql_server_url: str) -> Iterator[str]:
    """A fresh, empty utf8mb4_nopad_bin database for one test; dropped afterwards. Yields its URL."""
    name = create_mysql_database(mysql_server_url)
    try:
        yield _with_db(mysql_server_url, name)
    finally:
        drop_mysql_database(mysql_server_url, name)


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{os.fspath(tmp_path)}/conveyor.db"


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def database_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """A fresh database URL for each engine."""
    if request.param == "sqlite":
        return f"sqlite:///{os.fspath(tmp_path)}/conveyor.db"
    if request.param == "mysql":
        return str(request.getfixturevalue("mysql_database"))
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
