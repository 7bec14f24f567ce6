"""Pipeline fixtures: one local SparkSession for the whole run, and a writer of synthetic histories.

Synthetic histories are written straight to Parquet in the export layout (never through the code
under test), so every expected number in these tests is computed by hand from the rows."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from conveyor.pipeline.spark import get_session, jdbc_jars

from .history import write_rows


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test run: two threads, a task may fail twice (local[2,2]) so that
    a task retry can be tested, two shuffle partitions, no UI."""
    session = get_session(
        "local[2,2]",
        app_name="conveyor-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        driver_memory="1g",
        # Debian's JDBC drivers (libxerial-sqlite-jdbc-java, libpostgresql-jdbc-java) for the
        # JDBC business-table tests and the JDBC export.
        jars=jdbc_jars("jdbc:sqlite:") + jdbc_jars("jdbc:postgresql:"),
    )
    yield session
    session.stop()


@pytest.fixture
def write_history(tmp_path: Path) -> Callable[..., Path]:
    """Write an export directory from rows: archive rows and live rows (``source='live'``), and a
    watermark naming the live snapshot time when ``snapshot_at`` is given. Returns the directory."""

    def write(rows: Sequence[Mapping[str, Any]], snapshot_at: datetime | None = None, name: str = "export") -> Path:
        out = tmp_path / name
        archive = [r for r in rows if r["source"] == "archive"]
        live = [r for r in rows if r["source"] == "live"]
        if archive:
            write_rows(out / "archive", archive)
        if live:
            write_rows(out / "live", live)
        out.mkdir(parents=True, exist_ok=True)
        mark = {
            "format": 1,
            "run": 1,
            "after": None,
            "archive_rows": len(archive),
            "updated_at": None,
            "live_snapshot_at": None if snapshot_at is None else snapshot_at.isoformat(),
            "live_rows": len(live),
        }
        (out / "_watermark.json").write_text(json.dumps(mark))
        return out

    return write
