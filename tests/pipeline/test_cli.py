"""The pipeline's commands: one-line errors for bad input, and each command end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def assert_one_line_error(code: int, output: str, text: str) -> None:
    assert code != 0
    assert "Traceback" not in output
    assert text in output, output


def test_export_command_is_incremental(sqlite_url: str, tmp_path: Path) -> None:
    with App(sqlite_url) as app:
        app.send_many([Message(task="t", payload={}, queue="q") for _ in range(3)])
    code, output = run("export", "--db", sqlite_url, "--out", str(tmp_path / "x"), "--include-live")
    assert code == 0, output
    assert "export run 1: 0 new archive rows" in output and "live snapshot 3 jobs" in output
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
    assert "export run 1: 5 new archive rows" in output
    code, output = run(*args)
    assert code == 0 and "export run 2: 0 new archive rows (5 in total)" in output
    assert_one_line_error(
        *run("export", "--db", "sqlite:///" + str(tmp_path / "s.db"), "--out", str(tmp_path / "y"), "--via", "jdbc"),
        "PostgreSQL only",
    )


def test_bad_input_is_one_line_without_spark(tmp_path: Path) -> None:
    assert_one_line_error(*run("report", "--input", str(tmp_path / "nope"), "--out", str(tmp_path)), "does not exist")
    assert_one_line_error(*run("export", "--db", "mysql://x/y", "--out", str(tmp_path / "o")), "unsupported database")
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
