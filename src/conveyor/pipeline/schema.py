"""The export schema: one row per job, the stable contract between ``export`` and every Spark job.

Column order and types are part of the contract: a new column may be appended, an existing one is
never renamed, retyped or removed. Ids are strings (canonical UUID text), times are UTC timestamps
with microsecond precision, JSON documents (headers) are strings. ``payload``, ``result`` and the
traceback are not exported: they may be large or hold personal data, and no report needs them.

The Parquet files are partitioned hive-style by ``date`` (``YYYY-MM-DD``, UTC) and ``queue``; the
two partition columns live in the directory names, not in the files.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

#: The current version of the export layout, stored in ``_watermark.json``.
EXPORT_FORMAT_VERSION = 1

#: The archive (terminal jobs) lives here below the export directory, partitioned by the UTC date of
#: ``finished_at`` and by queue.
ARCHIVE_DIR = "archive"
#: A snapshot of live jobs (pending, processing), replaced whole on each export with ``include_live``,
#: partitioned by the UTC date of ``enqueued_at`` and by queue.
LIVE_DIR = "live"
WATERMARK_FILE = "_watermark.json"

#: (name, type, description) for every column in the files, in order. Types are Arrow type names.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("job_id", "string", "the job's UUID (UUIDv7: time-ordered)"),
    ("task", "string", "the task name"),
    ("state", "string", "pending, processing, completed, dead, expired or cancelled"),
    ("priority", "int32", "higher runs first within a queue"),
    ("attempts", "int32", "handler runs whose outcome was recorded"),
    ("deliveries", "int32", "hand-outs to a worker; deliveries > attempts means a lost delivery"),
    ("max_attempts", "int32", "the attempt budget"),
    ("max_deliveries", "int32", "the delivery budget (poison protection)"),
    ("enqueued_at", "timestamp", "when the job was inserted"),
    ("run_at", "timestamp", "when it was (last) due: a retry moves it to the retry time"),
    ("expires_at", "timestamp", "TTL deadline, null if none"),
    ("first_started_at", "timestamp", "start of the first delivery, null if never started"),
    ("started_at", "timestamp", "start of the last delivery, null if never started"),
    ("finished_at", "timestamp", "when it ended; null for live jobs"),
    ("lease_expires_at", "timestamp", "live processing jobs only"),
    ("error_type", "string", "exception type of the last failed attempt, null if none"),
    ("error_message", "string", "message of the last failed attempt, null if none"),
    ("reason", "string", "why it ended (max_attempts_exceeded, max_deliveries_exceeded, ...)"),
    ("idempotency_key", "string", "the producer's dedup key, null if none"),
    ("ordering_key", "string", "the per-key FIFO key, null if none"),
    ("replay_of", "string", "the dead job this job replays, null if none"),
    ("replayed_by", "string", "the job that replayed this dead letter, as of the export"),
    ("worker_id", "string", "the worker of the last delivery"),
    ("headers", "string", "the headers, a JSON object as text"),
    ("source", "string", "archive or live"),
    ("exported_at", "timestamp", "when the export run that wrote the row started"),
    ("queue_name", "string", "the queue's name when its partition directory holds a shortened one, else null"),
)

#: A queue name longer than this many UTF-8 bytes does not fit a partition directory name (255 bytes
#: on most file systems, and pyarrow writes a non-ASCII byte as three characters): its directory holds
#: :func:`queue_dir_value` and the ``queue_name`` column the whole name.
QUEUE_DIR_MAX_BYTES = 64
#: Characters of a long queue name kept before the hash in its directory name.
QUEUE_DIR_PREFIX = 16


@functools.lru_cache(maxsize=4096)
def queue_dir_value(queue: str) -> str:
    """The ``queue`` partition value of a queue: its name, or for a name over
    :data:`QUEUE_DIR_MAX_BYTES` or holding a NUL its first 16 characters (NULs left out), ``~`` and
    24 hex digits of the SHA-256 of the name (at most 64 + 1 + 24 bytes, three times that escaped:
    a directory name any file system takes). The Spark JDBC export computes the same value
    (``_jdbc_export``; PostgreSQL text holds no NUL)."""
    import hashlib

    raw = queue.encode("utf-8", "surrogatepass")
    if len(raw) <= QUEUE_DIR_MAX_BYTES and "\x00" not in queue:
        return queue
    # A NUL (SQLite stores one; PostgreSQL cannot) would end the directory name there: the
    # queue "a\x00b" was written as, and read back as, the queue "a".
    prefix = queue[:QUEUE_DIR_PREFIX].replace("\x00", "")
    return f"{prefix}~{hashlib.sha256(raw).hexdigest()[:24]}"


def queue_name_value(queue: str) -> str | None:
    """The ``queue_name`` column of a queue: the name when its directory cannot hold it, else None."""
    return None if queue_dir_value(queue) == queue else queue


#: Partition columns (directory names), in nesting order.
PARTITION_COLUMNS: tuple[str, ...] = ("date", "queue")


def arrow_schema() -> pa.Schema:
    """The Arrow schema of the exported files (partition columns excluded)."""
    import pyarrow as pa

    types: dict[str, Any] = {
        "string": pa.string(),
        "int32": pa.int32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }
    return pa.schema([pa.field(name, types[kind]) for name, kind, _ in COLUMNS])


def arrow_schema_with_partitions() -> pa.Schema:
    """The Arrow schema of a whole export, partition columns included (``date`` and ``queue``)."""
    import pyarrow as pa

    schema = arrow_schema()
    return schema.append(pa.field("date", pa.string())).append(pa.field("queue", pa.string()))


def spark_ddl() -> str:
    """The Spark DDL schema of a whole export, partition columns included.

    Reading with this explicit schema keeps partition values as strings: a queue named ``2024``
    must not be inferred as an integer."""
    kinds = {"string": "STRING", "int32": "INT", "timestamp": "TIMESTAMP"}
    cols = [f"`{name}` {kinds[kind]}" for name, kind, _ in COLUMNS]
    cols += ["`date` STRING", "`queue` STRING"]
    return ", ".join(cols)
