"""Conversions at the edge of the engines that store times as unix seconds and ids as UUID text (SQLite,
MySQL): aware UTC datetimes to seconds, UUIDs to text, rows to the seam's records, and the pieces of their
calls that are plain Python over those rows."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast
from uuid import UUID

from conveyor._errors import BackendError
from conveyor.backends.base import (
    AlertState,
    AuditEntry,
    DeadListParams,
    Delivery,
    JobRecord,
    JobsFinishParams,
    JobState,
    LeaseRef,
    QueueStats,
    Schedule,
    Token,
    WorkerInfo,
    one_outcome_per_job,
)


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
    last one, and a time before the first (a year before 1, ``-inf``: raw SQL) as the first, so that one
    such row cannot stop every read of its queue (as PostgreSQL's are read: see ``postgres._times``).

    Text or bytes (SQLite keeps what a hand edit writes, ``run_at = '2024-01-01'``, as it is: only text
    that reads as a number becomes one) is the last time too: SQLite orders them after every number, so
    its statements already take such a time as later than any, never due and never expired."""
    try:
        return datetime.fromtimestamp(value, UTC)
    except TypeError:
        if isinstance(value, str | bytes):
            return datetime.max.replace(tzinfo=UTC)
        raise
    except (ValueError, OverflowError, OSError):
        if value > 0:
            return datetime.max.replace(tzinfo=UTC)
        if value < 0:
            return datetime.min.replace(tzinfo=UTC)
        raise


#: The first time a datetime holds, in unix seconds: the earliest time a row is read as.
_FIRST_SECONDS = to_db_time(datetime.min.replace(tzinfo=UTC))


def from_db_time_or_none(value: float | None) -> datetime | None:
    return None if value is None else from_db_time(value)


def to_db_id(value: UUID) -> str:
    """The canonical lowercase text of a UUID: its text order is its byte order."""
    return str(value)


def from_db_id_or_none(value: str | None) -> UUID | None:
    return None if value is None else UUID(value)


def delivery(row: Row) -> Delivery:
    """A row leased by ``jobs_acquire`` (SQLite's RETURNING row; MySQL's picked row with its receipt and
    lease end) as a Delivery."""
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


def quoted_id(job_id: UUID | None) -> str | None:
    """A job id as it stands in ``audit.job_ids`` (a JSON array of UUID text), quotes included (None: None)."""
    return None if job_id is None else f'"{job_id}"'


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


def token(row: Row) -> Token:
    """A ``tokens`` row as a Token (``queues`` is stored as a JSON array, NULL for every queue)."""
    return Token(
        id=row["id"],
        name=row["name"],
        role=row["role"],
        queues=None if row["queues"] is None else tuple(json.loads(row["queues"])),
        secret_hash=row["secret_hash"],
        created_at=from_db_time(row["created_at"]),
        expires_at=from_db_time_or_none(row["expires_at"]),
        revoked_at=from_db_time_or_none(row["revoked_at"]),
    )


def lease_end(now: datetime, visibility_timeout: float) -> float:
    """``now + visibility_timeout`` as stored: added on exact microseconds (as PostgreSQL adds an
    interval), so that a lease ends at the very time every engine says it does."""
    try:
        return to_db_time(now + timedelta(seconds=visibility_timeout))
    except (ValueError, OverflowError) as exc:
        raise BackendError(f"not a visibility timeout: {visibility_timeout!r} seconds") from exc


def held(items: Sequence[LeaseRef], rows: Iterable[Row]) -> list[UUID]:
    """The ids of ``items`` whose (id, receipt) is among ``rows`` (their ``id`` and ``receipt`` columns), in
    the caller's order, which RETURNING does not promise: matched by receipt too, so that
    an item naming the same job with a stale receipt is not."""
    found = {(row["id"], row["receipt"]) for row in rows}
    return [item.id for item in items if (to_db_id(item.id), item.receipt) in found]


def lease_refs(items: Sequence[LeaseRef]) -> str:
    """Deliveries as the JSON array of ``{"id", "receipt"}`` objects the batch statements read."""
    return json.dumps([{"id": to_db_id(item.id), "receipt": item.receipt} for item in items])


def outcomes_json(items: list[dict[str, Any]], engine: str, action: str) -> str:
    """The outcomes as a statement's JSON parameter; a value JSON cannot hold is the database refusing
    the batch (BackendError: the completer finds the outcome and dead-letters it alone), not an error
    that ends the worker's completer."""
    try:
        return json.dumps(items)
    except (TypeError, ValueError) as exc:
        raise BackendError(f"{engine} refused {action}: a value is not storable ({exc})") from None


def once_each(replays: Iterable[tuple[UUID, UUID]]) -> list[tuple[UUID, UUID]]:
    """A replay's (dead id, new id) pairs with each dead letter named once (the first pair wins): a dead
    letter is replayed at most once, even if the caller names it twice."""
    pairs: dict[UUID, UUID] = {}
    for dead_id, new_id in replays:
        pairs.setdefault(dead_id, new_id)
    return list(pairs.items())


