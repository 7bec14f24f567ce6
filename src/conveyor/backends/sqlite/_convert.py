"""Conversions at the SQLite edge: aware UTC datetimes to REAL unix seconds, UUIDs to text, rows
to the seam's records. The MySQL engine stores times and ids the same way and shares them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast
from uuid import UUID

from conveyor.backends.base import AuditEntry, Delivery, JobRecord, JobState, Schedule


class Row(Protocol):
    """A row whose columns are read by name (``sqlite3.Row``, a PyMySQL ``DictCursor`` row)."""

    def __getitem__(self, key: str, /) -> Any: ...


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(at: datetime) -> int:
    """``at`` (timezone-aware) as integer microseconds since the epoch."""
    return (at - _EPOCH) // _MICROSECOND


def to_db_time(at: datetime) -> float:
    """``at`` (timezone-aware) as unix seconds.

    Computed as integer microseconds divided by 10**6, the same correctly rounded division SQL
    does on the microsecond values of batch items, so a time stored either way compares equal."""
    return micros(at) / 1_000_000


def to_db_time_or_none(at: datetime | None) -> float | None:
    return None if at is None else to_db_time(at)


def from_db_time(value: float) -> datetime:
    """Unix seconds as an aware UTC datetime, rounded to the microsecond; a time past the last one a
    datetime holds (the year 10000, which an older release could store: see ``_message.LATEST``) as the
    last one, so that one such row cannot stop every read of its queue."""
    try:
        return datetime.fromtimestamp(value, UTC)
    except (ValueError, OverflowError, OSError):
        if value > 0:
            return datetime.max.replace(tzinfo=UTC)
        raise


def from_db_time_or_none(value: float | None) -> datetime | None:
    return None if value is None else from_db_time(value)


def to_db_id(value: UUID) -> str:
    """The canonical lowercase text of a UUID: its text order is its byte order."""
    return str(value)


def from_db_id_or_none(value: str | None) -> UUID | None:
    return None if value is None else UUID(value)


def delivery(row: Row) -> Delivery:
    """A ``jobs_acquire`` RETURNING row as a Delivery."""
    return Delivery(
        id=UUID(row["id"]),
        queue=row["queue"],
        task=row["task"],
        payload=row["payload"],
        headers=row["headers"],
        priority=row["priority"],
        run_at=from_db_time(row["run_at"]),
        enqueued_at=from_db_time(row["enqueued_at"]),
        expires_at=from_db_time_or_none(row["expires_at"]),
        attempts=row["attempts"],
        deliveries=row["deliveries"],
        max_attempts=row["max_attempts"],
        max_deliveries=row["max_deliveries"],
        idempotency_key=row["idempotency_key"],
        ordering_key=row["ordering_key"],
        receipt=row["receipt"],
        lease_expires_at=from_db_time(row["lease_expires_at"]),
        rescues=row["rescues"],
    )


def job_record(row: Row) -> JobRecord:
    """A row of the shared live/archive select list as a JobRecord."""
    return JobRecord(
        id=UUID(row["id"]),
        queue=row["queue"],
        task=row["task"],
        payload=row["payload"],
        headers=row["headers"],
        state=cast(JobState, row["state"]),
        priority=row["priority"],
        run_at=from_db_time(row["run_at"]),
        enqueued_at=from_db_time(row["enqueued_at"]),
        expires_at=from_db_time_or_none(row["expires_at"]),
        attempts=row["attempts"],
        deliveries=row["deliveries"],
        max_attempts=row["max_attempts"],
        max_deliveries=row["max_deliveries"],
        idempotency_key=row["idempotency_key"],
        ordering_key=row["ordering_key"],
        replay_of=from_db_id_or_none(row["replay_of"]),
        first_started_at=from_db_time_or_none(row["first_started_at"]),
        started_at=from_db_time_or_none(row["started_at"]),
        lease_expires_at=from_db_time_or_none(row["lease_expires_at"]),
        worker_id=row["worker_id"],
        error_type=row["error_type"],
        error_message=row["error_message"],
        traceback=row["traceback"],
        finished_at=from_db_time_or_none(row["finished_at"]),
        result=row["result"],
        reason=row["reason"],
        replayed_by=from_db_id_or_none(row["replayed_by"]),
        rescues=row["rescues"],
    )


def audit_entry(row: Row) -> AuditEntry:
    """An ``audit`` row as an AuditEntry (``job_ids`` is stored as a JSON array of UUID text)."""
    job_ids: list[Any] = json.loads(row["job_ids"])
    return AuditEntry(
        id=row["id"],
        at=from_db_time(row["at"]),
        actor=row["actor"],
        action=row["action"],
        reason=row["reason"],
        job_ids=tuple(UUID(str(value)) for value in job_ids),
        details=row["details"],
    )


def schedule(row: Row) -> Schedule:
    """A ``schedules`` row as a Schedule."""
    return Schedule(
        name=row["name"],
        cron=row["cron"],
        task=row["task"],
        queue=row["queue"],
        payload=row["payload"],
        next_run_at=from_db_time(row["next_run_at"]),
        paused=bool(row["paused"]),
        priority=row["priority"],
        last_run_at=from_db_time_or_none(row["last_run_at"]),
    )
