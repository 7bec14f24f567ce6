"""Migrations only ever get added: a shipped one never changes, and a database brought up to date one
release at a time ends exactly like a fresh one (same tables, columns, indexes, constraints, functions),
with the rows it already held intact.

A new migration must be added to ``shipped_migrations.txt`` (the test prints the line); a shipped
migration that changes fails here, because the databases already migrated by it would never see
the change."""

from __future__ import annotations

import hashlib
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from _factory import acquire, complete, get
from psycopg import sql

from conveyor import App, ConfigurationError
from conveyor.backends import open_backend
from conveyor.backends._sql import Migration, load_migrations
from conveyor.backends.mysql._url import connect_kwargs

SHIPPED = Path(__file__).with_name("shipped_migrations.txt")
SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor" / "backends"
PACKAGES = {
    "postgres": "conveyor.backends.postgres",
    "sqlite": "conveyor.backends.sqlite",
    "mysql": "conveyor.backends.mysql",
}
#: The module whose ``load_migrations`` each engine's migrate() calls.
MIGRATING_MODULES = {
    "postgres": "conveyor.backends.postgres._backend",
    "sqlite": "conveyor.backends.sqlite._schema",
    "mysql": "conveyor.backends.mysql._connection",
}


def _mysql(url: str) -> Any:
    """An autocommit PyMySQL connection to ``url``."""
    return pymysql.connect(**connect_kwargs(url), autocommit=True)


def _shipped() -> dict[tuple[str, str], str]:
    rows = [line.split() for line in SHIPPED.read_text().splitlines() if line.strip()]
    return {(engine, name): digest for engine, name, digest in rows}