def queue_stats(live: Iterable[Row], totals: Iterable[Row], dlq: Iterable[Row], now: float) -> list[QueueStats]:
    """Counts per queue from the three stats statements (live rows, the counters' totals, the DLQ depth),
    for every queue that has any, by queue name."""
    counts: dict[str, dict[str, Any]] = {}

    def entry(queue: str) -> dict[str, Any]:
        return counts.setdefault(
            queue,
            {
                "pending": 0,
                "scheduled": 0,
                "processing": 0,
                "completed": 0,
                "dead": 0,
                "expired": 0,
                "cancelled": 0,
                "oldest_pending_age": None,
                "dead_total": 0,
                "enqueued": 0,
            },
        )

    for row in live:
        e = entry(row["queue"])
        for name in ("pending", "scheduled", "processing"):
            e[name] = int(row[name])
        if row["oldest_ready_at"] is not None:
            # A time before the year 1 (raw SQL; -inf on SQLite) is read as the year 1, as the row is.
            e["oldest_pending_age"] = max(0.0, now - max(row["oldest_ready_at"], _FIRST_SECONDS))
    for row in totals:
        e = entry(row["queue"])
        for name in ("completed", "dead_total", "expired", "cancelled"):
            e[name] = int(row[name])
    for row in dlq:
        entry(row["queue"])["dead"] = int(row["dead"])
    for e in counts.values():
        e["enqueued"] = sum(e[n] for n in ("pending", "scheduled", "processing", "completed", "dead_total"))
        e["enqueued"] += e["expired"] + e["cancelled"]
    return [QueueStats(queue=queue, **counts[queue]) for queue in sorted(counts)]


# The parameters of the statements both engines name alike, built once.


def schedule_rows(schedules: Iterable[Schedule]) -> list[dict[str, Any]]:
    """``schedules_upsert``'s rows. The last of several schedules with one name wins (as on PostgreSQL):
    upserted one by one, a second would be taken as an update of the first and keep its pause state."""
    return [
        {
            "name": s.name,
            "cron": s.cron,
            "task": s.task,
            "queue": s.queue,
            "payload": s.payload,
            "next_run_at": to_db_time(s.next_run_at),
            "paused": 1 if s.paused else 0,
            "priority": s.priority,
            "last_run_at": to_db_time_or_none(s.last_run_at),
        }
        for s in {s.name: s for s in schedules}.values()
    ]


def token_args(t: Token) -> dict[str, Any]:
    """``tokens_insert``'s parameters (``queues`` as a JSON array, NULL for every queue)."""
    return {
        "id": t.id,
        "name": t.name,
        "role": t.role,
        "queues": None if t.queues is None else json.dumps(list(t.queues)),
        "secret_hash": t.secret_hash,
        "created_at": to_db_time(t.created_at),
        "expires_at": to_db_time_or_none(t.expires_at),
    }


def worker_args(w: WorkerInfo, now: datetime) -> dict[str, Any]:
    """``workers_beat``'s parameters."""
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "queues": json.dumps(list(w.queues)),
        "concurrency": w.concurrency,
        "started_at": to_db_time(w.started_at),
        "now": to_db_time(now),
    }


def alert_args(item: AlertState, now: datetime) -> dict[str, Any]:
    """The alert statements' parameters (a rule over every queue is stored with the queue '')."""
    return {
        "rule": item.rule,
        "queue": item.queue or "",
        "state": item.state,
        "since": to_db_time(item.since),
        "value": item.value,
        "threshold": item.threshold,
        "message": item.message,
        "now": to_db_time(now),
    }


def alert(row: Row) -> AlertState:
    """An ``alerts`` row as an AlertState."""
    return AlertState(
        rule=row["rule"],
        queue=row["queue"] or None,
        state=row["state"],
        since=from_db_time(row["since"]),
        value=row["value"],
        threshold=row["threshold"],
        message=row["message"],
    )


def dead_list_args(params: DeadListParams) -> dict[str, Any]:
    """``dead_list``'s parameters (the keyset cursor as its time and id)."""
    return {
        "queue": params.queue,
        "task": params.task,
        "error_type": params.error_type,
        "limit": params.limit,
        "offset": params.offset,
        "before_at": to_db_time(params.before[0]) if params.before else None,
        "before_id": to_db_id(params.before[1]) if params.before else None,
    }


def finish_items(params: JobsFinishParams) -> list[dict[str, Any]]:
    """``jobs_finish_many``'s items for the statements' JSON parameter, one outcome per job, None values left
    out (a missing key reads as NULL on both engines: json_extract, JSON_TABLE)."""
    items = []
    for item in one_outcome_per_job(params.items):
        error = item.error
        fields = {
            "id": to_db_id(item.id),
            "receipt": item.receipt,
            "state": item.state,
            "result": item.result,
            "reason": item.reason,
            "error_type": None if error is None else error.type,
            "error_message": None if error is None else error.message,
            "traceback": None if error is None else error.traceback,
            "ran": 1 if item.ran else 0,
            "counted": 1 if item.counted else 0,
        }
        items.append({k: v for k, v in fields.items() if v is not None})
    return items
