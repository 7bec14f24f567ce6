"""Bulk enqueue from a DataFrame: batched sends, deterministic keys, and a Spark task retry."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from conveyor.backends import open_backend
from conveyor.backends.base import JobRecord, JobsListParams
from conveyor.pipeline import PipelineError, enqueue_dataframe
from conveyor.pipeline.enqueue import _useful_line, row_key

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark")


def live_jobs(url: str) -> list[JobRecord]:
    backend = open_backend(url)
    try:
        return backend.jobs_list(JobsListParams(limit=100_000))
    finally:
        backend.close()


def test_a_task_retried_after_a_partial_send_enqueues_nothing_twice(spark: SparkSession, sqlite_url: str) -> None:
    # Defined inside the test so that Spark pickles it by value: the executors cannot import
    # test modules.
    def fail_first_attempt_of_partition_0(sent: int) -> None:
        """After each batch in the executor: the first attempt of partition 0 dies after one batch."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and sent >= 10:
            raise RuntimeError("injected executor failure after the first batch")

    df = spark.createDataFrame([(f"order-{i}", i * 10) for i in range(40)], "order_id STRING, amount INT").repartition(
        2
    )
    result = enqueue_dataframe(
        df,
        sqlite_url,
        "billing",
        "charge",
        key_column="order_id",
        batch_size=10,
        after_batch=fail_first_attempt_of_partition_0,
    )
    jobs = live_jobs(sqlite_url)
    assert len(jobs) == 40
    assert sorted(j.idempotency_key or "" for j in jobs) == sorted(f"order-{i}" for i in range(40))
    assert {j.queue for j in jobs} == {"billing"} and {j.task for j in jobs} == {"charge"}
    # The failed attempt's accumulator updates are dropped; its retry found the first batch held.
    assert (result.rows, result.enqueued, result.duplicates) == (40, 30, 10)
    payloads = [json.loads(j.payload) for j in jobs if j.idempotency_key == "order-3"]
    assert payloads == [{"order_id": "order-3", "amount": 30}]


def test_running_twice_enqueues_nothing_the_second_time_with_hashed_keys(spark: SparkSession, sqlite_url: str) -> None:
    df = spark.createDataFrame([(i, f"user{i}@example.com") for i in range(25)], "user_id INT, email STRING")
    first = enqueue_dataframe(df, sqlite_url, "emails", "welcome", batch_size=7, payload_columns=["email"])
    second = enqueue_dataframe(df, sqlite_url, "emails", "welcome", batch_size=7, payload_columns=["email"])
    assert (first.rows, first.enqueued, first.duplicates) == (25, 25, 0)
    assert (second.rows, second.enqueued, second.duplicates) == (25, 0, 25)
    jobs = live_jobs(sqlite_url)
    assert len(jobs) == 25
    expected = row_key("welcome", {"user_id": 0, "email": "user0@example.com"})
    assert expected in {j.idempotency_key for j in jobs}
    # The key depends on the row's content, not its column order.
    assert row_key("t", {"a": 1, "b": 2}) == row_key("t", {"b": 2, "a": 1}) != row_key("u", {"a": 1, "b": 2})


