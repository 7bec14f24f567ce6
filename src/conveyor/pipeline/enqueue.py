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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor._errors import first_line
from conveyor.pipeline._keys import col, key_column_text, key_text
from conveyor.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

    from conveyor import App
    from conveyor._queue import QueueOptions

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
    app: App | None = None,
) -> EnqueueResult:
    """Enqueue one ``task`` job per row of ``df`` onto ``queue``, from the Spark executors.

    Each partition opens its own :class:`conveyor.App` and sends batches of ``batch_size`` with
    ``send_many`` (one round trip each). The payload is the row's ``payload_columns`` (default:
    all columns) as JSON. The idempotency key is the text of ``row[key_column]`` (a float's whole number
    as its integer; a null, NaN or empty key is refused: :mod:`conveyor.pipeline._keys`),
    else :func:`row_key`: so a retried Spark task or a second run enqueues nothing twice while the
    queue's dedup window (default 24 h) holds the keys. ``after_batch`` is called in the executor
    with the number of rows sent so far in the partition (a hook for tests and progress).
    Every row is built into its job and checked before any is sent: :class:`BadRows` (nothing sent)
    counts the rows that cannot be jobs and names the first few. Raises :class:`PipelineError` for a
    bad column or option, or when sending fails part way (naming the row or batch and what was sent).

    ``app`` (your App, loaded on the driver) gives ``queue``'s declared policy to the executors: its
    ``max_depth`` (backpressure) and dedup window. Past the queue's mark a send raises ``QueueFull`` and
    the run stops there like any failed send: the line says how many rows were sent, and a re-run
    once the queue has drained sends the rest and nothing twice."""

    if batch_size <= 0:
        raise PipelineError(f"batch_size must be positive, got {batch_size}")
    check_target(database_url, queue, task)
    columns = list(df.columns)
    check_columns(columns, key_column, payload_columns)
    payload_cols = list(payload_columns) if payload_columns is not None else columns
    if key_column is not None:
        keyless = df.where(key_column_text(df, key_column).isNull()).count()
        if keyless:
            raise PipelineError(
                f"key column {key_column!r} has null values or values that are no key (NaN, empty, a fractional "
                f"float) in {keyless:,} rows: every row needs a key; nothing was enqueued"
            )

    header_values = dict(headers or {})

    def message_of(data: dict[str, Any]) -> Any:
        from conveyor import Message

        # Checked above: every row's key column gives a key.
        key = key_text(data[key_column]) if key_column is not None else row_key(task, data)
        return Message(
            task=task,
            payload={c: jsonable(data[c]) for c in payload_cols},
            queue=queue,
            priority=priority,
            idempotency_key=key,
            headers=header_values or None,
            max_attempts=max_attempts,
        )

    with _quiet_executors(df):
        # Every row is checked before any is sent: a bad row (NaN, a NUL, a payload or key over its
        # limit, a time Python cannot hold) would otherwise stop the run part way, some jobs sent and
        # the rest not. Reads the input once more.
        # The columns a job is made of: without a key column, the whole row is hashed into the key.
        used = None if key_column is None else [*payload_cols, key_column]
        rows, bad, examples = _check_rows(df, database_url, key_column, message_of, used)
        if bad:
            raise BadRows(bad, rows, examples)
        declared = None if app is None else app.catalogue.queues.get(queue)
        return _send(df, database_url, batch_size, message_of, after_batch, rows, declared)


class BadRows(PipelineError):
    """Rows that cannot be jobs, found before anything was sent: ``count`` of ``rows``, and the first
    few ``examples`` as (row number in Spark's read order, from 1; key or None; why)."""

    def __init__(self, count: int, rows: int, examples: list[tuple[int, str | None, str]]) -> None:
        self.count, self.rows, self.examples = count, rows, examples
        shown = "; ".join(
            f"row {n}" + (f" (key {k!r})" if k is not None else "") + f": {why}" for n, k, why in examples
        )
        more = f"; and {count - len(examples):,} more" if count > len(examples) else ""
        super().__init__(
            f"{count:,} of {rows:,} rows cannot be enqueued, so nothing was sent (fix or drop them and run again): "
            f"{shown}{more}"
        )


#: Bad rows named in the error (all are counted).
_EXAMPLES = 3
#: A column the row check adds (the time columns out of Python's range); a name no input would use.
_BAD_TIME = "__conveyor_time_out_of_range__"
#: A column the row check adds (why a string column of the row cannot be sent); a name no input would use.
_BAD_TEXT = "__conveyor_bad_text__"
#: A column the row check adds (the key's bytes, when they are not UTF-8); a name no input would use.
_RAW_KEY = "__conveyor_raw_key__"