@pytest.mark.parametrize("kind", ["postgres", "sqlite", "mysql"])
def test_shipped_migrations_never_change_and_new_ones_are_recorded(kind: str) -> None:
    engine = kind
    shipped = _shipped()
    files = sorted((SRC / engine / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        recorded = shipped.get((engine, path.name))
        assert recorded is not None, f"record the new migration in {SHIPPED.name}: {engine} {path.name} {digest}"
        assert recorded == digest, (
            f"{engine} {path.name} changed after it shipped: databases already migrated will never see the "
            "change; put it in a new migration instead"
        )
    assert {name for (e, name) in shipped if e == engine} == {p.name for p in files}, "a shipped migration is gone"


def _catalogue(url: str) -> dict[str, Any]:
    """What the schema of a database is, read from the engine's own catalog."""
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            objects = conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
            ).fetchall()
            columns = {
                table: conn.execute(f"SELECT * FROM pragma_table_info('{table}')").fetchall()
                for (kind, table, _, _) in objects
                if kind == "table"
            }
            versions = conn.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
        return {"objects": objects, "columns": columns, "versions": versions}
    if url.startswith("mysql"):
        mysql_queries = {
            "columns": """SELECT table_name, column_name, ordinal_position, column_type, column_default, is_nullable,
                                 collation_name
                          FROM information_schema.columns WHERE table_schema = DATABASE() ORDER BY 1, 3""",
            "indexes": """SELECT table_name, index_name, seq_in_index, column_name, collation, non_unique
                          FROM information_schema.statistics WHERE table_schema = DATABASE() ORDER BY 1, 2, 3""",
            "constraints": """SELECT constraint_name, check_clause FROM information_schema.check_constraints
                              WHERE constraint_schema = DATABASE() ORDER BY 1""",
            "versions": "SELECT version, name FROM schema_migrations ORDER BY version",
        }
        with closing(_mysql(url)) as conn, conn.cursor() as cur:
            found = {}
            for key, query in mysql_queries.items():
                cur.execute(query)
                found[key] = cur.fetchall()
            return found
    queries = {
        "columns": """SELECT table_name, column_name, ordinal_position, data_type, column_default, is_nullable
                      FROM information_schema.columns
                      WHERE table_schema = 'public' AND table_name !~ '^archive_p[0-9]'
                      ORDER BY 1, 3""",
        "indexes": """SELECT tablename, indexname, indexdef FROM pg_indexes
                      WHERE schemaname = 'public' AND tablename !~ '^archive_p[0-9]' ORDER BY 2""",
        "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                          WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text !~ '^archive_p[0-9]'
                          ORDER BY 1, 2""",
        "functions": """SELECT proname, pg_get_functiondef(oid) FROM pg_proc
                        WHERE pronamespace = 'public'::regnamespace ORDER BY 1""",
        "options": """SELECT relname, relkind, reloptions FROM pg_class
                      WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')
                        AND relname !~ '^archive_p[0-9]' ORDER BY 1""",
        "versions": "SELECT version, name FROM conveyor_schema_migrations ORDER BY version",
    }
    with psycopg.connect(url) as conn:
        return {key: conn.execute(query).fetchall() for key, query in queries.items()}


@contextmanager
def _second_database(database_url: str, tmp_path: Path) -> Iterator[str]:
    """Another empty database of the same engine, next to ``database_url``."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path}/fresh.db"
        return
    base, _, _ = database_url.rpartition("/")
    name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
    if database_url.startswith("mysql"):
        with closing(_mysql(database_url)) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin")
        try:
            yield f"{base}/{name}"
        finally:
            with closing(_mysql(database_url)) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        return
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _insert_a_job_as_release_one_did(url: str, job_id: uuid.UUID) -> None:
    """A pending job written with the columns of the first schema only."""
    columns = "id, queue, task, payload, headers, state, priority, run_at, enqueued_at, max_attempts, max_deliveries"
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
            conn.execute(
                f"INSERT INTO jobs ({columns}) VALUES (?, 'kept', 't', '{{}}', '{{}}', 'pending', 0, 0, 0, 5, 10)",
                (str(job_id),),
            )
        return
    if url.startswith("mysql"):
        with closing(_mysql(url)) as conn, conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO jobs ({columns}) VALUES (%s, 'kept', 't', '{{}}', '{{}}', 'pending', 0, 0, 0, 5, 10)",
                (str(job_id),),
            )
        return
    with psycopg.connect(url) as conn:
        conn.execute(
            f"INSERT INTO jobs ({columns}) VALUES (%s, 'kept', 't', '{{}}', '{{}}', 'pending', 0, now(), now(), 5, 10)",
            (job_id,),
        )


def test_a_database_migrated_step_by_step_equals_a_fresh_one(
    engine: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = PACKAGES[engine]
    migrations: list[Migration] = load_migrations(package)
    module = MIGRATING_MODULES[engine]
    stepwise = open_backend(database_url)
    kept = uuid.uuid4()
    try:
        for count in range(1, len(migrations) + 1):
            # The database as it stood when migration `count` was the newest, then one release later.
            monkeypatch.setattr(f"{module}.load_migrations", lambda _package, n=count: migrations[:n])
            assert stepwise.migrate() == [migrations[count - 1].name]
            if count == 1:
                _insert_a_job_as_release_one_did(database_url, kept)
        monkeypatch.undo()
        assert stepwise.migrate() == []
        # What it held before the later migrations is still there, with their new columns' defaults.
        record = get(stepwise, kept)
        assert (record.state, record.queue, record.deliveries, record.rescues) == ("pending", "kept", 0, 0)
        (delivery,) = acquire(stepwise, queue="kept")
        assert complete(stepwise, delivery) == 1
    finally:
        stepwise.close()

    with _second_database(database_url, tmp_path) as fresh_url:
        fresh = open_backend(fresh_url)
        try:
            assert [m.name for m in migrations] == fresh.migrate()
        finally:
            fresh.close()
        assert _catalogue(database_url) == _catalogue(fresh_url)


def _record_version(url: str, version: int) -> None:
    """Record a migration this Conveyor does not know, as a newer release would have."""
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'future', 0)", (version,)
            )
        return
    if url.startswith("mysql"):
        with closing(_mysql(url)) as conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, 'future', 0)", (version,)
            )
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO conveyor_schema_migrations (version, name) VALUES (%s, 'future')", (version,))


def test_a_database_migrated_by_a_newer_conveyor_is_refused(database_url: str) -> None:
    # Before: migrate applied nothing and said so with success, and the old code ran on the new schema.
    backend = open_backend(database_url)
    backend.migrate()
    backend.close()
    _record_version(database_url, 9999)
    backend = open_backend(database_url)
    try:
        with pytest.raises(ConfigurationError, match=r"migrated by a newer Conveyor .*migration 9999"):
            backend.migrate()
    finally:
        backend.close()


def test_opening_a_current_sqlite_database_needs_no_write_lock(tmp_path: Path) -> None:
    # Before: every open took the write lock to check the schema, so `conveyor stats` waited out the
    # busy timeout behind another process's long write transaction, then failed.
    url = f"sqlite:///{tmp_path}/q.db"
    with App(url) as app:
        app.send("t", queue="q")
    with closing(sqlite3.connect(f"{tmp_path}/q.db", isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        with App(url) as app:
            assert [q.pending for q in app.admin.queues()] == [1]
        assert time.monotonic() - began < 5
        holder.execute("ROLLBACK")
