"""The storage seam: one narrow, batch-oriented contract implemented once per database engine.

Every method takes one frozen params dataclass (with an injectable ``now``) and does one thing in
one transaction. No policy lives here: whether a failed job retries or dies, how long it backs off,
when a delivery counts as poison, all of that is decided above the seam in plain Python, once, and
is therefore the same on every engine.

Vocabulary
----------
- A *job* lives in the jobs table while it is ``pending`` or ``processing``; when it ends
  (``completed``, ``dead``, ``expired``, ``cancelled``) it moves to the archive in the same statement.
- A *delivery* is one hand-out of a job to a worker. Each delivery carries a fresh *receipt*; every
  later call about that delivery (finish, retry, release, extend) names the receipt, so that a
  worker whose lease expired cannot overwrite the outcome of a newer delivery (SQS's rule).
- ``deliveries`` counts the starts of a job's handler, never its leases: a start is counted with its
  outcome (finish and retry add it), or earlier by ``jobs_start_many`` (a heartbeat counts the jobs
  running long; a worker counts a *suspect* job before its handler runs). ``attempts`` counts handler
  runs whose outcome was recorded. ``deliveries > attempts`` therefore means a counted start lost its
  outcome (its worker died or hung).
- ``rescues`` counts a job's expired leases (``jobs_rescue_expired``: its worker died or hung while
  holding it, running it or only prefetching it). A job with ``rescues > 0`` is a suspect, whose starts
  are counted before its handler runs. So a worker that dies charges none of the jobs it merely held,
  and a job that kills its workers is still counted on every start after its first crash, which is
  what poison protection (``max_deliveries``) compares.

Times are timezone-aware UTC ``datetime``s. Payloads, headers and results cross the seam as JSON
text: they are encoded once by the producer and decoded once by the worker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable
from uuid import UUID

from conveyor._errors import ConfigurationError

LiveState = Literal["pending", "processing"]
TerminalState = Literal["completed", "dead", "expired", "cancelled"]
JobState = Literal["pending", "processing", "completed", "dead", "expired", "cancelled"]

TERMINAL_STATES: tuple[TerminalState, ...] = ("completed", "dead", "expired", "cancelled")


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


# Not frozen, unlike the other params: send_many builds one per job, and a frozen dataclass's
# __init__ (object.__setattr__ per field) cost 7x a plain one. Treat it as read-only all the same.
@dataclass(slots=True)
class NewJob:
    """A job to insert. ``payload`` and ``headers`` are JSON text (an object).

    ``dedup_until``: with an ``idempotency_key``, the end of the key's dedup window. While a key
    is held (its window has not passed) inserting the same ``(queue, idempotency_key)`` again
    inserts nothing and returns the id of the job that holds the key. After the window the key
    may be taken again by a new job. With a key but no ``dedup_until`` the key is held with no end.
    A job id is accepted once: inserting a job whose id is live (pending or processing) or archived
    changes nothing and answers that id (a producer's resend). ``fresh`` is the caller's promise
    that the id was minted for this job and never sent before (see ``conveyor._ids.MintedId``):
    an engine may then skip looking for the id in the archive, which bulk inserts could not afford.
    An id whose archived row retention has already deleted can be inserted again."""

    id: UUID
    queue: str
    task: str
    payload: str
    headers: str
    priority: int
    run_at: datetime
    max_attempts: int
    max_deliveries: int
    expires_at: datetime | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    replay_of: UUID | None = None
    dedup_until: datetime | None = None
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class Delivery:
    """One hand-out of a job to a worker, as returned by ``jobs_acquire``. ``deliveries`` counts the
    earlier starts (not this one); ``rescues > 0`` makes the job a suspect (see the module docs)."""

    id: UUID
    queue: str
    task: str
    payload: str
    headers: str
    priority: int
    run_at: datetime
    enqueued_at: datetime
    expires_at: datetime | None
    attempts: int
    deliveries: int
    max_attempts: int
    max_deliveries: int
    idempotency_key: str | None
    ordering_key: str | None
    receipt: str
    lease_expires_at: datetime
    rescues: int = 0

    # Written by hand, as Message's: a frozen dataclass's own __init__ sets each field through
    # object.__setattr__, which was most of the cost of building a delivery from an acquired row
    # (a worker builds one per job). The slots' descriptors set them directly.
    def __init__(
        self,
        id: UUID,
        queue: str,
        task: str,
        payload: str,
        headers: str,
        priority: int,
        run_at: datetime,
        enqueued_at: datetime,
        expires_at: datetime | None,
        attempts: int,
        deliveries: int,
        max_attempts: int,
        max_deliveries: int,
        idempotency_key: str | None,
        ordering_key: str | None,
        receipt: str,
        lease_expires_at: datetime,
        rescues: int = 0,
    ) -> None:
        s = _DELIVERY_SETTERS
        s[0](self, id)
        s[1](self, queue)
        s[2](self, task)
        s[3](self, payload)
        s[4](self, headers)
        s[5](self, priority)
        s[6](self, run_at)
        s[7](self, enqueued_at)
        s[8](self, expires_at)
        s[9](self, attempts)
        s[10](self, deliveries)
        s[11](self, max_attempts)
        s[12](self, max_deliveries)
        s[13](self, idempotency_key)
        s[14](self, ordering_key)
        s[15](self, receipt)
        s[16](self, lease_expires_at)
        s[17](self, rescues)


# The slot descriptors' setters of Delivery's fields, in declaration order.
_DELIVERY_SETTERS: tuple[Any, ...] = tuple(vars(Delivery)[f.name].__set__ for f in fields(Delivery))


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What a failed attempt raised."""

    type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored, live or archived (the read model for ``job_get``, DLQ listings, export)."""

    id: UUID
    queue: str
    task: str
    payload: str
    headers: str
    state: JobState
    priority: int
    run_at: datetime
    enqueued_at: datetime
    expires_at: datetime | None
    attempts: int
    deliveries: int
    max_attempts: int
    max_deliveries: int
    idempotency_key: str | None
    ordering_key: str | None
    replay_of: UUID | None
    first_started_at: datetime | None
    started_at: datetime | None
    lease_expires_at: datetime | None
    worker_id: str | None
    # Last failure (live rows keep the error of their last attempt while they wait to retry).
    error_type: str | None
    error_message: str | None
    traceback: str | None
    # Archive-only fields; None for live rows.
    finished_at: datetime | None = None
    result: str | None = None
    reason: str | None = None
    replayed_by: UUID | None = None
    #: How many times the job's lease expired (its worker died or hung while holding it).
    rescues: int = 0


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """Names one delivery: the job id and the receipt it was handed out with."""

    id: UUID
    receipt: str


@dataclass(frozen=True, slots=True)
class Finish:
    """A terminal outcome for one delivery. ``result`` is JSON text (completed only)."""

    id: UUID
    receipt: str
    state: TerminalState
    result: str | None = None
    reason: str | None = None
    error: ErrorInfo | None = None
    # Whether the handler ran for this delivery (it did not when poison protection or TTL ended
    # the job before running it); when it ran, ``attempts`` is incremented, and ``deliveries`` too
    # unless its start was already ``counted`` (``jobs_start_many``).
    ran: bool = True
    counted: bool = False


@dataclass(frozen=True, slots=True)
class RetryItem:
    """Return one delivery to ``pending`` to run again at ``run_at`` (the handler ran and failed)."""

    id: UUID
    receipt: str
    run_at: datetime
    error: ErrorInfo
    #: Whether this delivery's start was already counted (``jobs_start_many``); if not, retry counts it.
    counted: bool = False


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts for one queue at one instant."""

    queue: str
    pending: int  # ready now
    scheduled: int  # pending with run_at in the future
    processing: int
    completed: int
    dead: int  # dead letters not yet replayed (the DLQ depth)
    expired: int
    cancelled: int
    oldest_pending_age: float | None  # seconds since the oldest ready job became ready
    # Totals since the counters began (migration PostgreSQL 0004 / SQLite 0006 seeded them from the
    # archive): kept by the statements that write outcomes, so retention never lowers them.
    # ``completed``, ``expired`` and ``cancelled`` above are these totals too; ``dead`` stays the DLQ
    # depth (unreplayed dead letters still archived), ``dead_total`` counts every dead-lettering.
    dead_total: int = 0
    #: Jobs ever enqueued to the queue: live rows plus every terminal total (a replay is a new job).
    enqueued: int = 0


@dataclass(frozen=True, slots=True)
class TaskTotals:
    """Terminal outcomes of one task on one queue since the counters began (monotonic: retention,
    replay and purge never lower them). Read from the per-queue counters, never from the archive."""

    queue: str
    task: str
    completed: int
    dead: int
    expired: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class DatabaseHealth:
    """Database-wide signals that slow every queue on a server. None where the engine has no such
    thing (SQLite has neither long transactions holding back cleanup nor dead tuples)."""

    #: Age in seconds of the oldest open transaction in this database that holds a snapshot or a
    #: transaction id (0 when there is none): while it stays open, vacuum can clean none of the
    #: rows deleted since it began.
    oldest_transaction_age: float | None
    #: Dead tuples in the jobs table (finished or retried rows vacuum has not cleaned yet).
    jobs_dead_tuples: int | None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker process as it last reported itself (its heartbeat writes the row).

    ``in_flight`` names the jobs it holds leases on now (running or prefetched), read from the jobs
    table, so it is exact. ``alive`` is whether it reported within the staleness window of the read
    (three heartbeat intervals by default); a worker that stops cleanly removes its row."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime
    last_seen: datetime
    in_flight: tuple[UUID, ...] = ()
    alive: bool = True

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's ``workers --json`` and the HTTP worker list)."""
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "started_at": self.started_at.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "alive": self.alive,
            "in_flight": [str(i) for i in self.in_flight],
        }