def check_target(database_url: str, queue: str, task: str) -> None:
    """Fail fast, in one line, on what a bulk enqueue cannot send to: a queue or task name that is not
    one, a database URL that is malformed or names an unknown scheme, a server that does not answer
    (one attempt of at most 5 s), or ``memory://`` (the executors cannot reach it). Raises
    :class:`PipelineError`; opens the database once (SQLite: creating the file, as the enqueue would)."""
    from conveyor._errors import PayloadError
    from conveyor._limits import check_name
    from conveyor.backends import open_backend
    from conveyor.pipeline.export import _opened, check_database

    for what, name in (("queue", queue), ("task", task)):
        try:
            check_name(name, what)
        except PayloadError as exc:
            raise PipelineError(f"--{what}: {first_line(exc)}") from None
    if database_url.startswith("memory:"):
        raise PipelineError("--db memory:// cannot be reached from Spark executors; use sqlite or postgresql")
    check_database(database_url)
    _opened(open_backend, database_url).close()


def check_columns(columns: Sequence[str], key_column: str | None, payload_columns: Sequence[str] | None) -> None:
    """Raise :class:`PipelineError` if ``key_column`` or one of ``payload_columns`` is not in ``columns``
    (the command checks the input's header or schema with it before Spark starts)."""
    if key_column is not None and key_column not in columns:
        raise PipelineError(f"key column {key_column!r} is not in the input (columns: {', '.join(columns)})")
    missing = [c for c in payload_columns or () if c not in columns]
    if missing:
        raise PipelineError(f"payload columns not in the input: {', '.join(missing)}")


