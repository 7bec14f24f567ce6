"""Job handles: what ``send`` returns and ``App.job`` looks up."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from conveyor._errors import ConfigurationError, JobNotFoundError, JobTimeoutError, UnreadableResult
from conveyor._limits import check_seconds
from conveyor.backends.base import TERMINAL_STATES, Backend, JobGetParams, JobRecord, JobState

#: How many characters of a stored value Python cannot read a JobStatus shows (see ``_stored_json``).
UNREADABLE_PREVIEW = 200


@dataclass(frozen=True, slots=True)
class JobError:
    """The error of a job's last failed attempt."""

    type: str
    message: str
    traceback: str


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A snapshot of one job: where it is in its lifecycle and how it went."""

    id: UUID
    queue: str
    task: str
    state: JobState
    attempts: int
    deliveries: int
    max_attempts: int
    priority: int
    payload: dict[str, Any]
    headers: dict[str, Any]
    enqueued_at: datetime
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    #: What the handler returned, as stored; read it as ``result``, which raises UnreadableResult when it could
    #: not be read (None here then).
    stored_result: Any
    error: JobError | None
    reason: str | None
    idempotency_key: str | None
    ordering_key: str | None
    replay_of: UUID | None
    replayed_by: UUID | None
    #: Times the job's lease expired (its worker died or hung while holding it).
    rescues: int = 0
    #: What of the stored job Python could not read as JSON, by field (``payload``, ``headers``, ``result``), and
    #: why: a value another writer or a hand edit stored. An unreadable payload or headers reads as the note
    #: ``{"unreadable": <why>}`` (so that listings show it); an unreadable result raises when read.
    unreadable: Mapping[str, str] = field(default_factory=dict)

    @property
    def result(self) -> Any:
        """What the handler returned (None when it returned None, kept no result, or has not completed).

        Raises UnreadableResult when the stored result is not JSON Python can read (``unreadable["result"]``
        says why), so that it cannot pass for a value the handler returned."""
        why = self.unreadable.get("result")
        if why is not None:
            raise UnreadableResult(self.id, why)
        return self.stored_result

    @property
    def done(self) -> bool:
        """True once the job is terminal (completed, dead, expired or cancelled)."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_record(cls, record: JobRecord) -> JobStatus:
        error = None
        if record.error_type:
            error = JobError(record.error_type, record.error_message or "", record.traceback or "")
        unreadable: dict[str, str] = {}
        payload = _stored_json(record.payload, "payload", unreadable)
        headers = _stored_json(record.headers, "headers", unreadable)
        result = None if record.result is None else _stored_json(record.result, "result", unreadable)
        return cls(
            id=record.id,
            queue=record.queue,
            task=record.task,
            state=record.state,
            attempts=record.attempts,
            deliveries=record.deliveries,
            max_attempts=record.max_attempts,
            priority=record.priority,
            payload=payload,
            headers=headers,
            enqueued_at=record.enqueued_at,
            run_at=record.run_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            stored_result=None if "result" in unreadable else result,
            error=error,
            reason=record.reason,
            idempotency_key=record.idempotency_key,
            ordering_key=record.ordering_key,
            replay_of=record.replay_of,
            replayed_by=record.replayed_by,
            rescues=record.rescues,
            unreadable=unreadable,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (ids and times as strings); a result that could not be read as null, with
        ``unreadable["result"]`` saying why."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if name == "stored_result":
                name = "result"
            elif name == "unreadable":
                value = dict(value)
            elif isinstance(value, UUID):
                value = str(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, JobError):
                value = {"type": value.type, "message": value.message, "traceback": value.traceback}
            out[name] = value
        return out

    def dead_letter_json(self) -> dict[str, Any]:
        """The summary of a dead letter that lists show (the CLI's ``--json`` and the HTTP list)."""
        return {
            "id": str(self.id),
            "queue": self.queue,
            "task": self.task,
            "attempts": self.attempts,
            "deliveries": self.deliveries,
            "failed_at": self.finished_at.isoformat() if self.finished_at else None,
            "reason": self.reason,
            "error_type": self.error.type if self.error else None,
            "error_message": self.error.message if self.error else None,
            "idempotency_key": self.idempotency_key,
        }


def _stored_json(text: str, what: str, unreadable: dict[str, str]) -> Any:
    """A stored payload, headers or result as Python values. One that Python cannot read (an integer of 4,300+
    digits, JSON nested past Python's recursion limit, text that is not JSON: another writer's) is put in
    ``unreadable`` under ``what``, saying why and how it begins, and read as the note ``{"unreadable": ...}``,
    so that the row shows as what it is rather than stopping every listing, selection and replay it is part of."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: not JSON, or an integer of 4,300+ digits
        begins = text[:UNREADABLE_PREVIEW] + ("..." if len(text) > UNREADABLE_PREVIEW else "")
        why = str(exc)[:200]
        unreadable[what] = f"the stored {what} is not JSON Python can read ({why}); it begins: {begins}"
        return {"unreadable": unreadable[what]}


class Job:
    """A handle on one job by id. ``status()`` reads it; ``wait()`` blocks until it ends."""

    __slots__ = ("backend", "id")

    def __init__(self, backend: Backend, job_id: UUID) -> None:
        self.backend = backend
        self.id = job_id

    def __repr__(self) -> str:
        return f"<Job {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def status(self) -> JobStatus:
        """The job as stored now. Raises JobNotFoundError if it does not exist (or was purged)."""
        record = self.backend.job_get(JobGetParams(self.id))
        if record is None:
            raise JobNotFoundError(f"no job {self.id}")
        return JobStatus.from_record(record)

    def wait(self, timeout: float = 30.0, poll: float = 0.05) -> JobStatus:
        """Block until the job is terminal; return its final status.

        Raises JobTimeoutError after ``timeout`` seconds."""
        deadline = _deadline(timeout, poll)
        while True:
            status = self.status()
            if status.done:
                return status
            if time.monotonic() >= deadline:
                raise JobTimeoutError(f"job {self.id} still {status.state} after {timeout}s")
            time.sleep(poll)

    async def wait_async(self, timeout: float = 30.0, poll: float = 0.05) -> JobStatus:
        """Like :meth:`wait`, without blocking the event loop."""
        deadline = _deadline(timeout, poll)
        while True:
            status = await asyncio.to_thread(self.status)
            if status.done:
                return status
            if time.monotonic() >= deadline:
                raise JobTimeoutError(f"job {self.id} still {status.state} after {timeout}s")
            await asyncio.sleep(poll)


def _deadline(timeout: float, poll: float) -> float:
    """When a wait of ``timeout`` seconds ends; ConfigurationError for a timeout or poll interval that
    is not a finite number of seconds (NaN waited forever)."""
    check_seconds(poll, "poll", ConfigurationError, strict=True)
    return time.monotonic() + check_seconds(timeout, "timeout", ConfigurationError)
