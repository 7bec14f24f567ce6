"""What only the SQLite backend promises: its pragmas, its migration ledger, its error mapping."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _factory import T0, acquire, insert, new_job

from conveyor._errors import BackendError, BackendUnavailable
from conveyor.backends import open_backend
from conveyor.backends._sql import load_migrations, load_queries
from conveyor.backends.sqlite import SqliteBackend, _connection


@pytest.fixture
def sqlite_backend(sqlite_url: str) -> Iterator[SqliteBackend]:
    backend = open_backend(sqlite_url)
    assert isinstance(backend, SqliteBackend)
    backend.migrate()
    try:
        yield backend
    finally:
        backend.close()


def _raw(backend: SqliteBackend) -> closing[sqlite3.Connection]:
    return closing(sqlite3.connect(backend.path, isolation_level=None))


def test_the_file_is_in_wal_mode(sqlite_backend: SqliteBackend) -> None:
    with _raw(sqlite_backend) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrate_records_versions_and_is_idempotent(sqlite_backend: SqliteBackend) -> None:
    assert sqlite_backend.migrate() == []
    with _raw(sqlite_backend) as conn:
        versions = [row[0] for row in conn.execute("SELECT version FROM schema_migrations")]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert versions == [m.version for m in load_migrations("conveyor.backends.sqlite")]
    assert versions[:2] == [1, 2]
    assert {
        "jobs",
        "archive",
        "idempotency_keys",
        "audit",
        "schema_migrations",
        "processed_keys",
        "schedules",
        "subscriptions",
    } <= tables


def test_acquire_uses_the_partial_ready_index(sqlite_backend: SqliteBackend) -> None:
    query = load_queries("conveyor.backends.sqlite")["jobs_acquire"]
    args = {"queue": "q", "limit": 1, "lease_expires_at": 1.0, "worker_id": "w", "now": 0.0}
    with _raw(sqlite_backend) as conn:
        plan = " ".join(str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + query, args))
    assert "jobs_ready" in plan
    assert "jobs_ordering" in plan
    assert "TEMP B-TREE" not in plan  # the index already gives hand-out order


def test_the_write_ahead_log_is_cut_back_once_checkpointed(
    sqlite_backend: SqliteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the log kept the size of its largest run of writes for good (here ~15 MB, written while
    # a reader held its snapshot, as a long `conveyor stats` or a full disk holds a checkpoint back).
    monkeypatch.setattr(_connection, "WAL_SIZE_LIMIT", 256 * 1024)
    backend = SqliteBackend(sqlite_backend.path)
    wal = Path(sqlite_backend.path + "-wal")
    big = json.dumps({"x": "y" * 1024})
    try:
        insert(backend, new_job())
        with _raw(sqlite_backend) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM jobs").fetchone()
            for _ in range(10):
                insert(backend, *(new_job(payload=big) for _ in range(1000)))
            assert wal.stat().st_size > 8 * 1024 * 1024
            reader.execute("COMMIT")
        insert(backend, new_job())  # its commit checkpoints the whole log, now that nobody reads
        insert(backend, new_job())  # and this write starts the log over, cut back first
        assert wal.stat().st_size <= 256 * 1024
    finally:
        backend.close()


def test_a_file_locked_past_the_busy_timeout_is_unavailable(
    sqlite_backend: SqliteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    insert(sqlite_backend, new_job())
    monkeypatch.setattr(_connection, "BUSY_TIMEOUT_S", 0.05)
    impatient = SqliteBackend(sqlite_backend.path)
    try:
        with _raw(sqlite_backend) as holder:
            holder.execute("BEGIN IMMEDIATE")
            with pytest.raises(BackendUnavailable, match="locked"):
                acquire(impatient)
            holder.execute("ROLLBACK")
        # Once the lock is gone the same backend works again: nothing was lost.
        assert len(acquire(impatient)) == 1
    finally:
        impatient.close()


def test_a_closed_backend_refuses_calls(sqlite_url: str) -> None:
    backend = open_backend(sqlite_url)
    backend.migrate()
    backend.close()

    with pytest.raises(BackendError, match="closed"):
        acquire(backend)


def test_a_statement_error_is_a_backend_error(sqlite_url: str) -> None:
    backend = open_backend(sqlite_url)
    try:
        # No migrate(): the tables do not exist.
        with pytest.raises(BackendError, match="no such table") as info:
            acquire(backend)
        assert not isinstance(info.value, BackendUnavailable)
        # Named as on PostgreSQL and MySQL, with the command that fixes it.
        assert "the Conveyor schema is missing in this database" in str(info.value)
        assert "run `conveyor migrate` with the same URL" in str(info.value)
    finally:
        backend.close()


def test_an_idle_acquire_steps_past_no_scheduled_job(sqlite_backend: SqliteBackend) -> None:
    """A job due later is 'scheduled' (migration 0007), outside jobs_ready: an acquire that finds
    fewer jobs than it asked for no longer walks every scheduled job of its queue, holding the
    write lock (32 ms with 200,000 scheduled before, 0.09 ms after)."""
    from _factory import T0, at

    insert(sqlite_backend, *[new_job(queue="q", run_at=at(86_400 + i)) for i in range(20_000)])
    q = sqlite_backend._q
    args = {"queue": "q", "limit": 100, "lease_expires_at": 0.0, "worker_id": "w", "now": T0.timestamp()}

    def steps(*statements: str) -> int:
        """SQLite VM instructions the statements run (its progress handler, every 10 of them)."""
        ticks = [0]

        def tick() -> int:
            ticks[0] += 1
            return 0

        with _raw(sqlite_backend) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.set_progress_handler(tick, 10)
            for statement in statements:
                conn.execute(statement, args).fetchall()
            conn.set_progress_handler(None, 0)
            conn.execute("ROLLBACK")
        return ticks[0] * 10

    assert steps(q["jobs_promote"], q["jobs_acquire"]) < 2_000
    with _raw(sqlite_backend) as conn:  # the layout before: every scheduled job in jobs_ready
        conn.execute("UPDATE jobs SET state = 'pending'")
    assert steps(q["jobs_acquire"]) > 20_000
    assert acquire(sqlite_backend, queue="q") == []


def test_a_backlog_of_due_scheduled_jobs_is_promoted_a_thousand_per_acquire(sqlite_backend: SqliteBackend) -> None:
    from _factory import at

    insert(sqlite_backend, *[new_job(queue="b", run_at=at(10)) for _ in range(2_500)])
    got = [len(acquire(sqlite_backend, queue="b", limit=5_000, now=at(10))) for _ in range(4)]
    assert got == [1_000, 1_000, 500, 0]


def test_a_time_past_the_last_datetime_is_read_as_the_last_one(sqlite_backend: SqliteBackend) -> None:
    # An older release stored the last ~15 µs of the year 9999 as the year 10000 (REAL seconds): every
    # read of that row raised, and the worker's fetch loop stopped for every job of its queue. Sends
    # are refused past _message.LATEST now; a row already stored reads as the last datetime.
    far, near = new_job(), new_job(expires_at=T0 + timedelta(days=1))
    insert(sqlite_backend, far, near)
    with _raw(sqlite_backend) as conn:
        conn.execute("UPDATE jobs SET expires_at = 253402300800.0 WHERE id = ?", (str(far.id),))
    leased = acquire(sqlite_backend, limit=10)
    assert {d.id for d in leased} == {far.id, near.id}
    assert [d.expires_at for d in leased if d.id == far.id] == [datetime.max.replace(tzinfo=UTC)]