AlertStateName = Literal["firing", "resolved"]


@dataclass(frozen=True, slots=True)
class AlertState:
    """One alert: a rule (``dlq_depth``, ``oldest_pending_age``, ``depth``, ``no_worker``,
    ``long_transaction``) on a queue (None for database-wide rules), its state and since when,
    the value last measured, the threshold it is compared with, and a message for humans."""

    rule: str
    queue: str | None
    state: AlertStateName
    since: datetime
    value: float
    threshold: float
    message: str

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's ``alerts --json`` and the HTTP alert list). A value or
        threshold that is not finite (never stored by an evaluator, but a row written by hand must
        not break a listing) is null."""
        return {
            "rule": self.rule,
            "queue": self.queue,
            "state": self.state,
            "since": self.since.isoformat(),
            "value": self.value if math.isfinite(self.value) else None,
            "threshold": self.threshold if math.isfinite(self.threshold) else None,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action (replay, purge, ...)."""

    id: int
    at: datetime
    actor: str
    action: str
    reason: str
    job_ids: tuple[UUID, ...]
    details: str  # JSON text

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's ``audit --json`` and the HTTP audit list)."""
        return {
            "id": self.id,
            "at": self.at.isoformat(),
            "actor": self.actor,
            "action": self.action,
            "reason": self.reason,
            "job_ids": [str(j) for j in self.job_ids],
            "details": json.loads(self.details or "{}"),
        }


