"""Bulk enqueue from a Spark DataFrame, safe under Spark task retries.

Every row becomes one job whose idempotency key is derived from the row alone (its key column,
or a hash of the task and the row's content). A Spark task that fails half-way and is retried
sends the same keys again, and the queue's dedup window turns the repeats into no-ops, so nothing
is enqueued twice.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor._errors import first_line
from conveyor.pipeline._keys import key_column_text, key_text
from conveyor.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

DEFAULT_BATCH_SIZE = 500


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What a bulk enqueue did: ``enqueued + duplicates == rows``.

    ``duplicates`` counts rows whose idempotency key already held a job (sent before, by an
    earlier run or by a failed Spark task attempt); no job was added for them."""

    rows: int
    enqueued: int
    duplicates: int


def jsonable(value: Any) -> Any:
    """A Spark row value as plain JSON data: datetimes and dates as ISO text, decimals as text,
    bytes as hex, Rows and maps as objects."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return {str(k): jsonable(v) for k, v in value.asDict(recursive=True).items()}
    if isinstance(value, Iterable):
        return [jsonable(v) for v in value]
    return str(value)


def row_key(task: str, row: Mapping[str, Any]) -> str:
    """The idempotency key of a row without a key column: a SHA-256 of the task and the row.

    Canonical JSON (sorted keys) makes it independent of column order; two identical rows get one
    job."""
    text = json.dumps({"task": task, "row": jsonable(row)}, sort_keys=True, separators=(",", ":"))
    return "row-sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def enqueue_dataframe(
    df: DataFrame,
    database_url: str,
    queue: str,
    task: str,
    key_column: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    payload_columns: Sequence[str] | None = None,
    priority: int | None = None,
    headers: Mapping[str, Any] | None = None,
    max_attempts: int | None = None,
    after_batch: Callable[[int], None] | None = None,
) -> EnqueueResult:
    """Enqueue one ``task`` job per row of ``df`` onto ``queue``, from the Spark executors.

    Each partition opens its own :class:`conveyor.App` and sends batches of ``batch_size`` with
    ``send_many`` (one round trip each). The payload is the row's ``payload_columns`` (default:
    all columns) as JSON. The idempotency key is the text of ``row[key_column]`` (a float's whole number
    as its integer; a null, NaN or empty key is refused: :mod:`conveyor.pipeline._keys`),
    else :func:`row_key`: so a retried Spark task or a second run enqueues nothing twice while the
    queue's dedup window (default 24 h) holds the keys. ``after_batch`` is called in the executor
    with the number of rows sent so far in the partition (a hook for tests and progress).
    Raises :class:`PipelineError` for a bad column or option, or when the Spark job fails."""

    if batch_size <= 0:
        raise PipelineError(f"batch_size must be positive, got {batch_size}")
    columns = list(df.columns)
    if key_column is not None and key_column not in columns:
        raise PipelineError(f"key column {key_column!r} is not in the input (columns: {', '.join(columns)})")
    payload_cols = list(payload_columns) if payload_columns is not None else columns
    missing = [c for c in payload_cols if c not in columns]
    if missing:
        raise PipelineError(f"payload columns not in the input: {', '.join(missing)}")
    if key_column is not None:
        keyless = df.where(key_column_text(df, key_column).isNull()).count()
        if keyless:
            raise PipelineError(
                f"key column {key_column!r} has null values or values that are no key (NaN, empty, a fractional "
                f"float) in {keyless:,} rows: every row needs a key; nothing was enqueued"
            )

    sc = df.sparkSession.sparkContext
    sent_rows = sc.accumulator(0)
    new_jobs = sc.accumulator(0)
    deduplicated = sc.accumulator(0)
    header_values = dict(headers or {})

    def send_partition(rows: Iterable[Row]) -> None:
        from conveyor import App, Message

        app = App(database_url)
        sent = 0
        batch: list[Any] = []

        def flush() -> None:
            nonlocal sent, batch
            if not batch:
                return
            jobs = app.send_many(batch)
            fresh = sum(1 for message, job in zip(batch, jobs, strict=True) if job.id == message.id)
            new_jobs.add(fresh)
            deduplicated.add(len(batch) - fresh)
            sent_rows.add(len(batch))
            sent += len(batch)
            batch = []
            if after_batch is not None:
                after_batch(sent)

        try:
            for row in rows:
                data = row.asDict(recursive=True)
                # Checked above: every row's key column gives a key.
                key = key_text(data[key_column]) if key_column is not None else row_key(task, data)
                batch.append(
                    Message(
                        task=task,
                        payload={c: jsonable(data[c]) for c in payload_cols},
                        queue=queue,
                        priority=priority,
                        idempotency_key=key,
                        headers=header_values or None,
                        max_attempts=max_attempts,
                    )
                )
                if len(batch) >= batch_size:
                    flush()
            flush()
        finally:
            app.close()

    try:
        df.foreachPartition(send_partition)
    except Exception as exc:
        raise PipelineError(f"bulk enqueue failed: {_useful_line(exc)}") from exc
    return EnqueueResult(int(sent_rows.value), int(new_jobs.value), int(deduplicated.value))


def _useful_line(exc: BaseException) -> str:
    """The most useful line of a (possibly Java-wrapped) Python error. Not :func:`~conveyor._errors.first_line`
    alone: Spark reports what a partition raised inside a message of its own (a Java stack trace around the
    Python traceback) whose first line is Spark's, so the line naming the Python error is looked for first."""
    for line in str(exc).splitlines():
        stripped = line.strip()
        if stripped.startswith(("conveyor.", "PayloadError", "ValueError", "ConfigurationError")) or (
            "Error:" in stripped and not stripped.startswith(("at ", "File "))
        ):
            return stripped
    return first_line(exc)
