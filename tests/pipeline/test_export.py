"""Export against real backends: partitioning, the schema, incremental runs, crash recovery, live snapshot."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from conveyor._ids import uuid7
from conveyor.backends import open_backend
from conveyor.backends.base import (
    Backend,
    ErrorInfo,
    Finish,
    JobsAcquireParams,
    JobsFinishParams,
    JobsInsertParams,
    NewJob,
)
from conveyor.pipeline import PipelineError, export, read_watermark
from conveyor.pipeline.schema import arrow_schema, arrow_schema_with_partitions
from conveyor.pipeline.spark import jdbc_jars

DAY1 = datetime(2026, 3, 1, 23, 0, tzinfo=UTC)
DAY2 = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)


@pytest.fixture
def backend(database_url: str) -> Iterator[Backend]:
    b = open_backend(database_url)
    b.migrate()
    try:
        yield b
    finally:
        b.close()


def insert(backend: Backend, queue: str, n: int, now: datetime, **kw: object) -> list[str]:
    jobs = [
        NewJob(
            id=uuid7(),
            queue=queue,
            task="send",
            payload="{}",
            headers='{"tenant": "acme"}',
            priority=0,
            run_at=now,
            max_attempts=5,
            max_deliveries=10,
            **kw,  # type: ignore[arg-type]
        )
        for _ in range(n)
    ]
    backend.jobs_insert_many(JobsInsertParams(jobs=jobs, now=now))
    return [str(j.id) for j in jobs]


def finish(backend: Backend, queue: str, n: int, now: datetime, state: str = "completed") -> None:
    deliveries = backend.jobs_acquire(
        JobsAcquireParams(queue=queue, limit=n, visibility_timeout=60, worker_id="w1", now=now)
    )
    assert len(deliveries) == n
    error = ErrorInfo("ValueError", "bad input") if state == "dead" else None
    items = [
        Finish(id=d.id, receipt=d.receipt, state=state, error=error, reason="dead_on" if error else None)  # type: ignore[arg-type]
        for d in deliveries
    ]
    assert backend.jobs_finish_many(JobsFinishParams(items=items, now=now)) == n


def exported(out: Path, sub: str = "archive") -> pa.Table:
    return ds.dataset(
        out / sub, format="parquet", partitioning="hive", schema=arrow_schema_with_partitions()
    ).to_table()


def test_export_partitions_by_date_and_queue_and_resumes_without_duplicates(
    backend: Backend, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    insert(backend, "emails", 6, DAY1 - timedelta(minutes=5))
    insert(backend, "billing", 3, DAY1 - timedelta(minutes=5))
    finish(backend, "emails", 4, DAY1)
    finish(backend, "billing", 2, DAY1, state="dead")
    finish(backend, "emails", 2, DAY2)

    first = export(database_url, out, now=DAY2 + timedelta(minutes=1))
    assert (first.run, first.archive_rows, first.live_rows) == (1, 8, 0)
    dirs = sorted(str(p.relative_to(out / "archive")) for p in (out / "archive").glob("*/*"))
    assert dirs == ["date=2026-03-01/queue=billing", "date=2026-03-01/queue=emails", "date=2026-03-02/queue=emails"]
    table = exported(out)
    assert table.schema.equals(arrow_schema_with_partitions())
    rows = table.to_pylist()
    assert len({r["job_id"] for r in rows}) == 8
    dead = [r for r in rows if r["state"] == "dead"]
    assert len(dead) == 2 and {r["queue"] for r in dead} == {"billing"}
    assert dead[0]["error_type"] == "ValueError" and dead[0]["attempts"] == 1 and dead[0]["deliveries"] == 1
    assert json.loads(rows[0]["headers"])["tenant"] == "acme"
    assert all(r["source"] == "archive" and r["finished_at"] is not None for r in rows)

    # Nothing new: a second run adds nothing.
    second = export(database_url, out, now=DAY2 + timedelta(minutes=2))
    assert (second.run, second.archive_rows) == (2, 0)
    # One more job ends: only it is added.
    finish(backend, "billing", 1, DAY2 + timedelta(minutes=3))
    third = export(database_url, out, now=DAY2 + timedelta(minutes=10))
    assert third.archive_rows == 1 and third.watermark.archive_rows == 9
    ids = exported(out).column("job_id").to_pylist()
    assert len(ids) == len(set(ids)) == 9


def test_rows_inside_the_settle_window_wait_for_the_next_run(
    backend: Backend, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    insert(backend, "q", 3, DAY1)
    finish(backend, "q", 2, DAY1 + timedelta(seconds=10))
    finish(backend, "q", 1, DAY1 + timedelta(seconds=20))
    # At 22 s with 5 s of settling, the job that ended at 20 s is too fresh.
    assert export(database_url, out, now=DAY1 + timedelta(seconds=22)).archive_rows == 2
    assert export(database_url, out, now=DAY1 + timedelta(seconds=30)).archive_rows == 1
    assert exported(out).num_rows == 3


def test_a_run_that_crashed_before_committing_leaves_no_duplicates(
    backend: Backend, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    insert(backend, "q", 4, DAY1)
    finish(backend, "q", 4, DAY1 + timedelta(seconds=1))
    export(database_url, out, now=DAY1 + timedelta(minutes=1))
    # Simulate run 2 dying after moving its files into place but before writing the watermark.
    committed = next((out / "archive").rglob("part-r00000001-*.parquet"))
    shutil.copy(committed, committed.with_name("part-r00000002-c00000-0.parquet"))
    (out / "_staging" / "run-00000002").mkdir(parents=True)
    assert exported(out).num_rows == 8
    again = export(database_url, out, now=DAY1 + timedelta(minutes=2))
    assert again.run == 2 and again.archive_rows == 0
    assert exported(out).num_rows == 4
    assert not (out / "_staging").exists()


def test_include_live_writes_a_snapshot_that_replaces_the_previous_one(
    backend: Backend, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    insert(backend, "q", 3, DAY1, idempotency_key=None)
    backend.jobs_acquire(JobsAcquireParams(queue="q", limit=1, visibility_timeout=60, worker_id="w9", now=DAY1))
    result = export(database_url, out, include_live=True, now=DAY1 + timedelta(minutes=1))
    assert result.live_rows == 3 and result.archive_rows == 0
    live = exported(out, "live").to_pylist()
    assert sorted(r["state"] for r in live) == ["pending", "pending", "processing"]
    assert all(r["source"] == "live" and r["finished_at"] is None for r in live)
    assert [r["worker_id"] for r in live if r["state"] == "processing"] == ["w9"]
    assert read_watermark(out).live_snapshot_at == DAY1 + timedelta(minutes=1)

    finish(backend, "q", 2, DAY1 + timedelta(minutes=2))
    result = export(database_url, out, include_live=True, now=DAY1 + timedelta(minutes=3))
    assert (result.live_rows, result.archive_rows) == (1, 2)
    assert exported(out, "live").num_rows == 1


def test_bad_arguments(tmp_path: Path, sqlite_url: str) -> None:
    with pytest.raises(PipelineError, match="page_size must be a whole number from 1"):
        export(sqlite_url, tmp_path / "x", page_size=0)
    for settle in (float("nan"), float("inf"), -1.0, 1e9):
        with pytest.raises(PipelineError, match="--settle must be from 0"):
            export(sqlite_url, tmp_path / "x", settle_seconds=settle)
    with pytest.raises(PipelineError, match="jdbc_partitions"):
        export(sqlite_url, tmp_path / "x", jdbc_partitions=0)
    assert not (tmp_path / "x").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "_watermark.json").write_text("{not json")
    with pytest.raises(PipelineError, match="not a valid export watermark"):
        read_watermark(tmp_path / "bad")


def test_export_over_jdbc_writes_what_the_seam_export_writes(
    spark: SparkSession, postgres_database: str, tmp_path: Path
) -> None:
    # scripts/test.sh installs the driver; a machine without it fails here rather than skipping.
    assert jdbc_jars("jdbc:postgresql:"), "no PostgreSQL JDBC driver: apt-get install libpostgresql-jdbc-java"
    b = open_backend(postgres_database)
    b.migrate()
    try:
        insert(b, "emails", 6, DAY1 - timedelta(minutes=5))
        insert(b, "billing", 3, DAY1 - timedelta(minutes=5))
        finish(b, "emails", 4, DAY1)
        finish(b, "billing", 2, DAY1, state="dead")
        finish(b, "emails", 2, DAY2)
        now = DAY2 + timedelta(minutes=1)
        seam = export(postgres_database, tmp_path / "seam", now=now)
        # Three slices of finished_at read in parallel: every row is in exactly one of them.
        jdbc = export(postgres_database, tmp_path / "jdbc", now=now, via="jdbc", spark=spark, jdbc_partitions=3)
        assert (jdbc.run, jdbc.archive_rows, seam.archive_rows) == (1, 8, 8)
        assert jdbc.watermark == seam.watermark
        assert read_watermark(tmp_path / "jdbc") == read_watermark(tmp_path / "seam")
        assert_same_export(tmp_path / "seam", tmp_path / "jdbc")
        names = sorted(p.name for p in (tmp_path / "jdbc" / "archive").rglob("*.parquet"))
        assert names and all(re.fullmatch(r"part-r00000001-j\d{5}\.parquet", n) for n in names)

        # Incremental with the seam's settling: of two more jobs only the one that ended 5 s or
        # more before the run is read, then the other on the next run; a run with nothing new adds
        # nothing (and starts no Spark job).
        insert(b, "emails", 3, DAY2)
        finish(b, "emails", 1, DAY2 + timedelta(minutes=3))
        finish(b, "emails", 1, DAY2 + timedelta(minutes=9, seconds=58))
        later = DAY2 + timedelta(minutes=10)
        assert export(postgres_database, tmp_path / "seam", now=later).archive_rows == 1
        assert export(postgres_database, tmp_path / "jdbc", now=later, via="jdbc", spark=spark).archive_rows == 1
        last = DAY2 + timedelta(minutes=11)
        assert export(postgres_database, tmp_path / "seam", now=last).archive_rows == 1
        assert export(postgres_database, tmp_path / "jdbc", now=last, via="jdbc", spark=spark).archive_rows == 1
        again = export(postgres_database, tmp_path / "jdbc", now=last, via="jdbc", spark=spark)
        assert (again.run, again.archive_rows, again.files) == (4, 0, 0)
        assert_same_export(tmp_path / "seam", tmp_path / "jdbc")
        assert exported(tmp_path / "jdbc").num_rows == 10

        # The two ways take turns on one directory: each goes on from the other's watermark.
        finish(b, "emails", 1, DAY2 + timedelta(minutes=12))
        end = DAY2 + timedelta(minutes=13)
        assert export(postgres_database, tmp_path / "jdbc", now=end).archive_rows == 1
        assert export(postgres_database, tmp_path / "seam", now=end, via="jdbc", spark=spark).archive_rows == 1
        assert_same_export(tmp_path / "seam", tmp_path / "jdbc")
        assert exported(tmp_path / "seam").num_rows == 11
    finally:
        b.close()


def assert_same_export(a: Path, b: Path) -> None:
    """Two export directories hold the same partitions, schema and rows."""
    dirs = [sorted(str(p.relative_to(d / "archive")) for p in (d / "archive").glob("*/*")) for d in (a, b)]
    assert dirs[0] == dirs[1]
    for path in (b / "archive").rglob("*.parquet"):
        assert pq.read_schema(path).equals(arrow_schema(), check_metadata=False), path
    rows = [sorted(exported(d).to_pylist(), key=lambda r: r["job_id"]) for d in (a, b)]
    assert rows[0] == rows[1]


def test_export_over_jdbc_refuses_other_engines(sqlite_url: str, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="PostgreSQL only"):
        export(sqlite_url, tmp_path / "x", via="jdbc")
    with pytest.raises(PipelineError, match="expected auto, seam, jdbc"):
        export(sqlite_url, tmp_path / "x", via="odbc")


def test_jdbc_connection_keeps_the_password_out_of_the_url() -> None:
    from conveyor.pipeline._jdbc_export import jdbc_connection

    url, props = jdbc_connection("postgresql://app:s%40cret@db.internal:6543/shop?sslmode=require&application_name=x")
    assert url == "jdbc:postgresql://db.internal:6543/shop"
    assert props == {"user": "app", "password": "s@cret", "sslmode": "require", "ApplicationName": "x"}
    assert jdbc_connection("postgres://u@[::1]/d")[0] == "jdbc:postgresql://[::1]:5432/d"
    with pytest.raises(PipelineError, match="TCP host"):
        jdbc_connection("postgresql:///d?host=/var/run/postgresql")


def test_export_refuses_a_directory_that_is_not_an_export(backend: Backend, database_url: str, tmp_path: Path) -> None:
    insert(backend, "q", 2, DAY1)
    finish(backend, "q", 2, DAY1 + timedelta(seconds=1))
    # Someone else's directory, holding a file named like an uncommitted run's (which an export
    # deletes in its own directory) and a file of its own.
    theirs = tmp_path / "theirs"
    (theirs / "archive" / "x").mkdir(parents=True)
    (theirs / "archive" / "x" / "part-r00000001-c00000-0.parquet").write_text("not ours")
    (theirs / "notes.txt").write_text("keep me")
    before = sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*"))
    with pytest.raises(PipelineError, match=r"not empty and holds no _watermark\.json"):
        export(database_url, theirs, now=DAY1 + timedelta(minutes=1))
    assert sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*")) == before
    assert (theirs / "notes.txt").read_text() == "keep me"
    # A new directory, an empty one, and an export directory are all fine.
    (tmp_path / "empty").mkdir()
    assert export(database_url, tmp_path / "empty", now=DAY1 + timedelta(minutes=1)).archive_rows == 2
    assert export(database_url, tmp_path / "empty", now=DAY1 + timedelta(minutes=2)).run == 2
    (tmp_path / "file").write_text("")
    with pytest.raises(PipelineError, match="not a directory"):
        export(database_url, tmp_path / "file")
    # A name the file system cannot hold: one line (before, an OSError traceback from the look at the path).
    with pytest.raises(PipelineError, match=r"\.\.\.: File name too long"):
        export(database_url, tmp_path / ("x" * 300))


def test_auto_reads_over_jdbc_only_where_it_runs_and_pays(
    spark: SparkSession, postgres_database: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    # (The package's `export` is the function; the module is reached by name.)
    monkeypatch.setattr(importlib.import_module("conveyor.pipeline.export"), "JDBC_MIN_ROWS", 5)
    b = open_backend(postgres_database)
    b.migrate()
    try:
        insert(b, "q", 12, DAY1)
        finish(b, "q", 3, DAY1 + timedelta(seconds=1))
        # Three new rows, fewer than the threshold: the seam (no Spark to start).
        small = export(postgres_database, tmp_path / "auto", now=DAY1 + timedelta(minutes=1))
        assert (small.via, small.archive_rows) == ("seam", 3)
        # Nine more: over JDBC, on from the seam's watermark; the result is the seam's.
        finish(b, "q", 9, DAY1 + timedelta(seconds=2))
        big = export(postgres_database, tmp_path / "auto", now=DAY1 + timedelta(minutes=2))
        assert (big.via, big.archive_rows, big.watermark.archive_rows) == ("jdbc", 9, 12)
        export(postgres_database, tmp_path / "seam", now=DAY1 + timedelta(minutes=2), via="seam")
        # The same rows (each run stamps its own exported_at).
        rows = [
            sorted(({**r, "exported_at": None} for r in exported(tmp_path / d).to_pylist()), key=lambda r: r["job_id"])
            for d in ("seam", "auto")
        ]
        assert rows[0] == rows[1] and len(rows[0]) == 12
        # A session passed in has nothing to start: JDBC even for few rows.
        assert export(postgres_database, tmp_path / "given", spark=spark, now=DAY1 + timedelta(minutes=2)).via == "jdbc"
    finally:
        b.close()
    # Other engines: the seam, whatever the size.
    sqlite = open_backend(sqlite_url)
    sqlite.migrate()
    try:
        insert(sqlite, "q", 6, DAY1)
        finish(sqlite, "q", 6, DAY1 + timedelta(seconds=1))
    finally:
        sqlite.close()
    assert export(sqlite_url, tmp_path / "sqlite", now=DAY1 + timedelta(minutes=1)).via == "seam"


def test_a_job_that_finished_far_in_the_future_refuses_the_export(
    backend: Backend, database_url: str, tmp_path: Path
) -> None:
    # Before: a job stamped 2999 (a worker's clock, or raw SQL) stayed behind the settle cutoff on every
    # run: each export ended fine and the job was in none of them. Exported, it would move the
    # watermark past every real job after it; so the export refuses, naming it.
    out = tmp_path / "export"
    insert(backend, "q", 2, DAY1)
    finish(backend, "q", 1, DAY1 + timedelta(seconds=10))
    late = datetime(2999, 1, 1, tzinfo=UTC)
    finish(backend, "q", 1, late)
    with pytest.raises(PipelineError, match=r"1 archived jobs finished more than a day after now .*2999-01-01") as err:
        export(database_url, out, now=DAY2)
    assert "nothing was exported" in str(err.value)
    assert read_watermark(out).run == 0 and not list(out.rglob("*.parquet"))
    # A clock a few hours ahead is skew, not an error: that row waits for a later run, as before.
    assert export(database_url, tmp_path / "other", now=late - timedelta(hours=3)).archive_rows == 1


def test_the_empty_queue_name_is_exported_and_reported(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: the export wrote a "queue=" directory, which Spark refuses to read, so the report failed.
    from conveyor.pipeline import report

    backend = open_backend(sqlite_url)
    backend.migrate()
    try:
        insert(backend, "", 2, DAY1)  # only raw SQL stores such a queue; the seam takes it as it is
        insert(backend, "q", 1, DAY1)
        finish(backend, "", 2, DAY1 + timedelta(seconds=1))
        finish(backend, "q", 1, DAY1 + timedelta(seconds=1))
    finally:
        backend.close()
    out = tmp_path / "export"
    assert export(sqlite_url, out, now=DAY2).archive_rows == 3
    assert sorted(exported(out).column("queue").to_pylist(), key=str) == [None, None, "q"]
    result = report(out, tmp_path / "report", spark=spark)
    assert result.summary["queues"][""]["jobs"] == 2 and result.summary["queues"]["q"]["jobs"] == 1
    assert '<td class="t">(empty)</td>' in (tmp_path / "report" / "report.html").read_text()


def test_the_empty_queue_and_a_queue_named_like_its_label_are_reported_apart(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    # Before: the queue named '' was shown as "(empty)", and so was a real queue named "(empty)": their
    # table rows looked alike and the charts, keyed by label, kept one series of the two.
    import re

    from conveyor.pipeline import report
    from conveyor.pipeline._html import queue_label

    names = {"": 2, "(empty)": 1, "\\(empty)": 3}
    backend = open_backend(sqlite_url)
    backend.migrate()
    try:
        for name, n in names.items():
            insert(backend, name, n, DAY1)
            finish(backend, name, n, DAY1 + timedelta(seconds=1))
    finally:
        backend.close()
    out = tmp_path / "export"
    assert export(sqlite_url, out, now=DAY2).archive_rows == 6
    result = report(out, tmp_path / "report", spark=spark)
    assert {q: s["jobs"] for q, s in result.summary["queues"].items()} == names
    html = (tmp_path / "report" / "report.html").read_text()
    labels = {"": "(empty)", "(empty)": "\\(empty)", "\\(empty)": "\\\\(empty)"}
    for label in labels.values():
        assert f'<td class="t">{label}</td>' in html
    # Each chart of enqueued jobs per minute has one series per queue: three legend entries.
    legend = re.findall(r'font-size="11">([^<]*)</text>', html.split("Enqueued per minute", 1)[1].split("</svg>", 1)[0])
    assert sorted(legend) == sorted(labels.values())
    assert {q: queue_label(q) for q in names} == labels


def test_queue_names_too_long_for_a_directory_name_are_exported_and_reported(
    spark: SparkSession, postgres_database: str, tmp_path: Path
) -> None:
    # Before: a queue name whose escaped bytes passed 255 (200 'é', which the App accepts, is 1,200
    # characters as %C3%A9...) made both exports fail with a traceback (ENAMETOOLONG), and every later
    # run failed the same way: nothing after that job could ever be exported.
    from conveyor.pipeline import report
    from conveyor.pipeline.report import load_jobs

    names = {
        "é" * 200: 2,
        "<script>alert(1)</script>" + "x" * 1_000: 1,  # only raw SQL stores one this long
        "<script>alert(1)</script>" + "y" * 1_000: 1,  # the same first 16 characters: its own directory
        "q" * 64: 1,  # 64 bytes: still its own name as directory name
        "short": 1,
    }
    b = open_backend(postgres_database)
    b.migrate()
    try:
        for name, n in names.items():
            insert(b, name, n, DAY1)
            finish(b, name, n, DAY1 + timedelta(seconds=1))
    finally:
        b.close()
    seam = export(postgres_database, tmp_path / "seam", now=DAY2, via="seam")
    jdbc = export(postgres_database, tmp_path / "jdbc", now=DAY2, via="jdbc", spark=spark)
    assert seam.archive_rows == jdbc.archive_rows == 6
    assert_same_export(tmp_path / "seam", tmp_path / "jdbc")
    dirs = sorted(p.name for p in (tmp_path / "seam" / "archive").glob("*/queue=*"))
    assert len(dirs) == 5 and all(len(d.encode()) < 255 for d in dirs)
    assert f"queue={'q' * 64}" in dirs and "queue=short" in dirs
    for out in ("seam", "jdbc"):
        counts = load_jobs(spark, tmp_path / out).groupBy("queue").count().collect()
        assert {r["queue"]: r["count"] for r in counts} == names
    result = report(tmp_path / "jdbc", tmp_path / "report", spark=spark)
    assert {q: s["jobs"] for q, s in result.summary["queues"].items()} == names
    html = (tmp_path / "report" / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_queue_name_holding_a_nul_is_not_exported_as_another_queue(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    # Before: the directory name ended at the NUL, so the queue "a\x00b" was exported (and reported)
    # as the queue "a", its jobs merged with that queue's.
    from conveyor.pipeline.report import load_jobs

    names = {"a\x00b": 2, "a": 1, "\x00": 1, "x/y": 1, "..": 1}
    backend = open_backend(sqlite_url)
    backend.migrate()
    try:
        for name, n in names.items():
            insert(backend, name, n, DAY1)  # only raw SQL stores a NUL; the seam takes it as it is
            finish(backend, name, n, DAY1 + timedelta(seconds=1))
    finally:
        backend.close()
    out = tmp_path / "export"
    assert export(sqlite_url, out, now=DAY2).archive_rows == 6
    counts = load_jobs(spark, out).groupBy("queue").count().collect()
    assert {r["queue"]: r["count"] for r in counts} == names


def test_long_queue_names_on_mariadb_are_exported_as_on_the_other_engines(
    spark: SparkSession, mysql_database: str, tmp_path: Path
) -> None:
    # The layout of long names (over 64 UTF-8 bytes: a hashed directory and the name in a column) was tested
    # on PostgreSQL and SQLite only. MariaDB stores queue names of up to 200 characters.
    from conveyor.pipeline.report import load_jobs

    names = {"é" * 200: 2, "<b>" + "x" * 197: 1, "<b>" + "y" * 197: 1, "q" * 64: 1, "short": 1}
    b = open_backend(mysql_database)
    b.migrate()
    try:
        for name, n in names.items():
            insert(b, name, n, DAY1)
            finish(b, name, n, DAY1 + timedelta(seconds=1))
    finally:
        b.close()
    assert export(mysql_database, tmp_path / "out", now=DAY2).archive_rows == 6
    dirs = sorted(p.name for p in (tmp_path / "out" / "archive").glob("*/queue=*"))
    assert len(dirs) == 5 and all(len(d.encode()) < 255 for d in dirs)
    assert f"queue={'q' * 64}" in dirs and "queue=short" in dirs
    counts = load_jobs(spark, tmp_path / "out").groupBy("queue").count().collect()
    assert {r["queue"]: r["count"] for r in counts} == names