# --------------------------------------------------------------------------------------------
# Params
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobsInsertParams:
    """Insert jobs in one round trip. ``conn`` is the caller's own open connection (psycopg for
    PostgreSQL, sqlite3 for SQLite): the insert then joins the caller's transaction and is committed
    (or rolled back) by the caller.

    With ``strict_keys``, a job whose idempotency key is held by a job of another task or payload
    (``conveyor._idempotency.same_job``; an earlier job of the same batch included) raises
    IdempotencyConflict inside the insert's transaction, so that no job of the batch is written (on
    ``conn``, the caller must roll back). Without it such a job answers the holder's id.

    ``lock_wait`` bounds (seconds) how long the insert waits for a row another transaction holds and
    has not committed (an idempotency key claimed in an application's open transaction): past it,
    LockWaitTimeout and nothing written. None: the engine's usual wait. Only jobs that can meet such a
    row are bounded (a key, a resent id); not with ``conn`` (the caller's session decides there). MySQL
    counts whole seconds (0 on MariaDB: no wait, 1 on MySQL); SQLite has one writer at a time and ignores it."""

    jobs: Sequence[NewJob]
    now: datetime
    conn: Any = None
    strict_keys: bool = False
    lock_wait: float | None = None


@dataclass(frozen=True, slots=True)
class JobsAcquireParams:
    """Lease up to ``limit`` ready jobs of one queue: ``pending``, ``run_at <= now``; order
    priority DESC, run_at, id. Each gets a fresh receipt, ``lease_expires_at = now +
    visibility_timeout``, ``worker_id``, ``started_at = now`` and ``first_started_at =
    coalesce(first_started_at, now)``. A lease is not a delivery: ``deliveries`` is counted when the
    job's handler starts (see the module docs).

    Per-key FIFO: a job with an ``ordering_key`` is eligible only while it is the head of its key,
    i.e. no other live row (pending or processing) of the same queue and key has a smaller id. So
    at most one job per key is in flight, in enqueue (id) order, and a job waiting to retry blocks
    the jobs behind it. A job is also not eligible while another job of its key is ``processing``
    (a smaller id may commit after a larger one of its key was handed out).

    A job written with its ``run_at`` ahead is handed out once it is due. Engines keep such jobs apart
    (``scheduled`` rows, out of the index acquires read) and make the due ones ready first, 1,000 per
    acquire at most, the earliest first (a larger backlog that came due at once is handed out over
    several acquires, in run_at order before priority): SQLite in every acquire, PostgreSQL when one
    may be due (see ``backends/postgres/_promotion.py``: a job another process scheduled can wait up to
    about a second), MySQL in every acquire (as SQLite). With ``promote`` False that step is skipped on
    every engine, so the acquire leaves out jobs that came due since the engine last promoted (and
    learns nothing for ``jobs_next_due``): the worker's pickup after a notification passes False (it is
    on the latency path; the fetch loop's next acquire promotes). MySQL and a SQLite file never notify,
    so their workers always promote."""

    queue: str
    limit: int
    visibility_timeout: float
    worker_id: str
    now: datetime
    promote: bool = True


