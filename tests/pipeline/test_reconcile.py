"""Reconcile: every class on a hand-made history, then requeueing the lost against real databases."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from conveyor import App, Message
from conveyor.backends import open_backend
from conveyor.backends.base import Finish, JobsAcquireParams, JobsFinishParams, JobsListParams
from conveyor.pipeline import PipelineError, read_watermark, reconcile

from .history import at, job_row

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark")

SNAPSHOT = at(3600)


def history() -> list[dict[str, object]]:
    live = {"source": "live", "queue": "q"}
    done = {"source": "archive", "queue": "q"}
    return [
        job_row(job_id="j2", idempotency_key="k2", state="pending", enqueued_at=at(3000), **live),
        job_row(job_id="j3", idempotency_key="k3", state="pending", enqueued_at=at(3590), **live),
        job_row(job_id="j4", idempotency_key="k4", state="processing", enqueued_at=at(0), started_at=at(3480), **live),
        job_row(job_id="j5", idempotency_key="k5", enqueued_at=at(10), finished_at=at(20), **done),
        job_row(job_id="j6", idempotency_key="k6", state="dead", enqueued_at=at(10), finished_at=at(20), **done),
        job_row(job_id="j7", idempotency_key="k7", enqueued_at=at(10), finished_at=at(20), **done),
        # k9: a dead letter replayed a minute before the snapshot; the replay decides.
        job_row(job_id="j9", idempotency_key="k9", state="dead", enqueued_at=at(100), finished_at=at(200), **done),
        job_row(job_id="j9b", idempotency_key="k9", replay_of="j9", state="pending", enqueued_at=at(3540), **live),
        # k10: waiting for a retry due after the snapshot is not stuck, however old.
        job_row(job_id="j10", idempotency_key="k10", state="pending", enqueued_at=at(0), run_at=at(3700), **live),
        job_row(job_id="j11", idempotency_key="k11", state="expired", enqueued_at=at(0), finished_at=at(60), **done),
        job_row(
            job_id="j12", idempotency_key="k12", enqueued_at=at(0), finished_at=at(60), source="archive", queue="other"
        ),
        # k14 ended between the live snapshot and the archive read: seen in both, the archive wins.
        job_row(
            job_id="j14", idempotency_key="k14", state="processing", enqueued_at=at(0), started_at=at(3590), **live
        ),
        job_row(job_id="j14", idempotency_key="k14", enqueued_at=at(0), finished_at=at(3595), **done),
    ]


BUSINESS = [
    ("k1", "pending", "lost"),
    ("k2", "pending", "stuck"),
    ("k3", "pending", "ok"),
    ("k4", "pending", "stuck"),
    ("k5", "pending", "done_not_recorded"),
    ("k6", "pending", "dead"),
    ("k7", "done", "ok"),
    ("k8", "done", "ok"),
    ("k9", "pending", "ok"),
    ("k10", "pending", "ok"),
    ("k11", "PENDING ", "dead"),
    ("k12", "pending", "lost"),
    ("k14", "pending", "done_not_recorded"),
]


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["order_id", "status", "amount"])
        for i, (key, status) in enumerate(rows):
            w.writerow([key, status, i])
    return path


def test_every_class_from_an_export_snapshot(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    export_dir = write_history(history(), snapshot_at=SNAPSHOT)
    biz = write_csv(tmp_path / "orders.csv", [(k, s) for k, s, _ in BUSINESS])
    out = tmp_path / "out"
    result = reconcile(
        biz, "order_id", "status", export_dir=export_dir, queue="q", default_sla=60.0, out_dir=out, spark=spark
    )
    got = {r["key"]: r["class"] for r in spark.read.parquet(str(out / "reconcile")).collect()}
    assert got == {k: c for k, _, c in BUSINESS}
    assert result.counts == {"ok": 5, "lost": 2, "stuck": 2, "dead": 2, "done_not_recorded": 2}
    assert result.lost_keys == ["k1", "k12"] and result.snapshot_at == SNAPSHOT
    ages = {r["key"]: r["age_s"] for r in spark.read.parquet(str(out / "reconcile")).collect()}
    assert (ages["k2"], ages["k4"]) == (600, 120)
    # A per-queue SLA longer than both ages makes nothing stuck.
    longer = reconcile(biz, "order_id", "status", export_dir=export_dir, queue="q", sla={"q": 900}, spark=spark)
    assert longer.counts["stuck"] == 0 and longer.counts["ok"] == 7


def test_job_id_keys_follow_replays(spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path) -> None:
    export_dir = write_history(history(), snapshot_at=SNAPSHOT)
    biz = tmp_path / "orders.parquet"
    pq.write_table(pa.table({"job": ["j5", "j9", "gone"], "state": ["pending", "pending", "pending"]}), biz)
    result = reconcile(biz, "job", "state", export_dir=export_dir, key_kind="job_id", spark=spark)
    assert result.counts == {"ok": 1, "lost": 1, "stuck": 0, "dead": 0, "done_not_recorded": 1}
    assert result.lost_keys == ["gone"]


def test_requeue_lost_twice_enqueues_once(spark: SparkSession, database_url: str, tmp_path: Path) -> None:
    backend = open_backend(database_url)
    backend.migrate()
    app = App(database_url)
    try:
        app.send_many([Message(task="fulfil", payload={}, queue="orders", idempotency_key=k) for k in ("a1", "a2")])
        now = datetime.now(UTC)
        (d,) = backend.jobs_acquire(
            JobsAcquireParams(queue="orders", limit=1, visibility_timeout=60, worker_id="w", now=now)
        )
        backend.jobs_finish_many(JobsFinishParams(items=[Finish(d.id, d.receipt, "completed")], now=now))
        biz = write_csv(
            tmp_path / "orders.csv",
            [("a1", "pending"), ("a2", "pending"), ("a3", "pending"), ("a4", "pending"), ("a5", "shipped")],
        )
        kwargs = dict(queue="orders", task="fulfil", requeue_lost=True, payload_columns=["amount"], spark=spark)
        first = reconcile(biz, "order_id", "status", database_url, **kwargs)  # type: ignore[arg-type]
        assert first.counts == {"ok": 2, "lost": 2, "stuck": 0, "dead": 0, "done_not_recorded": 1}
        assert (first.requeued, first.already_queued) == (2, 0)
        second = reconcile(biz, "order_id", "status", database_url, **kwargs)  # type: ignore[arg-type]
        assert second.counts == {"ok": 4, "lost": 0, "stuck": 0, "dead": 0, "done_not_recorded": 1}
        assert (second.requeued, second.already_queued) == (0, 0)
        live = backend.jobs_list(JobsListParams(queue="orders"))
        assert sorted(j.idempotency_key or "" for j in live) == ["a2", "a3", "a4"]
        requeued = [j for j in live if j.idempotency_key == "a3"]
        assert requeued[0].task == "fulfil" and json.loads(requeued[0].payload) == {"order_id": "a3", "amount": "2"}
    finally:
        app.close()
        backend.close()


def test_bad_input(spark: SparkSession, tmp_path: Path, write_history: Callable[..., Path]) -> None:
    biz = write_csv(tmp_path / "orders.csv", [("k1", "pending")])
    with pytest.raises(PipelineError, match="--db"):
        reconcile(biz, "order_id", "status", spark=spark)
    no_live = write_history(history())
    with pytest.raises(PipelineError, match="no live snapshot"):
        reconcile(biz, "order_id", "status", export_dir=no_live, spark=spark)
    with pytest.raises(PipelineError, match="column 'nope'"):
        reconcile(biz, "nope", "status", export_dir=no_live, spark=spark)
    with pytest.raises(PipelineError, match="does not exist"):
        reconcile(tmp_path / "missing.csv", "order_id", "status", export_dir=no_live, spark=spark)
    with pytest.raises(PipelineError, match="requeue"):
        reconcile(biz, "order_id", "status", export_dir=no_live, requeue_lost=True, spark=spark)


def test_an_empty_queue_makes_every_pending_record_lost(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    backend = open_backend(sqlite_url)
    backend.migrate()
    backend.close()
    biz = write_csv(tmp_path / "orders.csv", [("k1", "pending"), ("k2", "pending"), ("k3", "done")])
    result = reconcile(biz, "order_id", "status", sqlite_url, spark=spark)
    assert result.counts == {"ok": 1, "lost": 2, "stuck": 0, "dead": 0, "done_not_recorded": 0}


def test_business_table_over_jdbc(spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path) -> None:
    import sqlite3

    from conveyor.pipeline.spark import jdbc_jars

    # scripts/test.sh installs the driver; a machine without it fails here rather than skipping.
    assert jdbc_jars("jdbc:sqlite:"), "no SQLite JDBC driver: apt-get install libxerial-sqlite-jdbc-java"
    db = tmp_path / "business.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (order_id TEXT, status TEXT)")
        conn.executemany("INSERT INTO orders VALUES (?, ?)", [("k1", "pending"), ("k5", "pending"), ("k7", "done")])
    conn.close()
    export_dir = write_history(history(), snapshot_at=SNAPSHOT)
    result = reconcile(
        f"jdbc:sqlite:{db}", "order_id", "status", export_dir=export_dir, business_table="orders", spark=spark
    )
    assert result.counts == {"ok": 1, "lost": 1, "stuck": 0, "dead": 0, "done_not_recorded": 1}
    with pytest.raises(PipelineError, match="over JDBC"):
        reconcile(f"jdbc:sqlite:{db}", "order_id", "status", export_dir=export_dir, business_table="nope", spark=spark)


def test_business_table_in_postgresql_over_jdbc(
    spark: SparkSession, postgres_database: str, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    import psycopg
    from click.testing import CliRunner
    from psycopg.conninfo import conninfo_to_dict

    from conveyor.pipeline.cli import main
    from conveyor.pipeline.spark import jdbc_jars

    # scripts/test.sh installs the driver; a machine without it fails here rather than skipping.
    assert jdbc_jars("jdbc:postgresql:"), "no PostgreSQL JDBC driver: apt-get install libpostgresql-jdbc-java"
    # The business table lives in its own schema of the test's own database (dropped afterwards).
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute("CREATE TABLE shop.orders (order_id text PRIMARY KEY, status text NOT NULL, amount numeric)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO shop.orders VALUES (%s, %s, %s)",
                [(k, status, i) for i, (k, status, _) in enumerate(BUSINESS)],
            )
    info = conninfo_to_dict(postgres_database)
    url = f"jdbc:postgresql://{info['host']}:{info.get('port', 5432)}/{info['dbname']}?user={info['user']}"
    export_dir = write_history(history(), snapshot_at=SNAPSHOT)

    result = reconcile(
        url,
        "order_id",
        "status",
        export_dir=export_dir,
        business_table="shop.orders",
        queue="q",
        default_sla=60.0,
        spark=spark,
    )
    assert result.counts == {"ok": 5, "lost": 2, "stuck": 2, "dead": 2, "done_not_recorded": 2}
    assert result.lost_keys == ["k1", "k12"]

    # The same through the command line, with a subquery as the table.
    out = tmp_path / "recon"
    args = ["reconcile", "--business", url, "--business-table", "(SELECT * FROM shop.orders WHERE amount < 5) AS o"]
    args += ["--key-column", "order_id", "--status-column", "status", "--export-dir", str(export_dir)]
    args += ["--queue", "q", "--default-sla", "60", "--out", str(out)]
    cli = CliRunner().invoke(main, args)
    assert cli.exit_code == 0, cli.output
    got = {r["key"]: r["class"] for r in spark.read.parquet(str(out / "reconcile")).collect()}
    assert got == {k: c for k, _, c in BUSINESS[:5]}

    with pytest.raises(PipelineError, match="over JDBC"):
        reconcile(url, "order_id", "status", export_dir=export_dir, business_table="shop.nope", spark=spark)


def test_null_and_nan_keys_are_counted_apart_and_never_requeued(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from conveyor.pipeline.cli import main

    # Before: a null key became the text "None" and NaN "NaN", both classified lost and requeued as jobs
    # with those idempotency keys (payload {"order_id": "None"}), and the command printed "lost: None".
    biz = tmp_path / "orders.parquet"
    keys = pa.array([1.0, None, float("nan"), 4.0, float("inf")], pa.float64())
    pq.write_table(pa.table({"order_id": keys, "status": ["pending"] * 5}), biz)
    migrated = open_backend(sqlite_url)
    migrated.migrate()
    migrated.close()
    args = ["reconcile", "--db", sqlite_url, "--business", str(biz), "--key-column", "order_id"]
    args += ["--status-column", "status", "--requeue-lost", "--queue", "orders", "--task", "fulfil"]
    cli = CliRunner().invoke(main, args, env={"COLUMNS": "250"})
    assert cli.exit_code == 0, cli.output
    assert [line for line in cli.output.splitlines() if line.startswith("lost:")] == ["lost: 1, 4"]
    assert "no key: 3 records have no usable order_id (null, NaN or empty)" in cli.output
    backend = open_backend(sqlite_url)
    try:
        live = backend.jobs_list(JobsListParams(queue="orders"))
    finally:
        backend.close()
    assert sorted(j.idempotency_key or "" for j in live) == ["1", "4"]
    assert sorted(json.loads(j.payload)["order_id"] for j in live) == ["1", "4"]
    result = reconcile(biz, "order_id", "status", sqlite_url, spark=spark)
    assert result.no_key == 3 and result.counts["lost"] == 0 and result.counts["ok"] == 2


def test_float_keys_match_the_jobs_of_their_whole_numbers(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: a Parquet order_id of 1.0 was the key "1.0", so the jobs "1" and "2" matched nothing, every
    # record was lost, and --requeue-lost enqueued "1.0" and "2.0" beside them (duplicates).
    with App(sqlite_url) as app:
        app.send_many([Message(task="fulfil", payload={}, queue="orders", idempotency_key=k) for k in ("1", "2")])
    biz = tmp_path / "orders.parquet"
    pq.write_table(pa.table({"order_id": [1.0, 2.0, 3.0], "status": ["pending"] * 3}), biz)
    kwargs = dict(queue="orders", task="fulfil", requeue_lost=True, spark=spark)
    result = reconcile(biz, "order_id", "status", sqlite_url, **kwargs)  # type: ignore[arg-type]
    assert result.counts == {"ok": 2, "lost": 1, "stuck": 0, "dead": 0, "done_not_recorded": 0}
    assert result.lost_keys == ["3"] and (result.requeued, result.already_queued) == (1, 0)
    backend = open_backend(sqlite_url)
    try:
        assert sorted(j.idempotency_key or "" for j in backend.jobs_list(JobsListParams())) == ["1", "2", "3"]
    finally:
        backend.close()
    # Bulk enqueue makes the same text of a float key: a second enqueue of the table adds nothing.
    from conveyor.pipeline import enqueue_dataframe

    again = enqueue_dataframe(spark.read.parquet(str(biz)), sqlite_url, "orders", "fulfil", key_column="order_id")
    assert (again.rows, again.enqueued, again.duplicates) == (3, 0, 3)


def test_column_names_with_a_dot(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: Spark read "order.id" as field "id" of a struct "order": UNRESOLVED_COLUMN.
    biz = tmp_path / "orders.parquet"
    table = {"order.id": ["a", "b"], "order.status": ["pending", "done"], "order.amount": [5, 6]}
    pq.write_table(pa.table(table), biz)
    migrated = open_backend(sqlite_url)
    migrated.migrate()
    migrated.close()
    kwargs = dict(queue="orders", task="fulfil", requeue_lost=True, payload_columns=["order.amount"], spark=spark)
    result = reconcile(biz, "order.id", "order.status", sqlite_url, out_dir=tmp_path / "out", **kwargs)  # type: ignore[arg-type]
    assert result.counts["lost"] == 1 and result.requeued == 1
    backend = open_backend(sqlite_url)
    try:
        (job,) = backend.jobs_list(JobsListParams())
    finally:
        backend.close()
    assert json.loads(job.payload) == {"order.id": "a", "order.amount": 5}
    from conveyor.pipeline import enqueue_dataframe

    sent = enqueue_dataframe(spark.read.parquet(str(biz)), sqlite_url, "orders", "fulfil", key_column="order.id")
    assert (sent.enqueued, sent.duplicates) == (1, 1)


def test_the_command_checks_its_database_and_requeue_target_before_spark_starts(tmp_path: Path) -> None:
    # Before: an unreachable --db or a bad --queue for --requeue-lost was found after Spark's start-up.
    from click.testing import CliRunner

    from conveyor.pipeline.cli import main

    biz = write_csv(tmp_path / "orders.csv", [("k1", "pending")])
    base = ["reconcile", "--business", str(biz), "--key-column", "order_id", "--status-column", "status"]
    sqlite = "sqlite:///" + str(tmp_path / "q.db")
    cases = [
        (["--db", "postgresql://app:pw-Secr3t@127.0.0.1:1/db"], "cannot connect to the database"),
        (["--db", sqlite, "--requeue-lost", "--queue", "", "--task", "t"], "--queue"),
        (["--db", sqlite, "--requeue-lost", "--task", "t"], "--requeue-lost needs --queue and --task"),
    ]
    for extra, message in cases:
        cli = CliRunner().invoke(main, [*base, *extra], env={"COLUMNS": "250"})
        assert cli.exit_code != 0 and message in cli.output and "pw-Secr3t" not in cli.output, cli.output
        assert "starting Spark" not in cli.output and "Traceback" not in cli.output, cli.output


def test_the_command_says_which_files_it_did_not_read(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from conveyor.pipeline.cli import main

    export_dir = write_history(history(), snapshot_at=SNAPSHOT)
    src = tmp_path / "orders"
    src.mkdir()
    write_csv(src / "orders.csv", [("k1", "pending")])
    (src / "notes.txt").write_text("order_id,status\nk5,pending\n")
    args = ["reconcile", "--business", str(src), "--key-column", "order_id", "--status-column", "status"]
    cli = CliRunner().invoke(main, [*args, "--export-dir", str(export_dir)], env={"COLUMNS": "250"})
    assert cli.exit_code == 0, cli.output
    assert "skipped 1 files that are not CSV: notes.txt" in cli.output and "lost: k1" in cli.output


def test_the_command_checks_its_csv_and_columns_before_spark_starts(tmp_path: Path) -> None:
    # Before: Spark started (seconds) before the business CSV's bytes and the columns named were checked.
    from click.testing import CliRunner

    from conveyor.pipeline.cli import main

    (tmp_path / "latin1.csv").write_bytes(b"order_id,status\nk\xe9,pending\n")
    good = write_csv(tmp_path / "orders.csv", [("k1", "pending")])
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    cases = [
        (tmp_path / "latin1.csv", [], "latin1.csv: 1 lines hold bytes that are not UTF-8 (the first: line 2)"),
        (good, ["--payload-column", "price"], "column 'price' is not in the business table"),
    ]
    for path, extra, message in cases:
        args = ["reconcile", "--business", str(path), "--key-column", "order_id", "--status-column", "status"]
        cli = CliRunner().invoke(main, [*args, "--export-dir", str(export_dir), *extra], env={"COLUMNS": "250"})
        assert cli.exit_code == 1 and message in cli.output, cli.output
        assert "starting Spark" not in cli.output and "Traceback" not in cli.output, cli.output


def test_a_job_that_finished_far_in_the_future_is_reconciled_with_a_warning(
    spark: SparkSession, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: reconcile exported first, and the export refuses an archived job that finished more than a
    # day ahead, so reconcile stopped on it. Its finish time does not matter to "does this key have a
    # job": it is now reconciled as any other job, and the result (and the command) warns about it.
    from click.testing import CliRunner

    from conveyor.pipeline import export
    from conveyor.pipeline.cli import main

    with App(database_url, migrate=True) as app:
        app.send_many([Message(task="fulfil", payload={}, queue="orders", idempotency_key=k) for k in ("f1", "p1")])
    backend = open_backend(database_url)
    try:
        late = datetime(2999, 1, 1, tzinfo=UTC)
        (d,) = backend.jobs_acquire(
            JobsAcquireParams(queue="orders", limit=1, visibility_timeout=60, worker_id="w", now=datetime.now(UTC))
        )
        backend.jobs_finish_many(JobsFinishParams(items=[Finish(d.id, d.receipt, "completed")], now=late))
    finally:
        backend.close()
    biz = write_csv(tmp_path / "orders.csv", [("f1", "pending"), ("p1", "pending"), ("x1", "pending")])
    export_dir = tmp_path / "export"
    with caplog.at_level(logging.WARNING, logger="conveyor.pipeline"):
        result = reconcile(biz, "order_id", "status", database_url, export_dir=export_dir, spark=spark)
    assert result.counts == {"ok": 1, "lost": 1, "stuck": 0, "dead": 0, "done_not_recorded": 1}
    (warning,) = result.warnings
    # Before: a Python caller heard of it only by reading result.warnings; it is logged, once.
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("conveyor.pipeline", logging.WARNING, f"reconcile: {warning}")
    ]
    assert f"1 archived jobs finished more than a day after now (the first: job {d.id}" in warning
    assert "`conveyor export` refuses them" in warning
    # The export directory reconcile refreshed holds the other job, not the far-future one, which the
    # export still refuses by name.
    assert read_watermark(export_dir).live_rows == 1 and read_watermark(export_dir).archive_rows == 0
    with pytest.raises(PipelineError, match="1 archived jobs finished more than a day after now"):
        export(database_url, export_dir)
    args = ["reconcile", "--business", str(biz), "--key-column", "order_id", "--status-column", "status"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="conveyor.pipeline"):
        cli = CliRunner().invoke(main, [*args, "--db", database_url], env={"COLUMNS": "250"})
    assert cli.exit_code == 0, cli.output
    assert "warning: 1 archived jobs finished more than a day after now" in cli.output and "lost: x1" in cli.output
    # The command prints it (once) and does not log it as well: without a logging set-up, Python's
    # last-resort handler would print the logged copy to stderr a second time.
    assert cli.output.count("1 archived jobs finished more than a day after now") == 1 and caplog.records == []


def test_requeue_lost_keeps_the_queue_max_depth(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: the requeue's App knew no declaration, so the lost records went past max_depth.
    backend = open_backend(sqlite_url)
    backend.migrate()
    backend.close()
    biz = write_csv(tmp_path / "orders.csv", [(f"k{i}", "pending") for i in range(5)])
    small = App(sqlite_url)
    small.queue("orders", max_depth=5)  # normal sends refused past 4 live jobs: the batch of 5 is
    big = App(sqlite_url)
    big.queue("orders", max_depth=10)
    kw: dict[str, object] = {"spark": spark, "requeue_lost": True, "queue": "orders", "task": "fulfil"}
    try:
        with pytest.raises(PipelineError, match=r"requeue stopped after 0 lost records.*is full.*run it again"):
            reconcile(biz, "order_id", "status", sqlite_url, app=small, **kw)  # type: ignore[arg-type]
        backend = open_backend(sqlite_url)
        try:
            assert backend.jobs_list(JobsListParams()) == []
        finally:
            backend.close()
        result = reconcile(biz, "order_id", "status", sqlite_url, app=big, **kw)  # type: ignore[arg-type]
        assert (result.requeued, result.already_queued) == (5, 0)
    finally:
        small.close()
        big.close()


def test_a_record_without_status_is_counted_apart_and_a_key_on_several_records_is_sent_once(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    # Before: a null or blank status counted as settled ("ok"), which hid those records from "lost"; and two lost
    # records of one key were both sent, the second silently "already queued" with its payload dropped.
    biz = tmp_path / "orders.parquet"
    rows = [
        ("a1", "pending", 1),
        ("a1", "pending", 1),  # the same record twice (a duplicated export row): sent once
        ("b1", None, 2),
        ("c1", "  ", 3),
        ("d1", "pending", 4),
        ("d1", "pending", 5),  # the same key with another payload: which is right is the business's to say
        ("e1", "done", 6),
    ]
    keys, statuses, amounts = zip(*rows, strict=True)
    pq.write_table(pa.table({"order_id": list(keys), "status": list(statuses), "amount": list(amounts)}), biz)
    migrated = open_backend(sqlite_url)
    migrated.migrate()
    migrated.close()
    result = reconcile(
        biz,
        "order_id",
        "status",
        sqlite_url,
        queue="orders",
        task="fulfil",
        requeue_lost=True,
        payload_columns=["amount"],
        spark=spark,
    )
    assert result.counts == {"ok": 1, "lost": 4, "stuck": 0, "dead": 0, "done_not_recorded": 0}
    assert (result.no_status, result.requeued, result.already_queued, result.not_requeued) == (2, 1, 0, 2)
    assert any(
        w.startswith("2 keys are on more than one business record") and "'a1', 'd1'" in w for w in result.warnings
    )
    assert any(w.startswith("2 lost records were not requeued") and "'d1'" in w for w in result.warnings)
    backend = open_backend(sqlite_url)
    try:
        live = backend.jobs_list(JobsListParams(queue="orders"))
    finally:
        backend.close()
    assert [(j.idempotency_key, json.loads(j.payload)) for j in live] == [("a1", {"order_id": "a1", "amount": 1})]


def test_listed_settled_statuses_make_any_other_status_no_status(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    # Before: every status that was not pending counted as settled ("ok"), so a typo ("pendng") or a status the
    # business added later hid its records from "lost"; there was no way to list the settled ones.
    from click.testing import CliRunner

    from conveyor.pipeline.cli import main

    rows = [job_row(job_id="a", queue="q", idempotency_key="k1", state="pending", source="live", enqueued_at=at(10))]
    src = write_history(rows, snapshot_at=at(30))
    biz = tmp_path / "orders.csv"
    biz.write_text("id,status\nk1,Done\nk2,pendng\nk3,pending\nk4,\n")
    args = ["reconcile", "--business", str(biz), "--key-column", "id", "--status-column", "status"]
    args += ["--export-dir", str(src), "--settled-status", "done", "--settled-status", "cancelled"]
    cli = CliRunner().invoke(main, args, env={"COLUMNS": "250"})
    assert cli.exit_code == 0, cli.output
    assert "no status: 2 records have a key but no usable status (null, empty or in neither" in cli.output
    assert "lost: k3" in cli.output
    # Without the list, only the null status is apart.
    got = reconcile(biz, "id", "status", export_dir=src, spark=spark)
    assert (got.counts["ok"], got.counts["lost"], got.no_status) == (2, 1, 1)