def _check_rows(
    df: DataFrame,
    database_url: str,
    key_column: str | None,
    message_of: Callable[[dict[str, Any]], Any],
    used: Sequence[str] | None = None,
) -> tuple[int, int, list[tuple[int, str | None, str]]]:
    """(rows, bad rows, the first few bad rows) of ``df``, each row built into its job and checked
    as ``send_many`` would check it (no connection is opened). The strings of the ``used`` columns
    (default: all) are checked in Spark to be UTF-8 and free of NUL, naming the column."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DateType, StringType, TimestampNTZType, TimestampType

    from conveyor.pipeline._input import string_checks

    # A date or time outside years 1-9999 fails the conversion of its whole partition into Python
    # rows, so it is found (and nulled) in Spark, and the row is reported instead.
    times = [f.name for f in df.schema.fields if isinstance(f.dataType, DateType | TimestampType | TimestampNTZType)]

    def in_range(name: str) -> Any:
        return F.year(col(name)).between(1, 9999)

    # Spark hands Python each byte of a string that is not UTF-8 as U+FFFD, so two keys (or rows) that
    # differ only there became one job and the others were counted as duplicates: found here, by column.
    # A NUL is found here too, to name its column (the payload check would only say "payload").
    texts = [
        (f"column {name!r} holds a string that is not UTF-8", bad)
        for name, bad in string_checks(df, lambda s: ~F.is_valid_utf8(s), used)
    ] + [
        (f"column {name!r} holds a NUL character (\\x00), which PostgreSQL cannot store", bad)
        for name, bad in string_checks(df, lambda s: s.contains("\x00"), used)
    ]

    # A key that is not UTF-8 would be named with a U+FFFD for each bad byte (all such keys alike), so
    # its bytes are carried beside it and shown with backslash escapes ('k\\xff') instead.
    raw_key = []
    if key_column is not None and isinstance(df.schema[key_column].dataType, StringType):
        key_col = col(key_column)
        raw_key = [F.when(~F.is_valid_utf8(key_col), key_col.cast("binary")).alias(_RAW_KEY)]

    checked = df.select(
        *[F.when(in_range(c), col(c)).alias(c) if c in times else col(c) for c in df.columns],
        *raw_key,
        F.concat_ws(", ", *[F.when(~in_range(c), F.lit(c)) for c in times]).alias(_BAD_TIME),
        F.coalesce(*[F.when(F.coalesce(bad, F.lit(False)), F.lit(why)) for why, bad in texts], F.lit(None))
        .cast("string")
        .alias(_BAD_TEXT),
    )

    def check(
        partition: int, rows_in: Iterable[Row]
    ) -> Iterable[tuple[int, int, int, list[tuple[int, str | None, str]]]]:
        from datetime import UTC, datetime

        from conveyor import App

        app = App(database_url)  # only to check messages: prepare() opens no connection
        now = datetime.now(UTC)
        rows = bad = 0
        examples: list[tuple[int, str | None, str]] = []
        try:
            for index, row in enumerate(rows_in):
                rows += 1
                data = row.asDict(recursive=True)
                out_of_range = data.pop(_BAD_TIME)
                bad_text = data.pop(_BAD_TEXT)
                raw = data.pop(_RAW_KEY, None)
                if raw is not None:
                    key: str | None = bytes(raw).decode("utf-8", "backslashreplace")
                else:
                    key = key_text(data[key_column]) if key_column is not None else None
                try:
                    if out_of_range:
                        raise ValueError(f"{out_of_range}: a date or time outside the years 1 to 9999")
                    if bad_text:
                        raise ValueError(bad_text)
                    app.producer.prepare(message_of(data), now)
                except Exception as exc:
                    bad += 1
                    if len(examples) < _EXAMPLES:
                        examples.append((index + 1, key, _short(first_line(exc))))
        finally:
            app.close()
        yield partition, rows, bad, examples

    # Row numbers: a partition's positions, after the rows of the partitions before it (no extra
    # Spark job to number the rows, as zipWithIndex would run).
    try:
        results = sorted(checked.rdd.mapPartitionsWithIndex(check).collect())
    except Exception as exc:
        # A value no row check could catch: one Python cannot convert inside a struct or array (a
        # time outside its years), or a time the executor's local time zone moves out of them.
        raise PipelineError(f"checking the rows failed, so nothing was sent: {_useful_line(exc)}") from exc
    examples: list[tuple[int, str | None, str]] = []
    before = 0
    for _, rows, _, part in results:
        examples.extend((before + n, key, why) for n, key, why in part)
        before += rows
    return before, sum(r[2] for r in results), sorted(examples)[:_EXAMPLES]


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _send(
    df: DataFrame,
    database_url: str,
    batch_size: int,
    message_of: Callable[[dict[str, Any]], Any],
    after_batch: Callable[[int], None] | None,
    total: int,
    declared: QueueOptions | None = None,
) -> EnqueueResult:
    sc = df.sparkSession.sparkContext
    sent_rows = sc.accumulator(0)
    new_jobs = sc.accumulator(0)
    deduplicated = sc.accumulator(0)

    def send_partition(rows: Iterable[Row]) -> None:
        from conveyor import App
        from conveyor._errors import PayloadError

        app = App(database_url)
        if declared is not None:
            # The queue's declared policy: backpressure (max_depth) and its dedup window.
            app.catalogue.add_queue(declared)
        sent = 0
        batch: list[Any] = []

        def flush() -> None:
            nonlocal sent, batch
            if not batch:
                return
            try:
                jobs = app.send_many(batch)
            except PayloadError:
                # A row the database refuses (text its encoding cannot hold): the batch wrote nothing;
                # sent one by one, the rows before it go in and the error names the row.
                for done, message in enumerate(batch):
                    try:
                        app.send_many([message])
                    except Exception as exc:
                        raise PipelineError(
                            f"the row with key {message.idempotency_key!r} was refused "
                            f"({sent + done:,} rows of its Spark partition had been sent): "
                            f"{first_line(exc)}"
                        ) from exc
                raise
            except Exception as exc:
                raise PipelineError(
                    f"sending the rows with keys {batch[0].idempotency_key!r} to {batch[-1].idempotency_key!r} "
                    f"failed ({sent:,} rows of their Spark partition had been sent): {first_line(exc)}"
                ) from exc
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
                batch.append(message_of(row.asDict(recursive=True)))
                if len(batch) >= batch_size:
                    flush()
            flush()
        finally:
            app.close()

    try:
        df.foreachPartition(send_partition)
    except Exception as exc:
        # The accumulators hold what the Spark tasks that finished sent; the failed task's own count
        # is in its message. A re-run sends the rest and enqueues nothing twice.
        raise PipelineError(
            f"bulk enqueue stopped: {_useful_line(exc)}; the Spark tasks that finished sent "
            f"{int(sent_rows.value):,} rows ({int(new_jobs.value):,} new jobs) of the {total:,}; "
            "run it again to send the rest (nothing is enqueued twice)"
        ) from exc
    return EnqueueResult(int(sent_rows.value), int(new_jobs.value), int(deduplicated.value))


@contextmanager
def _quiet_executors(df: DataFrame) -> Iterator[None]:
    """Spark's log off while the enqueue's jobs run: a failed task logs its Python traceback and
    Spark's (60-120 lines) at ERROR, and the error is told in one line by the caller anyway. The
    level is put back afterwards (from the JVM's root logger; ERROR if it cannot be read)."""
    sc = df.sparkSession.sparkContext
    try:
        level = str(sc._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel().toString())  # type: ignore[union-attr]
    except Exception:
        level = "ERROR"
    sc.setLogLevel("OFF")
    try:
        yield
    finally:
        sc.setLogLevel(level)


def _useful_line(exc: BaseException) -> str:
    """The most useful line of a (possibly Java-wrapped) Python error. Not :func:`~conveyor._errors.first_line`
    alone: Spark reports what a partition raised inside a message of its own (a Java stack trace around the
    Python traceback) whose first line is Spark's, so the line naming the Python error is looked for first."""
    own = "conveyor.pipeline.errors.PipelineError: "
    for line in str(exc).splitlines():
        # What the executor's code said of the failure itself, after its chained cause's traceback.
        if line.strip().startswith(own):
            return line.strip().removeprefix(own)
    for line in str(exc).splitlines():
        stripped = line.strip()
        if stripped.startswith(("conveyor.", "PayloadError", "ValueError", "ConfigurationError")) or (
            "Error:" in stripped and not stripped.startswith(("at ", "File "))
        ):
            return stripped
    return first_line(exc)