@dataclass(frozen=True, slots=True)
class JobsStartParams:
    """Count deliveries as started now (``deliveries + 1``), before their outcome. Stale receipts are
    skipped. A worker calls it before running a suspect job (so a handler that kills its worker has
    been counted), and from its heartbeat for the jobs that have been running a while (so their start
    is known should the worker die).

    ``wait=False`` (the heartbeat's, through the completer) skips a row another transaction holds
    locked: it is not counted this time and its id not returned (the heartbeat asks again at its next
    beat), so that one locked row cannot hold up the outcomes flushed after the counts. A suspect's
    count before it runs waits (``wait=True``): a missing id there means the lease was lost."""

    items: Sequence[LeaseRef]
    now: datetime
    wait: bool = True


@dataclass(frozen=True, slots=True)
class JobsFinishParams:
    """Move deliveries to the archive in their terminal state. Items whose receipt no longer
    matches a ``processing`` row are skipped (stale)."""

    items: Sequence[Finish]
    now: datetime


@dataclass(frozen=True, slots=True)
class JobsRetryParams:
    """Return deliveries to ``pending`` at their ``run_at`` with ``attempts + 1`` and the error
    recorded. Stale receipts are skipped."""

    items: Sequence[RetryItem]
    now: datetime


@dataclass(frozen=True, slots=True)
class JobsReleaseParams:
    """Hand leased deliveries back to ``pending`` at once (receipt, lease and worker cleared;
    ``deliveries`` unchanged). Used by graceful shutdown for the jobs still in its buffer."""

    items: Sequence[LeaseRef]
    now: datetime


@dataclass(frozen=True, slots=True)
class LeasesExtendParams:
    """Set ``lease_expires_at = now + visibility_timeout`` for deliveries still held.

    ``wait=False`` (the heartbeat's) does not wait for a row another transaction holds locked (an
    operator's open transaction, say): that lease is left as it is this time and its id returned as
    held, so that one locked row cannot stall the extension of all the others until they expire.
    ``wait=True`` (a handler's ``ctx.extend``) waits for it: its id is returned only if extended."""

    items: Sequence[LeaseRef]
    visibility_timeout: float
    now: datetime
    wait: bool = True


@dataclass(frozen=True, slots=True)
class JobsRescueParams:
    """Return up to ``limit`` ``processing`` rows whose lease expired before ``now`` to
    ``pending`` (their worker died or hung), with ``rescues + 1``. ``deliveries`` is kept."""

    now: datetime
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class JobGetParams:
    id: UUID


@dataclass(frozen=True, slots=True)
class QueuesStatsParams:
    now: datetime


@dataclass(frozen=True, slots=True)
class DeadListParams:
    """Dead letters not yet replayed, newest first (``finished_at`` DESC, ``id`` DESC).

    ``before`` is a keyset cursor: only rows strictly after it in that order (the ``(finished_at,
    id)`` of the last row of the previous page), so that paging a large DLQ costs the same on every
    page; ``offset`` skips rows the plain way."""

    queue: str | None = None
    task: str | None = None
    error_type: str | None = None
    limit: int = 100
    offset: int = 0
    before: tuple[datetime, UUID] | None = None


@dataclass(frozen=True, slots=True)
class DeadReplayParams:
    """Re-enqueue dead letters to their source queue with fresh attempts, in one transaction.

    ``replays`` maps each dead job id to the id of its new job (minted above the seam, UUIDv7).
    The new job keeps queue, task, payload, headers, priority, idempotency and ordering keys,
    ``max_attempts`` and ``max_deliveries``, gets ``run_at = now`` and ``replay_of`` = the dead
    id; the dead row gets ``replayed_by`` = the new id. Ids that are not unreplayed dead letters
    are skipped. One audit row is written for the whole call: action ``"replay"``, ``job_ids`` =
    the dead ids replayed."""

    replays: Sequence[tuple[UUID, UUID]]
    actor: str
    reason: str
    now: datetime


@dataclass(frozen=True, slots=True)
class DeadPurgeParams:
    """Delete dead letters for good (audited: one audit row, action ``"purge"``, ``job_ids`` = the
    ids deleted)."""

    ids: Sequence[UUID]
    actor: str
    reason: str
    now: datetime


