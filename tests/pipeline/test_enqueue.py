"""Bulk enqueue from a DataFrame: batched sends, deterministic keys, and a Spark task retry."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
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


def test_files_in_subdirectories_are_read_whatever_the_headers(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    # A sweep found sub/c.csv dropped when every file had one header (Spark, given the directory, reads
    # only its own files and key=value directories) and read when the headers differed.
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    (src / "a.csv").write_text("sku,qty\nx,1\ny,2\n")
    (src / "sub" / "c.csv").write_text("sku,qty\nz,3\n")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku")
    assert code == 0, output
    assert sorted(payloads(sqlite_url)) == ["x", "y", "z"]
    parquet = tmp_path / "pq"
    (parquet / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"sku": ["p"]}), parquet / "a.parquet")
    pq.write_table(pa.table({"sku": ["q"]}), parquet / "sub" / "b.parquet")
    code, output = enqueue_command(sqlite_url, parquet, "--key-column", "sku")
    assert code == 0, output
    assert sorted(payloads(sqlite_url)) == ["p", "q", "x", "y", "z"]


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


def rows_with_bad_ones(path: Path, n: int = 1000) -> Path:
    """``n`` rows keyed "0", "1", ...; rows 600, 700, 800, 900 and 950 (counted from 1) cannot be jobs."""
    keys = [str(i) for i in range(n)]
    values = [1.0] * n
    texts = ["fine"] * n
    micros = [0] * n
    values[599] = float("nan")
    texts[699] = "a\x00b"
    texts[799] = "x" * 300_000  # over the 256 KiB payload limit
    keys[899] = "k" * 600  # over the key length limit
    micros[949] = 253_402_300_800 * 10**6  # 10000-01-01: past Python's datetime
    when = pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    pq.write_table(pa.table({"k": keys, "v": values, "text": texts, "at": when}), path)
    return path


def test_bad_rows_are_reported_before_anything_is_sent(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: the first bad row (NaN) stopped the run part way, 500 of the 1,000 rows enqueued and the
    # rest not; the message named neither the row nor what had gone in.
    from conveyor.pipeline.enqueue import BadRows

    src = rows_with_bad_ones(tmp_path / "in.parquet")
    with pytest.raises(BadRows) as caught:
        enqueue_dataframe(spark.read.parquet(str(src)), sqlite_url, "q", "t", key_column="k", batch_size=100)
    bad = caught.value
    assert (bad.count, bad.rows) == (5, 1000)
    assert [(n, k) for n, k, _ in bad.examples] == [(600, "599"), (700, "699"), (800, "799")]
    assert "Out of range float values" in bad.examples[0][2] and "NUL" in bad.examples[1][2]
    assert "5 of 1,000 rows cannot be enqueued, so nothing was sent" in str(bad) and "and 2 more" in str(bad)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or payloads(sqlite_url) == {}
    # The two the message does not show: the key and the time.
    good = spark.read.parquet(str(src)).where("k NOT IN ('599', '699', '799')")
    with pytest.raises(BadRows) as caught:
        enqueue_dataframe(good, sqlite_url, "q", "t", key_column="k")
    assert [why.split(":")[0] for _, _, why in caught.value.examples] == [
        "idempotency_key is 600 bytes, over the 512-byte limit",
        "at",
    ]
    # Row numbers count across partitions, in read order.
    split = spark.createDataFrame(
        [(str(i), float("nan") if i == 150 else 1.0) for i in range(200)], "k STRING, v DOUBLE"
    )
    assert split.rdd.getNumPartitions() >= 2
    with pytest.raises(BadRows) as caught:
        enqueue_dataframe(split, sqlite_url, "q", "t", key_column="k")
    assert [(n, k) for n, k, _ in caught.value.examples] == [(151, "150")]
    code, output = enqueue_command(sqlite_url, src, "--key-column", "k")
    assert code == 1 and "Traceback" not in output
    assert len([line for line in output.splitlines() if line.startswith("Error:")]) == 1
    assert "Error: 5 of 1,000 rows cannot be enqueued" in output


def test_a_row_the_database_refuses_is_named_with_the_count_sent_before_it(
    postgres_database_in: Callable[[str], str], tmp_path: Path
) -> None:
    # Before: a row the database refused ended the run with 60-120 lines of Java and Python traceback
    # from Spark's executor log, and no word of which row or how many had gone in.
    url = postgres_database_in("LATIN1")
    backend = open_backend(url)
    backend.migrate()
    backend.close()
    keys = [str(i) for i in range(1000)]
    texts = ["fine"] * 1000
    texts[600] = "5 \u20ac"  # the euro sign: LATIN1 cannot hold it
    pq.write_table(pa.table({"k": keys, "text": texts}), tmp_path / "in.parquet")
    args = ["enqueue", "--db", url, "--input", str(tmp_path / "in.parquet"), "--queue", "q", "--task", "t"]
    args += ["--key-column", "k", "--batch-size", "100", "--master", "local[1]"]
    done = subprocess.run([sys.executable, "-m", "conveyor.pipeline", *args], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert not [line for line in lines if "ERROR" in line or "Traceback" in line or line.startswith("\tat ")], lines
    assert len(lines) <= 6, lines  # the JVM's own start-up notes, Spark's start, the one error line
    assert "the row with key '600' was refused (600 rows of its Spark partition had been sent)" in done.stderr
    assert len(live_jobs(url)) == 600


def test_the_target_is_checked_before_spark_starts(tmp_path: Path) -> None:
    # Before: each of these started Spark (~12 s) and then ended in a traceback dump.
    import time

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"k": ["a"]}), src)
    sqlite = "sqlite:///" + str(tmp_path / "q.db")
    cases = [
        ("postgresql://app:pw-Secr3t@127.0.0.1:1/db", [], "cannot connect to the database"),
        ("postgresql://app:pw-Secr3t@[::1/db", [], "malformed database URL"),
        ("oracle://app:pw-Secr3t@127.0.0.1/db", [], "unsupported database URL scheme"),
        ("mysql://app:pw-Secr3t@127.0.0.1/db", [], "cannot connect to the database"),
        ("memory://", [], "cannot be reached from Spark executors"),
        (sqlite, ["--queue", ""], "--queue"),
        (sqlite, ["--task", "bad\x00name"], "--task"),
    ]
    for url, extra, message in cases:
        started = time.monotonic()
        code, output = enqueue_command(url, src, *extra)
        assert code == 1, output
        assert message in output and "Traceback" not in output and "pw-Secr3t" not in output, output
        assert "starting Spark" not in output and len(output.strip().splitlines()) == 1, output
        assert time.monotonic() - started < 8


def test_a_time_python_cannot_hold_inside_a_struct_stops_the_check_in_one_line(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    # The row check finds top-level times in Spark; one inside a struct fails Python's conversion of
    # its partition, which is told in one line before anything is sent (before: a Spark traceback).
    when = pa.array([0, 253_402_300_800 * 10**6], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    table = pa.table({"k": ["a", "b"], "meta": pa.StructArray.from_arrays([when], names=["at"])})
    pq.write_table(table, tmp_path / "in.parquet")
    code, output = enqueue_command(sqlite_url, tmp_path / "in.parquet", "--key-column", "k")
    assert code == 1 and "Traceback" not in output, output
    assert "Error: checking the rows failed, so nothing was sent" in output and "year" in output, output
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or payloads(sqlite_url) == {}


def test_a_csv_header_naming_a_column_twice_is_refused_before_spark_starts(sqlite_url: str, tmp_path: Path) -> None:
    # Before: Spark renamed them v1, v2 (and V3: it compares names in any case), and the jobs' payloads
    # held columns the file does not have.
    for header, named in (("id,v,v", "'v' twice"), ("id,v,V", "'v' and 'V' twice")):
        (tmp_path / "in.csv").write_text(f"{header}\n1,a,b\n")
        code, output = enqueue_command(sqlite_url, tmp_path / "in.csv", "--key-column", "id")
        assert code == 1 and "Traceback" not in output, output
        assert f"in.csv: the header names column {named}" in output, output
        assert "starting Spark" not in output
    # Parquet: Spark refused it, but after starting, in its own words and naming no file.
    pq.write_table(pa.table([pa.array(["a"]), pa.array(["b"])], names=["k", "K"]), tmp_path / "in.parquet")
    code, output = enqueue_command(sqlite_url, tmp_path / "in.parquet", "--key-column", "k")
    assert code == 1 and "in.parquet: the schema names column 'k' and 'K' twice" in output, output
    assert "starting Spark" not in output
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or payloads(sqlite_url) == {}


def test_compressed_csv_and_suffixes_in_any_case_are_read(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: a.csv.gz, B.CSV and c.csv.bz2 were skipped (only .csv was CSV), a single .Parquet file was
    # refused, and in.csv.zst was skipped too.
    import bz2
    import gzip

    src = tmp_path / "in"
    (src / "region=eu").mkdir(parents=True)
    with gzip.open(src / "region=eu" / "a.csv.gz", "wt", newline="") as f:
        f.write('sku,note\r\na,"two\r\nlines"\r\n')
    (src / "region=eu" / "B.CSV").write_text("sku,note\nb,plain\n")
    with bz2.open(src / "region=eu" / "c.csv.bz2", "wt") as f:
        f.write("sku,note\nc,bz\n")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku", "--payload-column", "region")
    assert code == 0, output
    assert "skipped" not in output and "3 rows: 3 jobs enqueued" in output, output
    assert payloads(sqlite_url) == {"a": {"region": "eu"}, "b": {"region": "eu"}, "c": {"region": "eu"}}
    pq.write_table(pa.table({"sku": ["d"]}), tmp_path / "more.Parquet")
    code, output = enqueue_command(sqlite_url, tmp_path / "more.Parquet", "--key-column", "sku")
    assert code == 0 and "1 rows: 1 jobs enqueued" in output, output
    # A compression neither Python nor every Spark reads is refused, not skipped.
    (src / "region=eu" / "d.csv.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku")
    assert code == 1 and "d.csv.zst: CSV compressed as .zst is not read" in output, output
    # A broken gzip file is one line, before Spark.
    (src / "region=eu" / "d.csv.zst").unlink()
    (src / "region=eu" / "e.csv.gz").write_bytes(b"sku\nnot gzip\n")
    code, output = enqueue_command(sqlite_url, src, "--key-column", "sku")
    assert code == 1 and "e.csv.gz: cannot be read" in output and "starting Spark" not in output, output


def test_the_columns_named_are_checked_before_spark_starts(sqlite_url: str, tmp_path: Path) -> None:
    # Before: Spark started (seconds) before a misspelt --key-column or --payload-column was found.
    (tmp_path / "in.csv").write_text("sku,qty\nx,1\n")
    pq.write_table(pa.table({"sku": ["x"], "qty": [1]}), tmp_path / "in.parquet")
    for name in ("in.csv", "in.parquet"):
        for extra, message in (
            (["--key-column", "SKU_ID"], "key column 'SKU_ID' is not in the input (columns: sku, qty)"),
            (["--payload-column", "qty", "--payload-column", "price"], "payload columns not in the input: price"),
        ):
            code, output = enqueue_command(sqlite_url, tmp_path / name, *extra)
            assert code == 1 and message in output and "Traceback" not in output, output
            assert "starting Spark" not in output, output


def test_parquet_strings_that_are_not_utf8_refuse_the_run(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    # Before: Spark handed both keys to Python as "k\ufffd": one job, and the other row was lost as its
    # duplicate without a word (CSV was checked already; Parquet strings are bytes nobody checked).
    def strings(*values: bytes) -> pa.Array:
        raw = pa.array(values, pa.binary())
        return pa.Array.from_buffers(pa.string(), len(values), raw.buffers())

    pq.write_table(pa.table({"sku": strings(b"ok", b"k\xe9", b"k\xe8"), "n": [1, 2, 3]}), tmp_path / "in.parquet")
    code, output = enqueue_command(sqlite_url, tmp_path / "in.parquet", "--key-column", "sku")
    assert code == 1 and "Traceback" not in output, output
    assert "in.parquet: 2 rows hold strings that are not UTF-8 (the first: row 2 of that file, column 'sku')" in output
    # Nested strings too: a struct's field, with the hashed keys (no key column).
    nested = pa.StructArray.from_arrays([strings(b"fine", b"\xff")], names=["name"])
    pq.write_table(pa.table({"meta": nested}), tmp_path / "nested.parquet")
    code, output = enqueue_command(sqlite_url, tmp_path / "nested.parquet")
    assert (
        code == 1 and "1 rows hold strings that are not UTF-8 (the first: row 2 of that file, column 'meta')" in output
    )
    # A column named _metadata hides Spark's file metadata: the error still names the column.
    pq.write_table(pa.table({"_metadata": strings(b"\xff")}), tmp_path / "meta.parquet")
    code, output = enqueue_command(sqlite_url, tmp_path / "meta.parquet")
    assert code == 1 and "1 rows hold strings that are not UTF-8 (the first: column '_metadata')" in output, output
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or payloads(sqlite_url) == {}


def test_csv_input_without_a_header_row_is_one_line(sqlite_url: str, tmp_path: Path) -> None:
    # Before: a TypeError traceback (no file had a header, so there was no frame to join).
    (tmp_path / "empty.csv").write_bytes(b"")
    code, output = enqueue_command(sqlite_url, tmp_path / "empty.csv")
    assert code == 1 and "no CSV file has a header row" in output and "Traceback" not in output, output


def test_strings_that_are_not_utf8_or_hold_nul_are_refused_naming_column_and_row(
    spark: SparkSession, sqlite_url: str
) -> None:
    # Before: a DataFrame string that is not UTF-8 (here cast from bytes; Spark checks neither that nor
    # Parquet's strings) reached Python with U+FFFD for each bad byte, so the keys 'k\xff' and 'k\xfe'
    # became one job and the other row was counted as a duplicate: 3 rows, 2 jobs, no error.
    from pyspark.sql import functions as F

    from conveyor.pipeline.enqueue import BadRows

    rows = [(b"ok", b"fine", "a"), (b"k\xff", b"fine", "b"), (b"k\xfe", b"fine", "c"), (b"k2", b"n\xe9e", "d")]
    raw = spark.createDataFrame(
        [(bytearray(k), bytearray(note), v) for k, note, v in rows], "k BINARY, note BINARY, v STRING"
    ).coalesce(1)
    df = raw.select(*[F.col(c).cast("string").alias(c) for c in ("k", "note", "v")])
    with pytest.raises(BadRows) as caught:
        enqueue_dataframe(df, sqlite_url, "q", "t", key_column="k")
    assert (caught.value.count, caught.value.rows) == (3, 4)
    assert [(n, why) for n, _, why in caught.value.examples] == [
        (2, "column 'k' holds a string that is not UTF-8"),
        (3, "column 'k' holds a string that is not UTF-8"),
        (4, "column 'note' holds a string that is not UTF-8"),
    ]
    # Before: both keys were named 'k\ufffd' (U+FFFD for the bad byte), so neither could be found in the
    # input; a key that is not UTF-8 is named by its bytes, escaped.
    assert [key for _, key, _ in caught.value.examples] == ["k\\xff", "k\\xfe", "k2"]
    assert "row 2 (key 'k\\\\xff'): column 'k'" in str(caught.value)
    # Nested strings too, and without a key column (the whole row makes the key).
    nested = df.where("k = 'k2'").select(F.struct("note", "v").alias("s"))
    with pytest.raises(BadRows, match=r"row 1: column 's' holds a string that is not UTF-8"):
        enqueue_dataframe(nested, sqlite_url, "q", "t")
    # A NUL is named by its column (the payload check said only "payload").
    nul = spark.createDataFrame([("k1", "a\x00b")], "k STRING, v STRING")
    with pytest.raises(BadRows, match=r"row 1 \(key 'k1'\): column 'v' holds a NUL character"):
        enqueue_dataframe(nul, sqlite_url, "q", "t", key_column="k")
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or live_jobs(sqlite_url) == []
    # A column that is neither the key nor in the payload is not sent, so its bytes do not matter.
    sent = enqueue_dataframe(
        df.where("k = 'k2' OR k = 'ok'"), sqlite_url, "q", "t", key_column="k", payload_columns=["v"]
    )
    assert (sent.rows, sent.enqueued) == (2, 2)


def test_files_spelling_a_column_in_another_case_are_refused(
    spark: SparkSession, sqlite_url: str, tmp_path: Path
) -> None:
    # Before: file a has 'Key', file b 'key'; Spark compares names in any case and read them as one
    # column 'Key' (CSV and Parquet alike): b's values went into a's column without a word, and
    # --key-column key was not found once Spark had started.
    from conveyor.pipeline import reconcile
    from conveyor.pipeline._input import list_input, read_input

    for fmt in ("csv", "parquet"):
        src = tmp_path / fmt
        src.mkdir()
        if fmt == "csv":
            (src / "a.csv").write_text("Key,status\na1,pending\n")
            (src / "b.csv").write_text("status,key\npending,b1\n")
        else:
            pq.write_table(pa.table({"Key": ["a1"], "status": ["pending"]}), src / "a.parquet")
            pq.write_table(pa.table({"key": ["b1"], "status": ["pending"]}), src / "b.parquet")
        both = f"column 'Key' ({src / f'a.{fmt}'}) and column 'key' ({src / f'b.{fmt}'}) differ only in case"
        code, output = enqueue_command(sqlite_url, src, "--key-column", "key")
        assert code == 1 and "Traceback" not in output and "starting Spark" not in output, output
        assert both in output.replace("\n", ""), output
        # The Python API reads files through read_input as well: reconcile of the directory.
        with pytest.raises(PipelineError, match="differ only in case"):
            read_input(spark, list_input(src))
        with pytest.raises(PipelineError, match="differ only in case"):
            reconcile(src, "key", "status", export_dir=tmp_path, spark=spark)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or payloads(sqlite_url) == {}


def test_a_queue_past_its_max_depth_stops_the_run_and_a_rerun_sends_the_rest_once(
    spark: SparkSession, sqlite_url: str
) -> None:
    # Before: the executors' App knew no declaration, so a bulk enqueue pushed 20 jobs into a queue
    # declared with max_depth=10 (normal sends refused at 8) without a word.
    from datetime import UTC, datetime

    from conveyor import App
    from conveyor.backends.base import ArchiveReadParams, Finish, JobsAcquireParams, JobsFinishParams

    app = App(sqlite_url)
    app.queue("ingest", max_depth=10)

    def drain() -> None:
        backend = open_backend(sqlite_url)
        try:
            now = datetime.now(UTC)
            got = backend.jobs_acquire(
                JobsAcquireParams(queue="ingest", limit=100, visibility_timeout=60, worker_id="w", now=now)
            )
            items = [Finish(id=d.id, receipt=d.receipt, state="completed") for d in got]
            backend.jobs_finish_many(JobsFinishParams(items=items, now=now))
        finally:
            backend.close()

    df = spark.createDataFrame([(f"k{i}",) for i in range(20)], "k STRING").coalesce(1)
    try:
        with pytest.raises(PipelineError, match=r"queue 'ingest' is full.*run it again to send the rest"):
            enqueue_dataframe(df, sqlite_url, "ingest", "t", key_column="k", batch_size=4, app=app)
        # The retried Spark task sent its first batches again: held keys, no second job.
        first = live_jobs(sqlite_url)
        assert 0 < len(first) <= 8 and len({j.idempotency_key for j in first}) == len(first)
        # Each run after the queue drained sends up to the mark; one of them finishes the input.
        for _ in range(10):
            drain()
            try:
                enqueue_dataframe(df, sqlite_url, "ingest", "t", key_column="k", batch_size=4, app=app)
                break
            except PipelineError:
                continue
        drain()
        backend = open_backend(sqlite_url)
        try:
            archived = backend.archive_read(ArchiveReadParams(after=None, limit=1000))
        finally:
            backend.close()
        keys = [r.idempotency_key for r in archived]
        assert sorted(keys, key=lambda k: int(str(k)[1:])) == [f"k{i}" for i in range(20)]
    finally:
        app.close()
