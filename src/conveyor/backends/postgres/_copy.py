"""The rows of ``jobs_insert_many``'s bulk path (COPY), in the format that suits the batch's size.

PostgreSQL's COPY hands the rows it has read to the table (heap and index inserts) whenever it has
buffered 1,000 of them or 64 KB of their text; it counts no bytes for a binary row. A binary batch
of a thousand or so small jobs therefore does all of its heap and index work after its last row has
arrived, while its client waits; in text format the server inserts every ~64 KB while the client
still encodes the rest. Text costs the server more per row (an input function parses every field),
which large batches pay where binary's flushes every 1,000 rows overlap the sending anyway: batches
below ``TEXT_MAX`` go as text, larger ones as binary (docs/benchmarks.md, session 29)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from psycopg import Copy

from conveyor.backends.base import NewJob

TEXT_MAX = 5_000


class NotCopyable(Exception):
    """A job in the batch needs the INSERT statement (an idempotency key, a replay)."""


def copyable(job: NewJob) -> bool:
    """Whether COPY can insert the job: it has no key to claim, replays nothing, and its id is fresh."""
    return job.fresh and job.idempotency_key is None and job.replay_of is None


# jsonb's binary form is a version byte (1) and the JSON text. The rows carry the byte before their
# already-encoded JSON and go through psycopg's text dumper, which runs in C (a jsonb dumper would
# call back into Python for every value, and encode the JSON a second time).
BINARY_TYPES = [
    "uuid", "text", "text", "text", "text", "text", "integer", "timestamptz", "timestamptz", "timestamptz",
    "integer", "integer", "text",
]  # fmt: skip


def _state(job: NewJob, now: datetime, scheduled: dict[str, datetime]) -> str:
    """The row's state: 'scheduled' while its run_at is ahead (noted per queue, the earliest), as the
    INSERT statements decide."""
    if job.run_at > now:
        if job.queue not in scheduled or job.run_at < scheduled[job.queue]:
            scheduled[job.queue] = job.run_at
        return "scheduled"
    return "pending"


def write_binary(copy: Copy, jobs: Sequence[NewJob], now: datetime, scheduled: dict[str, datetime]) -> None:
    """Write ``jobs`` to a binary COPY (``jobs_copy``); note the scheduled ones in ``scheduled``.
    Raises NotCopyable at the first job COPY cannot insert."""
    copy.set_types(BINARY_TYPES)
    write = copy.write_row
    for j in jobs:
        if not copyable(j):
            raise NotCopyable
        write((
            j.id, j.queue, j.task, "\x01" + j.payload, "\x01" + j.headers, _state(j, now, scheduled), j.priority,
            j.run_at, now, j.expires_at, j.max_attempts, j.max_deliveries, j.ordering_key,
        ))  # fmt: skip


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NULL = "\\N"
_BLOCK = 32_768  # characters handed to psycopg at a time, as its own row writer does


def _text(value: str) -> str:
    """``value`` as a field of a text COPY row: its value, as psycopg's dumpers send it (not what
    ``format`` makes of a ``str`` subclass, such as ``'Q.EMAILS'`` for a member of a ``(str, Enum)``)."""
    if type(value) is not str:
        value = str.__str__(value)
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_ESCAPES)
    return value


def _time(value: datetime | None) -> str:
    """A time as the binary COPY sends it: the instant in UTC, to the microsecond (``datetime``'s own
    isoformat: a subclass's may write more digits, as pandas' Timestamp writes nanoseconds, which
    PostgreSQL would round where psycopg's dumper drops them)."""
    if value is None:
        return _NULL
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return datetime.isoformat(value)


def write_text(
    copy: Copy, jobs: Sequence[NewJob], now: datetime, scheduled: dict[str, datetime], encoding: str
) -> None:
    """Write ``jobs`` to a text COPY (``jobs_copy_text``), as :func:`write_binary` does, encoded in
    the connection's ``encoding`` (Python's name for it). Raises UnicodeEncodeError for a text the
    encoding cannot hold."""
    # As psycopg's text dumpers: a SQL_ASCII database takes any bytes, and gets UTF-8.
    codec = "utf-8" if encoding == "ascii" else encoding
    enqueued = _time(now)
    lines: list[str] = []
    size = 0
    last: NewJob | None = None
    head = tail = ""
    for j in jobs:
        if not copyable(j):
            raise NotCopyable
        # The jobs of one batch mostly share every field but the id and the JSON: those fields are
        # written once for a run of jobs that hold the same objects.
        if last is None or not (
            j.queue is last.queue and j.task is last.task and j.run_at is last.run_at
            and j.priority is last.priority and j.expires_at is last.expires_at
            and j.max_attempts is last.max_attempts and j.max_deliveries is last.max_deliveries
            and j.ordering_key is last.ordering_key
        ):  # fmt: skip
            head = f"\t{_text(j.queue)}\t{_text(j.task)}\t"
            key = _NULL if j.ordering_key is None else _text(j.ordering_key)
            tail = (
                f"\t{_state(j, now, scheduled)}\t{int(j.priority)}\t{_time(j.run_at)}\t{enqueued}"
                f"\t{_time(j.expires_at)}\t{int(j.max_attempts)}\t{int(j.max_deliveries)}\t{key}\n"
            )
            last = j
        line = f"{j.id.hex}{head}{_text(j.payload)}\t{_text(j.headers)}{tail}"
        lines.append(line)
        size += len(line)
        if size >= _BLOCK:
            copy.write("".join(lines).encode(codec))
            lines.clear()
            size = 0
    if lines:
        copy.write("".join(lines).encode(codec))