@dataclass(frozen=True, slots=True)
class AuditListParams:
    limit: int = 100
    #: Only the actions that name this job (its replay, its purge); None: every action.
    job_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class AuditInsertParams:
    """Record one operator action that changed no job row itself (a schedule paused, a token made).
    Replay and purge write their own audit row in their transaction."""

    actor: str
    action: str
    reason: str
    now: datetime
    job_ids: Sequence[UUID] = ()
    details: str = "{}"  # JSON text


@dataclass(frozen=True, slots=True)
class ArchiveReadParams:
    """Archived rows ordered by (finished_at, id), strictly after the watermark ``after``
    (a (finished_at, id) pair), for incremental export."""

    after: tuple[datetime, UUID] | None
    limit: int = 10_000


@dataclass(frozen=True, slots=True)
class JobsListParams:
    """Live rows (pending and processing), for export and inspection, ordered by id."""

    queue: str | None = None
    limit: int = 10_000
    after: UUID | None = None


# --------------------------------------------------------------------------------------------
# Delivery features: effects-once keys, schedules, topics, backpressure, retention
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessedKeyClaimParams:
    """Record that the side effect named ``key`` happened (consumer-side idempotency).

    Returns True when the key was claimed now (first time, or its previous claim expired), False
    when an unexpired claim exists. With ``conn`` (the handler's own open connection) the claim
    joins the caller's transaction, so it commits together with the side effect or not at all."""

    key: str
    expires_at: datetime
    now: datetime
    conn: Any = None


@dataclass(frozen=True, slots=True)
class KeysPruneParams:
    """Delete idempotency keys and processed keys that expired before ``now`` (bounded batch)."""

    now: datetime
    limit: int = 10_000


@dataclass(frozen=True, slots=True)
class Schedule:
    """A periodic job: every tick of ``cron`` (5 fields, UTC) enqueues ``task`` on ``queue``.

    ``next_run_at`` is the next tick due. Firing is compare-and-set on it, so that however many
    schedulers run, each tick fires once, and on the definition read (see ``ScheduleFireParams``)."""

    name: str
    cron: str
    task: str
    queue: str
    payload: str  # JSON text
    next_run_at: datetime
    paused: bool = False
    priority: int = 0
    last_run_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SchedulesUpsertParams:
    """Create schedules, or update cron/task/queue/payload/priority of existing ones.

    An existing schedule keeps ``paused`` and ``last_run_at``; its ``next_run_at`` is replaced only
    when its cron changed (so re-declaring schedules at every worker start does not skip or repeat
    a tick)."""

    schedules: Sequence[Schedule]


@dataclass(frozen=True, slots=True)
class SchedulesUpdateParams:
    """Change one schedule: pause/resume, or a new cron with its next tick. Returns False if absent."""

    name: str
    paused: bool | None = None
    cron: str | None = None
    next_run_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SchedulesDeleteParams:
    name: str


@dataclass(frozen=True, slots=True)
class _ScheduleRead:
    """A statement on one schedule as the scheduler read it: a compare-and-set on its next tick and its
    definition (see :class:`ScheduleFireParams`)."""

    schedule: Schedule

    @property
    def name(self) -> str:
        return self.schedule.name

    @property
    def due_at(self) -> datetime:
        """The next tick read, which the compare-and-set compares."""
        return self.schedule.next_run_at

    def read_args(self) -> dict[str, Any]:
        """The definition compared with the stored one, as the statement's ``read_*`` parameters (the job's
        own task, queue, payload and priority are other parameters of a fire)."""
        s = self.schedule
        return {
            "read_cron": s.cron,
            "read_task": s.task,
            "read_queue": s.queue,
            "read_payload": s.payload,
            "read_priority": s.priority,
        }


@dataclass(frozen=True, slots=True)
class ScheduleFireParams(_ScheduleRead):
    """Fire one tick of ``schedule`` as the scheduler read it: in one transaction, if the schedule is
    not paused, its ``next_run_at`` still equals the one read (the compare-and-set) and its definition
    (cron, task, queue, payload, priority) is still the one read, set ``next_run_at =
    next_run_at_after`` and ``last_run_at = fired_at`` and insert ``job``. ``fired_at`` is the tick the
    job is for: after downtime the latest missed one, not the stored ``due_at`` (None: ``due_at``).
    Returns True if this call fired the tick, False if another scheduler did (or the schedule was
    paused, redefined or deleted meanwhile: a job and a next tick worked out from a definition that
    changed since it was read are stale, and the scheduler reads the schedule again).

    ``schedule`` is compared as ``schedules_list`` returned it (the payload by the engine's own
    equality of stored payloads)."""

    next_run_at_after: datetime
    job: NewJob
    now: datetime
    fired_at: datetime | None = None

    @property
    def last_run_at(self) -> datetime:
        """The tick stored as the schedule's ``last_run_at``."""
        return self.due_at if self.fired_at is None else self.fired_at


