"""The pipeline on a real Spark standalone cluster: a master and a worker started with the pyspark
package's own ``spark-class`` launcher on 127.0.0.1 (free ports, small memory), owned by the test
and stopped (their whole process groups) whatever happens.

``conveyor export --via jdbc`` and ``conveyor pipeline report`` run as separate processes with
``--master spark://...`` (the test process already has a local session, which a command in this
process would reuse), and their tables must equal the ones local mode computes from a seam export
of the same database.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession

from conveyor.backends import open_backend
from conveyor.pipeline import export, report
from conveyor.pipeline.report import TABLES

from .test_export import DAY1, DAY2, finish, insert

pytestmark = [pytest.mark.timeout(600), pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark")]

#: How long the master and the worker get to come up (a cold JVM on a busy 2-core machine).
START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spark_class() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return str(Path(_find_spark_home()) / "bin" / "spark-class")


def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    # A session (process group) of its own: stopping the group stops the JVM that spark-class
    # execs and every executor the worker forks.
    with open(log, "wb") as out:
        return subprocess.Popen(
            [spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass


def wait_for(what: str, check: Any, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs if log.exists())
    pytest.fail(f"the standalone cluster's {what} did not come up within {START_TIMEOUT_S} s\n{tails}")


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker (1 core, 1 GiB) on 127.0.0.1; yields the master URL."""
    port, ui = free_port(), free_port()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m", SPARK_NO_DAEMONIZE="1")
    env["SPARK_LOG_DIR"] = env["SPARK_PID_DIR"] = str(tmp_path)
    logs = [tmp_path / "master.log", tmp_path / "worker.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
        procs.append(start(["org.apache.spark.deploy.master.Master", *master_args], logs[0], env))

        def master_ui() -> dict[str, Any]:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as response:
                data: dict[str, Any] = json.load(response)
                return data

        wait_for("master", lambda: master_ui().get("status") == "ALIVE", procs, logs)
        url = f"spark://127.0.0.1:{port}"
        worker_args = ["--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port())]
        worker_args += ["--cores", "1", "--memory", "1g", "--work-dir", str(tmp_path / "work"), url]
        procs.append(start(["org.apache.spark.deploy.worker.Worker", *worker_args], logs[1], env))
        wait_for("worker", lambda: master_ui().get("aliveworkers", 0) >= 1, procs, logs)
        yield url
    finally:
        for proc in reversed(procs):
            stop(proc)


def command(*args: str) -> str:
    """Run a pipeline command in its own process; fail with its output unless it succeeds."""
    env = dict(os.environ, CONVEYOR_SPARK_DRIVER_MEMORY="512m", SPARK_EXECUTOR_MEMORY="512m", COLUMNS="200")
    result = subprocess.run(
        [sys.executable, "-m", "conveyor.pipeline", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


def rows(directory: Path, table: str) -> list[dict[str, Any]]:
    data = ds.dataset(directory / table, format="parquet").to_table().to_pylist()
    return sorted(data, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_export_and_report_on_a_standalone_cluster_match_local_mode(
    standalone_cluster: str, spark: SparkSession, postgres_database: str, tmp_path: Path
) -> None:
    b = open_backend(postgres_database)
    b.migrate()
    try:
        insert(b, "emails", 8, DAY1 - timedelta(minutes=5))
        insert(b, "billing", 5, DAY1 - timedelta(minutes=3))
        finish(b, "emails", 5, DAY1)
        finish(b, "billing", 2, DAY1 + timedelta(seconds=30), state="dead")
        finish(b, "billing", 2, DAY1 + timedelta(minutes=2))
        finish(b, "emails", 2, DAY2)
    finally:
        b.close()

    # On the cluster: the JDBC export (executors read the archive) and the report.
    cluster_export, cluster_report = tmp_path / "cluster-export", tmp_path / "cluster-report"
    out = command(
        "export", "--db", postgres_database, "--out", str(cluster_export), "--via", "jdbc", "--include-live",
        "--master", standalone_cluster,
    )  # fmt: skip
    assert "export run 1 (via jdbc): 11 new archive rows" in out and "live snapshot 2 jobs" in out
    command("report", "--input", str(cluster_export), "--out", str(cluster_report), "--master", standalone_cluster)

    # Locally: the seam export (no Spark) and the report on the test's local session.
    local_export, local_report = tmp_path / "local-export", tmp_path / "local-report"
    export(postgres_database, local_export, include_live=True)
    report(local_export, local_report, spark=spark)

    for table in TABLES:
        assert rows(cluster_report, table) == rows(local_report, table), table
    summaries = [json.loads((d / "summary.json").read_text()) for d in (cluster_report, local_report)]
    assert summaries[0]["jobs"] == summaries[1]["jobs"] == {"archive": 11, "live": 2}
    assert summaries[0]["queues"] == summaries[1]["queues"]
