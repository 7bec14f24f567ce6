"""Migrations, the hot table's storage settings and indexes, and the archive's daily partitions."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _pg import T0, acquire, at, complete, insert, make_job

from conveyor.backends.base import ArchivePruneParams, ErrorInfo, Finish, JobsFinishParams
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres import _backend as pg_backend_module

Conn = psycopg.Connection[tuple[object, ...]]


def _partitions(conn: Conn) -> list[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'archive'::regclass ORDER BY c.relname"
    ).fetchall()
    return [str(row[0]) for row in rows]


def _name(day: date) -> str:
    return f"archive_p{day:%Y%m%d}"


def test_migrate_twice_is_a_no_op(pg: PostgresBackend, admin: Conn) -> None:
    assert pg.migrate() == []
    applied = admin.execute("SELECT version, name FROM conveyor_schema_migrations").fetchall()
    assert applied == [
        (1, "0001_init.sql"),
        (2, "0002_rescues.sql"),
        (3, "0003_tokens.sql"),
        (4, "0004_observability.sql"),
        (5, "0005_scheduled.sql"),
        (6, "0006_partition_drop_race.sql"),
    ]


def test_concurrent_migrators_apply_each_migration_once(postgres_database: str, admin: Conn) -> None:
    backends = [PostgresBackend(postgres_database) for _ in range(4)]
    barrier = threading.Barrier(len(backends))
    applied: list[list[str]] = []
    errors: list[BaseException] = []

    def migrate(backend: PostgresBackend) -> None:
        barrier.wait(timeout=30)
        try:
            applied.append(backend.migrate())
        except BaseException as exc:  # collected and re-raised by the test
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(b,)) for b in backends]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for backend in backends:
            backend.close()

    assert errors == []
    every = ["0001_init.sql", "0002_rescues.sql", "0003_tokens.sql", "0004_observability.sql", "0005_scheduled.sql"]
    every.append("0006_partition_drop_race.sql")
    assert sorted(applied) == [[], [], [], every]
    assert admin.execute("SELECT count(*) FROM conveyor_schema_migrations").fetchone() == (6,)


def test_the_jobs_table_is_tuned_for_churn(pg: PostgresBackend, admin: Conn) -> None:
    row = admin.execute("SELECT reloptions FROM pg_class WHERE relname = 'jobs'").fetchone()
    assert row is not None
    options = set(row[0])  # type: ignore[call-overload]
    assert {"fillfactor=70", "autovacuum_vacuum_scale_factor=0"} <= options
    rows = admin.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs'").fetchall()
    indexes = {str(name): str(definition) for name, definition in rows}
    assert "WHERE (state = 'pending'::text)" in indexes["jobs_ready_idx"]
    assert "(queue, priority DESC, run_at, id)" in indexes["jobs_ready_idx"]
    assert "WHERE (state = 'processing'::text)" in indexes["jobs_lease_idx"]
    assert "WHERE (ordering_key IS NOT NULL)" in indexes["jobs_ordering_idx"]


def test_migrate_creates_daily_partitions_ahead(pg: PostgresBackend, admin: Conn) -> None:
    today = datetime.now(UTC).date()
    parts = _partitions(admin)
    assert "archive_default" in parts
    for offset in range(-1, 8):
        assert _name(today + timedelta(days=offset)) in parts


def test_partitions_ensure_is_idempotent_and_rows_land_in_their_day(pg: PostgresBackend, admin: Conn) -> None:
    now = datetime(2031, 3, 10, 8, 0, tzinfo=UTC)
    created = pg.archive_partitions_ensure(now, days_ahead=2)
    assert created == [_name(date(2031, 3, d)) for d in (9, 10, 11, 12)]
    assert pg.archive_partitions_ensure(now, days_ahead=2) == []

    insert(pg, make_job(run_at=now), now=now)
    complete(pg, *acquire(pg, now=now), now=now)
    row = admin.execute("SELECT tableoid::regclass::text FROM archive").fetchone()
    assert row == (_name(date(2031, 3, 10)),)


def test_a_day_already_in_the_default_partition_is_left_there(pg: PostgresBackend, admin: Conn) -> None:
    insert(pg, make_job())
    complete(pg, *acquire(pg), now=T0)  # 2030-01-01 has no partition: the row goes to DEFAULT
    assert pg.archive_partitions_ensure(T0, days_ahead=1) == [_name(date(2029, 12, 31)), _name(date(2030, 1, 2))]
    row = admin.execute("SELECT tableoid::regclass::text FROM archive").fetchone()
    assert row == ("archive_default",)


def test_archive_prune_drops_whole_partitions_and_keeps_young_dead_letters(pg: PostgresBackend, admin: Conn) -> None:
    day1, day2 = datetime(2031, 5, 1, 12, tzinfo=UTC), datetime(2031, 5, 2, 12, tzinfo=UTC)
    pg.archive_partitions_ensure(day1, days_ahead=1)
    insert(pg, *[make_job(run_at=day1) for _ in range(3)], now=day1)
    complete(pg, *acquire(pg, now=day1), now=day1)  # day 1: three completed rows
    insert(pg, make_job(run_at=day2), make_job(run_at=day2), now=day2)
    done, failed = acquire(pg, now=day2)
    complete(pg, done, now=day2)
    error = ErrorInfo("RuntimeError", "boom")
    pg.jobs_finish_many(
        JobsFinishParams([Finish(failed.id, failed.receipt, "dead", reason="r", error=error)], now=day2)
    )  # day 2: one completed row and one dead letter

    params = ArchivePruneParams(
        now=datetime(2031, 6, 1, tzinfo=UTC),
        default_before=datetime(2031, 5, 20, tzinfo=UTC),
        default_dead_before=datetime(2031, 5, 2, tzinfo=UTC),
    )
    # Day 1's partition goes whole (its three rows count); day 2 keeps its dead letter, so only
    # its completed row is deleted, row by row.
    assert pg.archive_prune(params) == 4
    parts = _partitions(admin)
    assert _name(date(2031, 5, 1)) not in parts and _name(date(2031, 5, 2)) in parts
    assert admin.execute("SELECT id, state FROM archive WHERE finished_at > '2031-01-01'").fetchall() == [
        (failed.id, "dead")
    ]
    assert pg.archive_prune(params) == 0


def _only_partitions(admin: Conn, *days: date) -> None:
    """Leave the archive with the DEFAULT partition and one daily partition per day named (migrate's,
    around today, are dropped: empty and long past the cutoffs below, they would be dropped first)."""
    for part in _partitions(admin):
        if part != "archive_default":
            admin.execute(f"DROP TABLE {part}")
    for day in days:
        bounds = f"FROM ('{day} 00:00+00') TO ('{day + timedelta(days=1)} 00:00+00')"
        admin.execute(f"CREATE TABLE {_name(day)} PARTITION OF archive FOR VALUES {bounds}")


def _before_release(holder: Conn, call: Callable[[], int]) -> int:
    """``call``'s answer, which must come while ``holder`` still holds the archive: if it has not come
    within 10 s, the holder is released (so that the call ends) and the test fails."""
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(call)
        try:
            return answer.result(timeout=10)
        except FutureTimeout:
            holder.rollback()
            answer.result(timeout=60)
            pytest.fail("archive_prune waited for the transaction holding the archive")


def test_a_partition_drop_a_held_archive_blocks_is_skipped_and_the_rows_still_go(
    pg: PostgresBackend,
    admin: Conn,
    postgres_database: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the drop waited out its 1 s lock_timeout and raised BackendUnavailable, and nothing else of the
    # call ran; the pruner retried the same call (the same wait, the same error) for as long as any transaction
    # kept a row of the archive, and retention stalled.
    day1, day2 = datetime(2031, 5, 1, 12, tzinfo=UTC), datetime(2031, 5, 2, 12, tzinfo=UTC)
    _only_partitions(admin, day1.date(), day2.date())
    insert(pg, make_job(), make_job())
    complete(pg, *acquire(pg), now=T0)  # two rows in the DEFAULT partition, past retention
    insert(pg, *[make_job(run_at=day1) for _ in range(3)], now=day1)
    complete(pg, *acquire(pg, now=day1), now=day1)  # day 1: a partition due to be dropped
    insert(pg, make_job(run_at=day2), now=day2)
    (young,) = acquire(pg, now=day2)
    complete(pg, young, now=day2)  # day 2: a row to keep, which an operator's session holds
    cutoff = datetime(2031, 5, 2, tzinfo=UTC)
    params = ArchivePruneParams(now=datetime(2031, 6, 1, tzinfo=UTC), default_before=cutoff, default_dead_before=cutoff)

    with psycopg.connect(postgres_database) as holder, caplog.at_level(logging.WARNING, "conveyor"):
        holder.execute("SELECT id FROM archive WHERE id = %s FOR UPDATE", (young.id,))
        # The drop is skipped; the rows past retention go row by row, day 1's among them.
        assert _before_release(holder, lambda: pg.archive_prune(params)) == 5
        # A caller that prunes "until 0" is not kept calling by a partition it cannot drop; and the next calls
        # (a pruner's next batches) do not wait out the drop's lock timeout again. Before: each call waited 1 s
        # and warned again, for as long as the holder stayed (100 batches of a backlog: 100 s, 100 warnings).
        for _ in range(3):
            assert _before_release(holder, lambda: pg.archive_prune(params)) == 0
        assert _name(day1.date()) in _partitions(admin)
        assert admin.execute("SELECT id FROM archive").fetchall() == [(young.id,)]
    skipped = [r for r in caplog.records if r.levelno == logging.WARNING and _name(day1.date()) in r.getMessage()]
    assert len(skipped) == 1
    assert all(r.exc_info is None for r in skipped)

    # The holder is gone: once DROP_RETRY_AFTER has passed, the next call drops the (now empty) partition.
    assert pg.archive_prune(params) == 0
    assert _name(day1.date()) in _partitions(admin)
    monkeypatch.setattr(pg_backend_module, "DROP_RETRY_AFTER", 0.0)
    assert pg.archive_prune(params) == 0
    assert _name(day1.date()) not in _partitions(admin)
    assert _name(day2.date()) in _partitions(admin)


def test_a_held_row_past_retention_is_skipped_not_waited_for(
    pg: PostgresBackend, admin: Conn, postgres_database: str
) -> None:
    # Before: the row-by-row delete picked the held row among its victims and waited for its holder, with no
    # timeout: the pruner (and every prune after it) hung until that transaction ended.
    _only_partitions(admin)
    insert(pg, make_job(), make_job(), make_job())
    held, *others = acquire(pg)
    complete(pg, held, *others, now=T0)
    params = ArchivePruneParams(now=at(3600), default_before=at(60), default_dead_before=at(60))
    with psycopg.connect(postgres_database) as holder:
        holder.execute("SELECT id FROM archive WHERE id = %s FOR UPDATE", (held.id,))
        assert _before_release(holder, lambda: pg.archive_prune(params)) == 2
        assert _before_release(holder, lambda: pg.archive_prune(params)) == 0
    assert pg.archive_prune(params) == 1
    assert admin.execute("SELECT count(*) FROM archive").fetchone() == (0,)


def test_two_pruners_dropping_one_partition_do_not_fail(
    pg: PostgresBackend, admin: Conn, postgres_database: str
) -> None:
    # Before (0001's function): the partition was looked up before the partitions' advisory lock, so a second
    # pruner that found the same partition due waited for the first's lock, then counted the rows of a table
    # the first had dropped: "relation does not exist", a BackendError in its pruner. The order is forced: the
    # first pruner's drop runs in a transaction held open, the second's waits for its lock meanwhile.
    day = date(2031, 5, 1)
    _only_partitions(admin, day)
    with psycopg.connect(postgres_database) as first, ThreadPoolExecutor(1) as pool:
        with first.transaction():
            assert first.execute("SELECT conveyor_archive_partition_drop(%s)", (_name(day),)).fetchone() == (0,)
            second = pool.submit(
                lambda: admin.execute("SELECT conveyor_archive_partition_drop(%s)", (_name(day),)).fetchone()
            )
            with pytest.raises(FutureTimeout):
                second.result(timeout=0.3)  # waiting for the first's lock
        assert second.result(timeout=10) == (0,)  # gone: another pruner took it
    assert _name(day) not in _partitions(admin)
    with pytest.raises(psycopg.errors.RaiseException, match="not an archive partition"):
        admin.execute("SELECT conveyor_archive_partition_drop('jobs')")


def _rows_read(node: dict[str, Any], table: str) -> int:
    """Rows the scans of ``table`` (its partitions included) in a JSON plan returned, over all their loops."""
    own = 0
    if str(node.get("Relation Name", "")).startswith(table):
        own = int(node["Actual Rows"]) * int(node["Actual Loops"])
    return own + sum(_rows_read(child, table) for child in node.get("Plans", []))


def test_the_row_by_row_prune_reads_about_as_many_rows_as_it_deletes(pg: PostgresBackend, admin: Conn) -> None:
    # Before: the delete joined the victims (a CTE the planner counts as `limit` rows) to the archive by a hash
    # of the whole archive: every batch read every row (1.2M rows: ~600 ms a batch of 10,000, against ~75 ms).
    admin.execute(
        "INSERT INTO archive (id, queue, task, payload, headers, state, priority, run_at, enqueued_at, attempts,"
        " deliveries, max_attempts, max_deliveries, finished_at)"
        " SELECT gen_random_uuid(), 'q', 't', '{}', '{}', 'completed', 0, %(t)s, %(t)s, 1, 1, 5, 10,"
        "  %(t)s + g * interval '1 second' FROM generate_series(1, 60000) AS g",
        {"t": T0},
    )
    admin.execute("ANALYZE archive")
    args = {
        "queues": [],
        "befores": [],
        "dead_befores": [],
        "default_before": at(86400),
        "default_dead_before": at(86400),
        "max_cutoff": at(86400),
        "limit": 5000,
    }
    with admin.transaction(force_rollback=True):
        row = admin.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {pg._q['archive_prune_rows']}", args).fetchone()
    assert row is not None
    plan: Any = row[0]
    assert _rows_read(plan[0]["Plan"], "archive") <= 2 * 5000 + 100