@dataclass(frozen=True, slots=True)
class ScheduleMoveParams(_ScheduleRead):
    """Move a schedule's next tick (back, or on past a tick already fired) without firing: if the
    schedule is not paused and its ``next_run_at`` and definition are still those of ``schedule`` as
    read (the same compare-and-set as a fire), set it to ``next_run_at``. Returns True if this call
    moved it, False if a scheduler fired or moved that tick first (or the schedule was paused,
    redefined or deleted meanwhile)."""

    next_run_at: datetime


@dataclass(frozen=True, slots=True)
class Subscription:
    """Binds a queue to a topic: each published message whose headers match ``filter`` is copied to
    ``queue`` as a job for ``task``. ``filter`` is JSON text: an object whose keys are header names and
    whose values are either a scalar (equality) or ``{"in": [...]}``; ``{}`` matches everything."""

    topic: str
    queue: str
    task: str
    filter: str = "{}"


@dataclass(frozen=True, slots=True)
class SubscriptionsUpsertParams:
    subscriptions: Sequence[Subscription]


@dataclass(frozen=True, slots=True)
class SubscriptionsListParams:
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class SubscriptionsDeleteParams:
    topic: str
    queue: str


@dataclass(frozen=True, slots=True)
class QueueLoadParams:
    """The live depth of one queue and how many of its jobs ended in ``[now - window, now]``; and
    which of ``keys`` (idempotency keys of the queue) are held at ``now``: a send reusing a held
    key adds no job (the insert answers the holder), so backpressure does not count it."""

    queue: str
    now: datetime
    window: float = 60.0
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueLoad:
    queue: str
    depth: int  # live rows: pending (ready or scheduled) + processing
    drained: int  # archived in the window
    window: float
    held: frozenset[str] = frozenset()  # the params' keys whose window is open at ``now``


@dataclass(frozen=True, slots=True)
class ArchivePruneParams:
    """Delete archived rows past retention, at most ``limit`` per call (call again until 0).

    A row of queue Q in state S is past retention when ``finished_at < before[Q]`` (dead letters:
    ``dead_before[Q]``), falling back to ``default_before`` / ``default_dead_before`` for queues not
    named. Engines with time partitions drop whole partitions that only hold rows past retention."""

    now: datetime
    default_before: datetime
    default_dead_before: datetime
    before: Mapping[str, datetime] = field(default_factory=dict)
    dead_before: Mapping[str, datetime] = field(default_factory=dict)
    limit: int = 10_000


@dataclass(frozen=True, slots=True)
class TaskTotalsParams:
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class DatabaseHealthParams:
    now: datetime


# --------------------------------------------------------------------------------------------
# Observability: the worker registry and alert states
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkersBeatParams:
    """Record that ``worker`` is alive at ``now`` (insert it, or update ``last_seen``, queues and
    concurrency; ``started_at`` and ``host``/``pid`` of an existing row are kept)."""

    worker: WorkerInfo
    now: datetime


@dataclass(frozen=True, slots=True)
class WorkersRemoveParams:
    """Forget a worker (it stopped cleanly). Returns False if there was no such row."""

    id: str


@dataclass(frozen=True, slots=True)
class WorkersListParams:
    """Workers seen at or after ``seen_after`` (None: all), by id, each with its in-flight jobs
    (``processing`` rows whose ``worker_id`` is its id)."""

    seen_after: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkersPruneParams:
    """Delete the rows of workers not seen since ``before`` (they died without removing them)."""

    before: datetime


@dataclass(frozen=True, slots=True)
class AlertsSetParams:
    """Write the latest evaluation of alerts. For each item: if the stored alert (same rule and
    queue) is in another state, or absent and the item is firing, the state changes to the item's,
    with ``since = item.since``; otherwise only value, threshold and message are updated (a
    resolved alert with no row writes nothing). The state change is a compare-and-set: of several
    evaluators writing the same change at once, one gets it back; returns the items whose state
    this call changed (their notifications are the caller's to send)."""

    items: Sequence[AlertState]
    now: datetime


