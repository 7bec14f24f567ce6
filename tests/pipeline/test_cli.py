"""The pipeline's commands: one-line errors for bad input, and each command end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from conveyor import App, Message
from conveyor.backends import open_backend
from conveyor.backends.base import JobsListParams
from conveyor.pipeline.cli import main

from .history import at, job_row

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark")


def run(*args: str) -> tuple[int, str]:
    # A wide terminal, so that rich does not wrap table cells.
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": "250"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def assert_one_line_error(code: int, output: str, text: str) -> None:
    assert code != 0
    assert "Traceback" not in output
    assert text in output, output
    assert len([line for line in output.splitlines() if line.strip()]) <= 3, output  # usage errors add 2


def test_export_command_is_incremental(sqlite_url: str, tmp_path: Path) -> None:
    with App(sqlite_url) as app:
        app.send_many([Message(task="t", payload={}, queue="q") for _ in range(3)])
    code, output = run("export", "--db", sqlite_url, "--out", str(tmp_path / "x"), "--include-live")
    assert code == 0, output
    assert "export run 1 (via seam): 0 new archive rows" in output and "live snapshot 3 jobs" in output
    code, output = run("export", "--db", sqlite_url, "--out", str(tmp_path / "x"))
    assert code == 0 and "export run 2" in output


def test_export_command_over_jdbc(spark: SparkSession, postgres_database: str, tmp_path: Path) -> None:
    from datetime import timedelta

    from .test_export import DAY1, finish, insert

    b = open_backend(postgres_database)
    b.migrate()
    try:
        insert(b, "q", 5, DAY1)
        finish(b, "q", 5, DAY1 + timedelta(seconds=1))
    finally:
        b.close()
    args = ["export", "--db", postgres_database, "--out", str(tmp_path / "x"), "--via", "jdbc"]
    code, output = run(*args, "--jdbc-partitions", "2")
    assert code == 0, output
    assert "export run 1 (via jdbc): 5 new archive rows" in output
    code, output = run(*args)
    assert code == 0 and "export run 2 (via jdbc): 0 new archive rows (5 in total)" in output
    assert_one_line_error(
        *run("export", "--db", "sqlite:///" + str(tmp_path / "s.db"), "--out", str(tmp_path / "y"), "--via", "jdbc"),
        "PostgreSQL only",
    )


def test_bad_input_is_one_line_without_spark(tmp_path: Path) -> None:
    assert_one_line_error(*run("report", "--input", str(tmp_path / "nope"), "--out", str(tmp_path)), "does not exist")
    (tmp_path / "history.parquet").write_bytes(b"PAR1")  # a file where the export directory belongs
    assert_one_line_error(
        *run("report", "--input", str(tmp_path / "history.parquet"), "--out", str(tmp_path / "r")),
        "is a file, not an export directory",
    )
    assert_one_line_error(*run("export", "--db", "oracle://x/y", "--out", str(tmp_path / "o")), "unsupported database")
    assert_one_line_error(
        *run("reconcile", "--business", str(tmp_path / "none.csv"), "--key-column", "k", "--status-column", "s"),
        "no such file",
    )
    assert_one_line_error(
        *run("enqueue", "--input", str(tmp_path / "none"), "--queue", "q", "--task", "t"), "no such file"
    )


def test_report_and_reconcile_commands(spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path) -> None:
    rows = [
        job_row(job_id="a", queue="q", idempotency_key="k1", enqueued_at=at(0), finished_at=at(5)),
        job_row(job_id="b", queue="q", idempotency_key="k2", state="pending", source="live", enqueued_at=at(10)),
    ]
    src = write_history(rows, snapshot_at=at(30))
    code, output = run(
        "report", "--input", str(src), "--out", str(tmp_path / "r"), "--sla", "q=1", "--master", "local[2]"
    )
    assert code == 0, output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["jobs"] == {"archive": 1, "live": 1} and summary["queues"]["q"]["sla_s"] == 1
    assert (tmp_path / "r" / "report.html").exists()
    assert_one_line_error(
        *run("report", "--input", str(src), "--out", str(tmp_path / "r"), "--sla", "q"), "QUEUE=SECONDS"
    )

    biz = tmp_path / "orders.csv"
    biz.write_text("id,status\nk1,pending\nk2,pending\nk3,pending\n")
    code, output = run(
        "reconcile", "--business", str(biz), "--key-column", "id", "--status-column", "status", "--export-dir", str(src)
    )
    assert code == 0, output
    assert re.search(r"done_not_recorded\s*│\s*1\b", output) and re.search(r"lost\s*│\s*1\b", output)
    assert "lost: k3" in output
    code, output = run(
        "reconcile",
        "--business",
        str(biz),
        "--key-column",
        "nope",
        "--status-column",
        "status",
        "--export-dir",
        str(src),
    )
    assert_one_line_error(code, output, "column 'nope' is not in the business table")


def test_enqueue_command(spark: SparkSession, sqlite_url: str, tmp_path: Path) -> None:
    pq.write_table(pa.table({"sku": ["a", "b", "c"], "qty": [1, 2, 3]}), tmp_path / "in.parquet")
    args = [
        "enqueue",
        "--db",
        sqlite_url,
        "--input",
        str(tmp_path / "in.parquet"),
        "--queue",
        "stock",
        "--task",
        "count",
    ]
    code, output = run(*args, "--key-column", "sku")
    assert code == 0, output
    assert "3 rows: 3 jobs enqueued, 0 already queued" in output
    code, output = run(*args, "--key-column", "sku")
    assert "3 rows: 0 jobs enqueued, 3 already queued" in output
    backend = open_backend(sqlite_url)
    try:
        assert sorted(j.idempotency_key or "" for j in backend.jobs_list(JobsListParams())) == ["a", "b", "c"]
    finally:
        backend.close()
    assert_one_line_error(*run(*args, "--key-column", "nope"), "key column 'nope' is not in the input")


def test_python_dash_m_and_the_main_cli_mount() -> None:
    out = subprocess.run([sys.executable, "-m", "conveyor.pipeline", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "reconcile" in out.stdout and "export" in out.stdout
    from conveyor.cli import cli

    assert "export" in cli.commands and "pipeline" in cli.commands


PASSWORD = "pw-Secr3t-x9"


def test_database_errors_are_one_line_and_never_show_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = str(tmp_path / "x")
    cases = {
        # A dead host (nothing listens on port 1), over JDBC and through the seam.
        f"postgresql://app:{PASSWORD}@127.0.0.1:1/db": "cannot connect to the database",
        f"postgres://app:{PASSWORD}@127.0.0.1:notaport/db": "cannot connect to the database",
        f"postgresql://app:{PASSWORD}@[::1/db": "malformed database URL",
        f"oracle://app:{PASSWORD}@127.0.0.1/db": "unsupported database URL scheme",
        f"app:{PASSWORD}@127.0.0.1/db": "not a database URL",
    }
    for url, message in cases.items():
        for via in ("jdbc", "seam"):
            code, output = run("export", "--db", url, "--out", out, "--via", via)
            assert_one_line_error(code, output, message)
            assert PASSWORD not in output
    # MySQL through the seam (JDBC reads PostgreSQL only): a refused login, a dead port, a malformed URL.
    for url, message in {
        f"mysql://app:{PASSWORD}@127.0.0.1/db": "cannot connect to the database",
        f"mysql://app:{PASSWORD}@127.0.0.1:1/db": "cannot connect to the database",
        f"mysql://app:{PASSWORD}@127.0.0.1:notaport/db": "malformed database URL",
    }.items():
        code, output = run("export", "--db", url, "--out", out)
        assert_one_line_error(code, output, message)
        assert PASSWORD not in output
    assert PASSWORD not in caplog.text
    assert not (tmp_path / "x").exists()  # nothing was written for a database that cannot be read


def test_numbers_are_checked(tmp_path: Path, write_history: Callable[..., Path]) -> None:
    src = write_history([job_row(job_id="a", queue="q", enqueued_at=at(0), finished_at=at(5))])
    report = ["report", "--input", str(src), "--out", str(tmp_path / "r")]
    export = ["export", "--db", "sqlite:///" + str(tmp_path / "s.db"), "--out", str(tmp_path / "e")]
    for args, text in [
        ([*export, "--settle", "nan"], "finite number"),
        ([*export, "--settle", "inf"], "finite number"),
        ([*export, "--settle", "-1"], "finite number"),
        ([*export, "--jdbc-partitions", "0"], "--jdbc-partitions"),
        ([*report, "--default-sla", "nan"], "finite number of seconds"),
        ([*report, "--default-sla", "1e400"], "at most 31622400 seconds"),
        ([*report, "--default-sla", "0"], "more than 0"),
        ([*report, "--sla", "q=inf"], "finite number of seconds"),
        ([*report, "--sla", "q=-1"], "more than 0"),
        ([*report, "--sla", "q=0.0000001"], "finer than a microsecond"),
        ([*report, "--sla", "=5"], "--sla '=5': the queue name before '=' is empty"),
        ([*report, "--since", "99999999999999w"], "out of range"),
        (["enqueue", "--input", str(src), "--queue", "q", "--task", "t", "--batch-size", "0"], "--batch-size"),
        (["enqueue", "--input", str(src), "--queue", "q", "--task", "t", "--priority", "1e9"], "--priority"),
    ]:
        assert_one_line_error(*run(*args), text)
    assert not (tmp_path / "r").exists() and not (tmp_path / "e").exists()


@pytest.mark.parametrize("which", ["sqlite", "postgres", "mysql"])
def test_reconcile_of_a_database_never_migrated_names_conveyor_migrate(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Before (SQLite): "SQLite statement failed: no such table: jobs", naming no remedy.
    url = request.getfixturevalue(
        {"sqlite": "sqlite_url", "postgres": "postgres_database", "mysql": "mysql_database"}[which]
    )
    biz = tmp_path / "orders.csv"
    biz.write_text("id,status\nk1,pending\n")
    assert_one_line_error(
        *run("reconcile", "--business", str(biz), "--key-column", "id", "--status-column", "status", "--db", url),
        "run `conveyor migrate` with the same URL",
    )


def test_report_refuses_a_directory_that_is_not_a_report(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    src = write_history([job_row(job_id="a", queue="q", enqueued_at=at(0), finished_at=at(5))])
    theirs = tmp_path / "theirs"
    (theirs / "rates").mkdir(parents=True)
    (theirs / "rates" / "mine.csv").write_text("keep me")
    (theirs / "notes.txt").write_text("keep me too")
    before = sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*"))
    assert_one_line_error(*run("report", "--input", str(src), "--out", str(theirs)), "not written by a report")
    assert sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*")) == before
    # A report's own directory is replaced, run after run.
    for _ in range(2):
        code, output = run("report", "--input", str(src), "--out", str(tmp_path / "mine"))
        assert code == 0, output
    assert json.loads((tmp_path / "mine" / "summary.json").read_text())["jobs"]["archive"] == 1


def test_declared_slas_and_max_depth_come_from_the_app(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shop_tasks.py").write_text(
        "from datetime import timedelta\n"
        "from conveyor import App\n"
        "app = App('memory://')\n"
        "app.queue('emails', sla=timedelta(seconds=2), max_depth=500)\n"
        "app.queue('billing', max_depth=40)\n"
    )
    monkeypatch.chdir(tmp_path)
    rows = [
        job_row(job_id=f"{q}-{i}", queue=q, enqueued_at=at(i), first_started_at=at(i + 3), finished_at=at(i + 4))
        for q in ("emails", "billing", "other")
        for i in range(3)
    ]
    src = write_history(rows)

    def summary(out: str, *args: str) -> dict[str, Any]:
        code, output = run("report", "--input", str(src), "--out", out, "--app", "shop_tasks:app", *args)
        assert code == 0, output
        queues: dict[str, Any] = json.loads((tmp_path / out / "summary.json").read_text())["queues"]
        return queues

    queues = summary("r1", "--default-sla", "60")
    assert {q: v["sla_s"] for q, v in queues.items()} == {"emails": 2, "billing": 60, "other": 60}
    assert {q: v["declared_max_depth"] for q, v in queues.items()} == {"emails": 500, "billing": 40, "other": None}
    # Every wait was 3 s: past the declared 2 s of emails only.
    assert {q: v["sla_breaches"] for q, v in queues.items()} == {"emails": 3, "billing": 0, "other": 0}
    # A flag overrides the declaration.
    assert summary("r2", "--sla", "emails=5")["emails"]["sla_s"] == 5
    # The main CLI's --app is used too.
    from conveyor.cli import main as conveyor_main

    argv = ["--app", "shop_tasks:app", "pipeline", "report", "--input", str(src), "--out", "r3"]
    assert conveyor_main(argv) == 0
    assert json.loads((tmp_path / "r3" / "summary.json").read_text())["queues"]["emails"]["sla_s"] == 2
    assert_one_line_error(*run("report", "--input", str(src), "--out", "r4", "--app", "nope_module:app"), "nope_module")


def test_names_are_escaped_when_printed(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    # (Only ASCII in a queue name here: Spark decodes the export's percent-escaped partition
    # directories byte by byte, so a non-ASCII queue name does not survive the round trip.)
    evil = "evil\x1b[31m\x7fq[bold]"
    src = write_history(
        [
            job_row(job_id="a", queue=evil, idempotency_key="k1", enqueued_at=at(0), finished_at=at(5)),
            job_row(job_id="b", queue="q", state="pending", source="live", enqueued_at=at(1)),
        ],
        snapshot_at=at(30),
    )
    code, output = run("report", "--input", str(src), "--out", str(tmp_path / "r"))
    assert code == 0, output
    assert "\x1b" not in output and "\x7f" not in output
    assert "evil\\x1b[31m\\x7fq[bold]" in output
    keys = ["nul\x00key", "bell\x07\x1b]0;title", "rtl\u202ekey"]
    pq.write_table(pa.table({"id": keys, "status": ["pending"] * 3}), tmp_path / "biz.parquet")
    code, output = run(
        "reconcile",
        "--business",
        str(tmp_path / "biz.parquet"),
        "--key-column",
        "id",
        "--status-column",
        "status",
        "--export-dir",
        str(src),
    )
    assert code == 0, output
    assert not any(ch in output for ch in "\x00\x07\x1b\u202e")
    assert "nul\\x00key" in output and "bell\\x07\\x1b]0;title" in output and "rtl\\u202ekey" in output
    from conveyor.pipeline.cli import printable

    assert printable("bad-utf8-\udcff\x7f\u2028") == "bad-utf8-\\udcff\\x7f\\u2028"


def test_enqueue_with_the_app_stops_at_the_queue_max_depth(
    spark: SparkSession, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: enqueue had no --app, and the executors' App knew no max_depth: all rows went in.
    (tmp_path / "stock_tasks.py").write_text(
        "from conveyor import App\napp = App('memory://')\napp.queue('stock', max_depth=2)\n"
    )
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"sku": ["a", "b", "c"]}), tmp_path / "in.parquet")
    args = ["enqueue", "--db", sqlite_url, "--input", "in.parquet", "--queue", "stock", "--task", "count"]
    code, output = run(*args, "--key-column", "sku", "--batch-size", "1", "--app", "stock_tasks:app")
    assert_one_line_error(code, output, "queue 'stock' is full")
    assert "run it again to send the rest (nothing is enqueued twice)" in output
    backend = open_backend(sqlite_url)
    try:
        assert [j.idempotency_key for j in backend.jobs_list(JobsListParams())] == ["a"]
    finally:
        backend.close()


@pytest.mark.parametrize("master", ["bogus://x", "local[0]", "local[two]", ""])
def test_a_bad_master_is_one_line_before_spark_starts(
    master: str, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    # Before: spark-submit's JVM printed a Java stack trace, and the error line did not say why
    # ("Java gateway process exited"); "local[two]" failed only after the JVM had started. A
    # process of its own: in this one a Spark session is active, and it would be used as it is.
    src = write_history([job_row(job_id="j", queue="q", enqueued_at=at(0), finished_at=at(1))])
    args = ["report", "--input", str(src), "--out", str(tmp_path / "r"), "--master", master]
    out = subprocess.run(
        [sys.executable, "-m", "conveyor.pipeline", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(out.returncode, out.stderr, "not a Spark master URL")
    assert f"{master!r}" in out.stderr and "at org.apache" not in out.stderr
    assert not (tmp_path / "r").exists()
