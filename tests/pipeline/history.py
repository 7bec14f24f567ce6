"""Synthetic job histories written straight to Parquet in the export layout.

They never go through the code under test, so every expected number in the tests is computed by
hand from the rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from conveyor.pipeline.schema import COLUMNS, arrow_schema

#: The start of every synthetic history: 2026-01-01T00:00:00Z.
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """T0 plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def job_row(**values: Any) -> dict[str, Any]:
    """One export row with defaults for what a test does not care about."""
    row: dict[str, Any] = {name: None for name, _, _ in COLUMNS}
    row.update(
        task="send",
        state="completed",
        priority=0,
        attempts=1,
        deliveries=1,
        max_attempts=5,
        max_deliveries=10,
        headers="{}",
        source="archive",
        exported_at=T0 + timedelta(days=2),
    )
    row.update(values)
    if row.get("run_at") is None:
        row["run_at"] = row["enqueued_at"]
    return row


def write_rows(base: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write rows (each with a ``queue``) hive-partitioned by date and queue under ``base``."""
    schema = arrow_schema()
    table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
    time_col = [r["finished_at"] if r["source"] == "archive" else r["enqueued_at"] for r in rows]
    table = table.append_column("date", pa.array([t.strftime("%Y-%m-%d") for t in time_col], pa.string()))
    table = table.append_column("queue", pa.array([r["queue"] for r in rows], pa.string()))
    part = ds.partitioning(pa.schema([("date", pa.string()), ("queue", pa.string())]), flavor="hive")
    ds.write_dataset(table, base, format="parquet", partitioning=part, existing_data_behavior="overwrite_or_ignore")