# --------------------------------------------------------------------------------------------
# API tokens (the HTTP service's bearer tokens)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    """One API token as stored: never the secret itself, only its SHA-256 (``secret_hash``, hex).

    ``id`` is the public part of the bearer string, by which the token is looked up; ``name`` is
    unique for ever (a revoked token keeps it) and is the actor of every action taken with the
    token. ``role`` is ``producer``, ``operator`` or ``admin``; ``queues`` limits the token to those
    queues (None: every queue)."""

    id: str
    name: str
    role: str
    queues: tuple[str, ...] | None
    secret_hash: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class TokensInsertParams:
    """Store a new token. Returns False, with nothing written, if its name or id is taken."""

    token: Token


@dataclass(frozen=True, slots=True)
class TokenGetParams:
    """The token with this public id (revoked and expired ones too), or None."""

    id: str


@dataclass(frozen=True, slots=True)
class TokensRevokeParams:
    """Set ``revoked_at = now`` on the unrevoked token named ``name``. Returns False if there is none."""

    name: str
    now: datetime


# Checks every engine makes the same way
# --------------------------------------------------------------------------------------------

_Outcome = TypeVar("_Outcome", Finish, RetryItem)


def one_outcome_per_job(items: Sequence[_Outcome]) -> list[_Outcome]:
    """The items of an outcome batch an engine writes: the first for each delivery, i.e. each (job id,
    receipt) (a second would archive a job twice, or race with the first inside one statement).
    Items naming one job with different receipts all stay: at most one of them is current, and it
    must apply even when a stale one (an earlier delivery's late outcome) comes first in the batch.
    Raises ConfigurationError for a finish whose state is not terminal: the caller's bug, refused
    before the database sees it."""
    seen: set[tuple[UUID, str]] = set()
    kept: list[_Outcome] = []
    for item in items:
        if isinstance(item, Finish) and item.state not in TERMINAL_STATES:
            raise ConfigurationError(f"not a terminal state: {item.state!r}")
        if (item.id, item.receipt) not in seen:
            seen.add((item.id, item.receipt))
            kept.append(item)
    return kept


# --------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------


class Listener(Protocol):
    """Wakes an idle fetcher when jobs are inserted into one of its queues."""

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if woken by a notification (it may be spurious)."""
        ...

    def close(self) -> None: ...


class LoopStatements(Protocol):
    """The worker's two most frequent statements, acquire and finish, as coroutines on its event loop:
    an optional capability of a backend whose driver has an async mode (PostgreSQL). Same semantics
    and errors as the Backend methods of the same names; without it the worker runs those on its
    database threads, whose every wake-up takes the GIL from the handlers on the loop (measured: an
    async drain +23-26 %, worker CPU -22 %; docs/benchmarks.md). One instance belongs to one worker
    run on one loop."""

    async def jobs_acquire(self, params: JobsAcquireParams) -> list[Delivery]: ...

    async def jobs_finish_many(self, params: JobsFinishParams) -> int: ...

    def close(self) -> None:
        """Close its connections, from any thread, in or out of the loop (calls made afterwards open new ones)."""
        ...


@runtime_checkable
class Backend(Protocol):
    """The storage contract. Implementations must be safe to call from several threads."""

    #: A short engine name: "postgres", "sqlite", "memory".
    engine: str
    #: The database this backend opens, as the URL :func:`conveyor.backends.open_backend` takes (with
    #: its password: redact it before showing it).
    url: str
    #: True when ``listen`` delivers real notifications (pickup latency then does not depend on
    #: a polling interval); False when the listener only sleeps.
    notifies: bool

    def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the names of those applied."""
        ...

    def close(self) -> None: ...

    def forked(self) -> Backend:
        """For a forked child: a backend on the same database with the same options that shares
        none of this one's connections (the child must leave those alone: the parent still uses
        them). Opens nothing until its first call. A private in-memory database returns itself:
        the child's copy is its own."""
        ...

    def jobs_insert_many(self, params: JobsInsertParams) -> list[UUID]:
        """Insert jobs; return the stored id for each job, in order."""
        ...

    def jobs_acquire(self, params: JobsAcquireParams) -> list[Delivery]: ...

    def jobs_start_many(self, params: JobsStartParams) -> list[UUID]:
        """Return the ids counted as started (a missing id lost its lease)."""
        ...

    def jobs_finish_many(self, params: JobsFinishParams) -> int:
        """Return how many items applied (the rest were stale)."""
        ...

    def jobs_retry_many(self, params: JobsRetryParams) -> int:
        """Return how many items applied (the rest were stale)."""
        ...

    def jobs_release_many(self, params: JobsReleaseParams) -> int: ...

    def leases_extend_many(self, params: LeasesExtendParams) -> list[UUID]:
        """Return the ids of the deliveries still held: extended (or, with ``wait=False``, left for
        the next call because their row was locked); a missing id means the lease was lost."""
        ...

    def jobs_rescue_expired(self, params: JobsRescueParams) -> int: ...

    def job_get(self, params: JobGetParams) -> JobRecord | None: ...

    def jobs_list(self, params: JobsListParams) -> list[JobRecord]: ...

    def queues_stats(self, params: QueuesStatsParams) -> list[QueueStats]: ...

    def dead_list(self, params: DeadListParams) -> list[JobRecord]: ...

    def dead_replay_many(self, params: DeadReplayParams) -> list[tuple[UUID, UUID]]:
        """Return the (dead id, new id) pairs actually replayed."""
        ...

    def dead_purge_many(self, params: DeadPurgeParams) -> int: ...

    def audit_list(self, params: AuditListParams) -> list[AuditEntry]: ...

    def audit_insert(self, params: AuditInsertParams) -> None: ...

    def archive_read(self, params: ArchiveReadParams) -> list[JobRecord]: ...

    def listen(self, queues: Sequence[str]) -> Listener:
        """A listener woken by inserts into any of ``queues``."""
        ...

    def jobs_next_due(self, queues: Sequence[str]) -> datetime | None:
        """When the earliest scheduled job of ``queues`` that this backend knows of comes due (None: none
        known). From memory, never a statement, so any thread may ask, the event loop's included. It knows
        what its last acquire of each queue found scheduled and the scheduled jobs it wrote since (inserts,
        retries' backoffs); a job another process scheduled since is not known (the poll finds it). An idle
        worker wakes at this time rather than at its next poll, so that a known job starts at its
        ``run_at``."""
        ...

    def loop_statements(self) -> LoopStatements | None:
        """A new :class:`LoopStatements` for one worker run, or None if this engine has none."""
        ...

    # -- delivery features ---------------------------------------------------------------------

    def processed_keys_claim(self, params: ProcessedKeyClaimParams) -> bool: ...

    def keys_prune(self, params: KeysPruneParams) -> int:
        """Return how many expired keys (idempotency and processed) were deleted."""
        ...

    def schedules_upsert(self, params: SchedulesUpsertParams) -> None: ...

    def schedules_list(self) -> list[Schedule]: ...

    def schedules_update(self, params: SchedulesUpdateParams) -> bool: ...

    def schedules_delete(self, params: SchedulesDeleteParams) -> bool: ...

    def schedule_fire(self, params: ScheduleFireParams) -> bool: ...

    def schedule_move(self, params: ScheduleMoveParams) -> bool: ...

    def subscriptions_upsert(self, params: SubscriptionsUpsertParams) -> None: ...

    def subscriptions_list(self, params: SubscriptionsListParams) -> list[Subscription]: ...

    def subscriptions_delete(self, params: SubscriptionsDeleteParams) -> bool: ...

    def queue_load(self, params: QueueLoadParams) -> QueueLoad: ...

    def archive_prune(self, params: ArchivePruneParams) -> int:
        """Return how many archived rows were deleted (partitions dropped count their rows)."""
        ...

    def jobs_vacuum(self) -> None:
        """Reclaim now the row versions that finished jobs left in the jobs table, where the engine
        leaves that to a background process that may come a minute later (PostgreSQL's autovacuum):
        until then every acquire steps over their index entries. Skipped while another vacuum of the
        table runs; a no-op where the engine leaves nothing behind (SQLite)."""
        ...

    # -- schema and API tokens -----------------------------------------------------------------

    def migrations_pending(self) -> list[str]:
        """The names of the migrations not yet applied (empty: the schema is current)."""
        ...

    def database_now(self) -> datetime | None:
        """The database server's clock, or None where the database has none of its own (SQLite: a file
        on this host, read by this host's clock)."""
        ...

    def tokens_insert(self, params: TokensInsertParams) -> bool: ...

    def token_get(self, params: TokenGetParams) -> Token | None: ...

    def tokens_list(self) -> list[Token]:
        """Every token (revoked and expired ones too), by name."""
        ...

    def tokens_revoke(self, params: TokensRevokeParams) -> bool: ...

    # -- observability -------------------------------------------------------------------------

    def task_totals(self, params: TaskTotalsParams) -> list[TaskTotals]:
        """Terminal totals per (queue, task), from the counters (never the archive), by queue and task."""
        ...

    def database_health(self, params: DatabaseHealthParams) -> DatabaseHealth: ...

    def workers_beat(self, params: WorkersBeatParams) -> None: ...

    def workers_remove(self, params: WorkersRemoveParams) -> bool: ...

    def workers_list(self, params: WorkersListParams) -> list[WorkerInfo]: ...

    def workers_prune(self, params: WorkersPruneParams) -> int: ...

    def alerts_list(self) -> list[AlertState]:
        """Every stored alert (firing and resolved), by rule then queue."""
        ...

    def alerts_set(self, params: AlertsSetParams) -> list[AlertState]: ...


@dataclass(slots=True)
class PollingListener:
    """A listener for engines without notifications: it sleeps, so the fetcher polls."""

    interval: float = 0.05

    def wait(self, timeout: float) -> bool:
        import time

        time.sleep(max(0.0, min(timeout, self.interval)))
        return False

    def close(self) -> None:
        """Nothing to release."""