def test_bad_columns_are_refused_before_anything_is_sent(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    df = spark.createDataFrame([("a", 1), (None, 2)], "k STRING, v INT")
    with pytest.raises(PipelineError, match="not in the input"):
        enqueue_dataframe(df, sqlite_url, "q", "t", key_column="nope")
    with pytest.raises(PipelineError, match="null values"):
        enqueue_dataframe(df, sqlite_url, "q", "t", key_column="k")
    with pytest.raises(PipelineError, match="payload columns"):
        enqueue_dataframe(df, sqlite_url, "q", "t", payload_columns=["x"])
    with pytest.raises(PipelineError, match="batch_size"):
        enqueue_dataframe(df, sqlite_url, "q", "t", batch_size=0)


def test_a_failed_bulk_enqueue_is_told_by_the_line_naming_the_python_error() -> None:
    # Spark's message comes first; the partition's own error is somewhere inside it.
    wrapped = RuntimeError(
        "An error occurred while calling o42.foreachPartition.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure\n"
        '  File "/x/enqueue.py", line 140, in send_partition\n'
        "conveyor._errors.PayloadError: payload of 300000 bytes is over the limit\n"
        "\tat org.apache.spark.api.python.BasePythonRunner"
    )
    assert _useful_line(wrapped) == "conveyor._errors.PayloadError: payload of 300000 bytes is over the limit"
    # Else the first line that says something (before: the empty line before it), or the class's name.
    assert _useful_line(RuntimeError("\n  the executor was lost\nmore")) == "the executor was lost"
    assert _useful_line(RuntimeError()) == "RuntimeError"


def enqueue_command(url: str, input_path: Path, *extra: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from conveyor.pipeline.cli import main

    args = ["enqueue", "--db", url, "--input", str(input_path), "--queue", "q", "--task", "t", *extra]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "250"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def payloads(url: str) -> dict[str, object]:
    return {j.idempotency_key or "": json.loads(j.payload) for j in live_jobs(url)}


def test_csv_is_read_as_rfc_4180(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: the quoted line break split one row into two (a phantom job keyed 'line two"'), and a
    # doubled quote stayed doubled in the payload.
    (tmp_path / "in.csv").write_bytes(b'sku,note\r\na,"line one\r\nline two"\r\nb,"say ""hi"""\r\n')
    code, output = enqueue_command(sqlite_url, tmp_path / "in.csv", "--key-column", "sku")
    assert code == 0, output
    assert "2 rows: 2 jobs enqueued" in output
    assert payloads(sqlite_url) == {
        # Spark's parser reads a line break inside quotes as "\n" (documented).
        "a": {"sku": "a", "note": "line one\nline two"},
        "b": {"sku": "b", "note": 'say "hi"'},
    }


def test_csv_files_with_their_columns_in_other_orders_are_matched_by_name(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    # Before: the first file's header was applied by position to every file: y's qty became its sku
    # ("2"), and the second file's extra column was dropped.
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.csv").write_text("sku,qty\nx,1\n")
    (src / "b.csv").write_text("qty,sku,colour\n2,y,red\n")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku")
    assert code == 0, output
    assert payloads(sqlite_url) == {
        "x": {"sku": "x", "qty": "1", "colour": None},
        "y": {"sku": "y", "qty": "2", "colour": "red"},
    }


def test_parquet_files_keep_a_column_only_a_later_file_has(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"sku": ["x"], "qty": [1]}), src / "a.parquet")
    pq.write_table(pa.table({"qty": [2], "sku": ["y"], "colour": ["red"]}), src / "b.parquet")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku")
    assert code == 0, output
    assert payloads(sqlite_url) == {
        "x": {"sku": "x", "qty": 1, "colour": None},
        "y": {"sku": "y", "qty": 2, "colour": "red"},
    }


def test_only_files_of_the_input_format_are_read(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: every file of the directory was read as CSV: README.txt's lines became jobs.
    src = tmp_path / "in"
    src.mkdir()
    (src / "rows.csv").write_text("sku\nx\n")
    (src / "README.txt").write_text("sku lists\nfor the stock count\n")
    (src / "_SUCCESS").write_text("")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku")
    assert code == 0, output
    assert "skipped 1 files that are not CSV: README.txt" in output
    assert list(payloads(sqlite_url)) == ["x"]
    # CSV beside Parquet: which was meant cannot be told; refused before Spark starts.
    pq.write_table(pa.table({"sku": ["z"]}), src / "more.parquet")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku")
    assert code == 1 and "holds both CSV and Parquet files" in output and "Traceback" not in output
    assert list(payloads(sqlite_url)) == ["x"]


def test_csv_bytes_that_are_not_utf8_refuse_the_run(sqlite_url: str, tmp_path: Path) -> None:
    # Before: both keys became "k\ufffd", one job, and the other row was lost without a word.
    (tmp_path / "in.csv").write_bytes(b"sku\nk\xe9\nk\xe8\nok\n")
    code, output = enqueue_command(sqlite_url, tmp_path / "in.csv", "--key-column", "sku")
    assert code == 1 and "Traceback" not in output
    assert "in.csv: 2 lines hold bytes that are not UTF-8 (the first: line 2)" in output
    assert "starting Spark" not in output
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or payloads(sqlite_url) == {}
