"""The in-process implementation of the storage seam."""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import json
import secrets
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from conveyor._errors import BackendError, ConfigurationError
from conveyor.backends import base
from conveyor.backends.memory._listener import MemoryListener

_RECORD_STATES: frozenset[str] = frozenset(base.TERMINAL_STATES)

_Item = TypeVar("_Item", base.Finish, base.RetryItem)


@dataclass(slots=True)
class _Row:
    """A live job (pending or processing) as stored: a JobRecord's live fields plus the receipt."""

    id: UUID
    queue: str
    task: str
    payload: str
    headers: str
    state: base.LiveState
    priority: int
    run_at: datetime
    enqueued_at: datetime
    expires_at: datetime | None
    max_attempts: int
    max_deliveries: int
    idempotency_key: str | None
    ordering_key: str | None
    replay_of: UUID | None
    attempts: int = 0
    deliveries: int = 0
    first_started_at: datetime | None = None
    started_at: datetime | None = None
    lease_expires_at: datetime | None = None
    worker_id: str | None = None
    receipt: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None

    def record(self) -> base.JobRecord:
        return base.JobRecord(
            id=self.id,
            queue=self.queue,
            task=self.task,
            payload=self.payload,
            headers=self.headers,
            state=self.state,
            priority=self.priority,
            run_at=self.run_at,
            enqueued_at=self.enqueued_at,
            expires_at=self.expires_at,
            attempts=self.attempts,
            deliveries=self.deliveries,
            max_attempts=self.max_attempts,
            max_deliveries=self.max_deliveries,
            idempotency_key=self.idempotency_key,
            ordering_key=self.ordering_key,
            replay_of=self.replay_of,
            first_started_at=self.first_started_at,
            started_at=self.started_at,
            lease_expires_at=self.lease_expires_at,
            worker_id=self.worker_id,
            error_type=self.error_type,
            error_message=self.error_message,
            traceback=self.traceback,
        )


@dataclass(slots=True)
class _Key:
    """An idempotency key held by a job until ``expires_at`` (None: for ever)."""

    job_id: UUID
    expires_at: datetime | None


class _KeyLine:
    """The live rows of one ordering key of one queue, in id (enqueue) order."""

    def __init__(self) -> None:
        self.ids: list[int] = []  # sorted; ints compare far faster than UUIDs
        self.rows: dict[int, _Row] = {}
        self.in_flight = 0  # how many of the rows are processing

    def add(self, row: _Row) -> None:
        # Ids are UUIDv7, so a new row is nearly always the largest and insort appends.
        bisect.insort(self.ids, row.id.int)
        self.rows[row.id.int] = row

    def remove(self, row: _Row) -> None:
        del self.ids[bisect.bisect_left(self.ids, row.id.int)]
        del self.rows[row.id.int]

    def eligible(self) -> _Row | None:
        """The key's head (its smallest live id) if no job of the key is in flight, else None.

        The in-flight test is not implied by the head test: ids are minted before commit, so a
        smaller id may be inserted after a larger one of its key was already handed out."""
        if self.in_flight or not self.ids:
            return None
        return self.rows[self.ids[0]]


class _Queue:
    """The live rows of one queue, indexed for acquire."""

    def __init__(self) -> None:
        self.rows: dict[UUID, _Row] = {}
        # Pending rows without an ordering key: what acquire scans, with the head of each key.
        self.unkeyed_pending: dict[UUID, _Row] = {}
        self.keys: dict[str, _KeyLine] = {}


class MemoryBackend:
    """The storage contract in process memory: for tests and for the testing kit (``memory://``).

    Every call takes one lock, so the backend is safe to share between threads and each call is
    atomic: it validates its whole input before changing anything, so a call that raises has
    changed nothing. Semantics are those of the SQL engines, down to the ordering of reads and the
    counting of stale items; the conformance suite runs against it.

    What a caller must know:

    - Nothing is shared between two instances, and nothing survives the process. Archived rows stay
      in memory until ``archive_prune`` removes them.
    - ``conn`` (the caller's own connection, on ``jobs_insert_many`` and ``processed_keys_claim``)
      is refused with :class:`conveyor.ConfigurationError`: there is no transaction to join, and
      silently committing on our own would let a test pass that rolls back in production.
    - ``listen`` delivers real notifications (``notifies`` is True) through a condition variable.
    - ``migrate`` has nothing to do and ``close`` releases nothing; a closed backend keeps working.
    """

    engine = "memory"
    notifies = True

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        # Live rows, by id and by queue; processing rows apart, for rescue.
        self._jobs: dict[UUID, _Row] = {}
        self._queues: dict[str, _Queue] = {}
        self._processing: dict[UUID, _Row] = {}
        self._archive: dict[UUID, base.JobRecord] = {}
        self._idempotency: dict[tuple[str, str], _Key] = {}
        self._processed: dict[str, datetime] = {}
        self._audit: list[base.AuditEntry] = []
        self._schedules: dict[str, base.Schedule] = {}
        self._subscriptions: dict[tuple[str, str], base.Subscription] = {}
        self._listeners: set[MemoryListener] = set()

    # ------------------------------------------------------------------ lifecycle

    def migrate(self) -> list[str]:
        """Nothing to migrate: return []."""
        return []

    def close(self) -> None:
        """A no-op: there are no connections to release."""

    def listen(self, queues: Sequence[str]) -> base.Listener:
        """A listener woken by inserts into any of ``queues`` (inserts made after this call)."""
        with self._lock:
            listener = MemoryListener(self._lock, queues, self._listeners)
            self._listeners.add(listener)
            return listener

    def _notify(self, queues: Iterable[str]) -> None:
        # Called with the lock held, after an insert has been applied.
        inserted = set(queues)
        if not inserted:
            return
        woken = False
        for listener in self._listeners:
            if listener.queues & inserted:
                listener.notify()
                woken = True
        if woken:
            self._lock.notify_all()

    # ------------------------------------------------------------------ producing

    def jobs_insert_many(self, params: base.JobsInsertParams) -> list[UUID]:
        """Insert jobs; return the stored id for each, in order (the holder's id for a duplicate
        idempotency key inside its window).

        A job whose id is already stored (live or archived) is not inserted again: its id is
        answered and nothing changes. ``params.conn`` is refused with ConfigurationError (see the
        class docstring)."""
        _refuse_conn(params.conn, "jobs_insert_many")
        now = _utc(params.now)
        with self._lock:
            ids, rows, claims = self._plan_insert(params.jobs, now)
            self._apply_insert(rows, claims)
            return ids

    def _plan_insert(
        self, jobs: Sequence[base.NewJob], now: datetime
    ) -> tuple[list[UUID], list[_Row], dict[tuple[str, str], _Key]]:
        """Decide what inserting ``jobs`` does without changing anything; raise if it cannot.

        Returns the ids to answer, the rows to insert and the idempotency keys they claim."""
        ids: list[UUID] = []
        rows: list[_Row] = []
        claims: dict[tuple[str, str], _Key] = {}
        new_ids: set[UUID] = set()
        for job in jobs:
            if job.idempotency_key is not None:
                slot = (job.queue, job.idempotency_key)
                # A claim made earlier in this very batch counts like a stored one.
                held = claims.get(slot) or self._idempotency.get(slot)
                if held is not None and (held.expires_at is None or held.expires_at > now):
                    ids.append(held.job_id)
                    continue
                claims[slot] = _Key(job.id, _utc_or_none(job.dedup_until))
            ids.append(job.id)
            # A producer that resends a job it already sent (same id, after an error it could not
            # interpret) changes nothing, whether the job is still live or already archived.
            if job.id in self._jobs or job.id in self._archive or job.id in new_ids:
                continue
            new_ids.add(job.id)
            rows.append(_new_row(job, now))
        return ids, rows, claims

    def _apply_insert(self, rows: list[_Row], claims: dict[tuple[str, str], _Key]) -> None:
        self._idempotency.update(claims)
        for row in rows:
            self._add_live(row)
        self._notify(row.queue for row in rows)

    # ------------------------------------------------------------------ consuming

    def jobs_acquire(self, params: base.JobsAcquireParams) -> list[base.Delivery]:
        """Lease up to ``limit`` ready jobs (see JobsAcquireParams), in hand-out order."""
        if params.limit <= 0:
            return []
        now = _utc(params.now)
        lease = now + timedelta(seconds=params.visibility_timeout)
        with self._lock:
            queue = self._queues.get(params.queue)
            if queue is None:
                return []
            ready = [row for row in queue.unkeyed_pending.values() if row.run_at <= now]
            for line in queue.keys.values():
                head = line.eligible()
                if head is not None and head.state == "pending" and head.run_at <= now:
                    ready.append(head)
            chosen = heapq.nsmallest(params.limit, ready, key=_hand_out_order)
            deliveries: list[base.Delivery] = []
            for row in chosen:
                self._to_processing(row)
                row.deliveries += 1
                row.receipt = secrets.token_hex(16)
                row.lease_expires_at = lease
                row.worker_id = params.worker_id
                row.started_at = now
                if row.first_started_at is None:
                    row.first_started_at = now
                deliveries.append(_delivery(row, row.receipt, lease))
            return deliveries

    def _held(self, job_id: UUID, receipt: str) -> _Row | None:
        """The processing row this delivery still holds, or None (the receipt is stale)."""
        row = self._jobs.get(job_id)
        if row is None or row.state != "processing" or row.receipt != receipt:
            return None
        return row

    def jobs_finish_many(self, params: base.JobsFinishParams) -> int:
        """Archive deliveries in their terminal state; return how many applied (the rest were stale).

        A state that is not terminal raises BackendError and finishes nothing."""
        items = _first_per_id(params.items)
        for item in items:
            if item.state not in _RECORD_STATES:
                raise BackendError(f"not a terminal state: {item.state!r}")
        now = _utc(params.now)
        with self._lock:
            applied = 0
            for item in items:
                row = self._held(item.id, item.receipt)
                if row is None:
                    continue
                self._remove_live(row)
                # Inserts and replays never reuse a stored id, so the archive has no row of this id.
                self._archive[row.id] = _archived(row, item, now)
                applied += 1
            return applied

    def jobs_retry_many(self, params: base.JobsRetryParams) -> int:
        """Return deliveries to pending at their run_at with the attempt counted; return how many applied."""
        items = _first_per_id(params.items)
        run_ats = [_utc(item.run_at) for item in items]
        with self._lock:
            applied = 0
            for item, run_at in zip(items, run_ats, strict=True):
                row = self._held(item.id, item.receipt)
                if row is None:
                    continue
                self._to_pending(row)
                row.attempts += 1
                row.run_at = run_at
                row.error_type = item.error.type
                row.error_message = item.error.message
                row.traceback = item.error.traceback
                applied += 1
            return applied

    def jobs_release_many(self, params: base.JobsReleaseParams) -> int:
        """Undo deliveries that never started; return how many applied.

        A job whose only delivery is undone is again a job that never started (no start time,
        no worker)."""
        with self._lock:
            applied = 0
            # A second item for the same delivery is stale by the time it is read: the first one
            # cleared the receipt.
            for item in params.items:
                row = self._held(item.id, item.receipt)
                if row is None:
                    continue
                if row.deliveries <= 1:
                    row.first_started_at = None
                    row.started_at = None
                    row.worker_id = None
                row.deliveries -= 1
                self._to_pending(row)
                applied += 1
            return applied

    def leases_extend_many(self, params: base.LeasesExtendParams) -> list[UUID]:
        """Extend the leases still held; return their ids in the caller's order (a missing id
        means the lease was lost)."""
        lease = _utc(params.now) + timedelta(seconds=params.visibility_timeout)
        with self._lock:
            extended: set[UUID] = set()
            for item in params.items:
                row = self._held(item.id, item.receipt)
                if row is not None:
                    row.lease_expires_at = lease
                    extended.add(item.id)
            # Answer in the caller's order, as the SQL engines do.
            return [item.id for item in params.items if item.id in extended]

    def jobs_rescue_expired(self, params: base.JobsRescueParams) -> int:
        """Return up to ``limit`` expired leases to pending, oldest lease first; return how many.

        ``deliveries`` is kept: poison protection counts lost deliveries."""
        now = _utc(params.now)
        with self._lock:
            expired = [
                row
                for row in self._processing.values()
                if row.lease_expires_at is not None and row.lease_expires_at < now
            ]
            chosen = heapq.nsmallest(max(0, params.limit), expired, key=lambda r: (r.lease_expires_at, r.id))
            for row in chosen:
                self._to_pending(row)
            return len(chosen)

    # Every change of a live row's state goes through the four methods below, which keep the
    # indexes (by queue, by ordering key, processing) in step with the rows.

    def _add_live(self, row: _Row) -> None:
        """Store a new pending row."""
        queue = self._queues.setdefault(row.queue, _Queue())
        self._jobs[row.id] = row
        queue.rows[row.id] = row
        if row.ordering_key is None:
            queue.unkeyed_pending[row.id] = row
        else:
            queue.keys.setdefault(row.ordering_key, _KeyLine()).add(row)

    def _to_processing(self, row: _Row) -> None:
        queue = self._queues[row.queue]
        row.state = "processing"
        self._processing[row.id] = row
        if row.ordering_key is None:
            del queue.unkeyed_pending[row.id]
        else:
            queue.keys[row.ordering_key].in_flight += 1

    def _to_pending(self, row: _Row) -> None:
        """Return a processing row to pending, clearing its receipt and lease."""
        queue = self._queues[row.queue]
        # Clearing the receipt fences the delivery that held the row: its later calls are stale.
        row.state = "pending"
        row.receipt = None
        row.lease_expires_at = None
        del self._processing[row.id]
        if row.ordering_key is None:
            queue.unkeyed_pending[row.id] = row
        else:
            queue.keys[row.ordering_key].in_flight -= 1

    def _remove_live(self, row: _Row) -> None:
        queue = self._queues[row.queue]
        del self._jobs[row.id]
        del queue.rows[row.id]
        if row.state == "processing":
            del self._processing[row.id]
        if row.ordering_key is None:
            queue.unkeyed_pending.pop(row.id, None)
        else:
            line = queue.keys[row.ordering_key]
            line.remove(row)
            if row.state == "processing":
                line.in_flight -= 1
            if not line.ids:
                del queue.keys[row.ordering_key]

    # ------------------------------------------------------------------ reading

    def job_get(self, params: base.JobGetParams) -> base.JobRecord | None:
        """The job, live or archived, or None."""
        with self._lock:
            row = self._jobs.get(params.id)
            if row is not None:
                return row.record()
            return self._archive.get(params.id)

    def jobs_list(self, params: base.JobsListParams) -> list[base.JobRecord]:
        """Live rows in id order after ``params.after``, optionally of one queue."""
        with self._lock:
            if params.queue is None:
                live: Iterable[_Row] = self._jobs.values()
            else:
                queue = self._queues.get(params.queue)
                live = () if queue is None else queue.rows.values()
            after = None if params.after is None else params.after.int
            rows = [row for row in live if after is None or row.id.int > after]
            chosen = heapq.nsmallest(max(0, params.limit), rows, key=lambda r: r.id.int)
            return [row.record() for row in chosen]

    def queues_stats(self, params: base.QueuesStatsParams) -> list[base.QueueStats]:
        """Counts for every queue that has live or archived rows, by queue name."""
        now = _utc(params.now)
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, datetime] = {}
        with self._lock:
            for row in self._jobs.values():
                entry = counts.setdefault(row.queue, {})
                if row.state == "processing":
                    state = "processing"
                elif row.run_at <= now:
                    state = "pending"
                    if row.queue not in oldest or row.run_at < oldest[row.queue]:
                        oldest[row.queue] = row.run_at
                else:
                    state = "scheduled"
                entry[state] = entry.get(state, 0) + 1
            for record in self._archive.values():
                entry = counts.setdefault(record.queue, {})
                # Replayed dead letters have left the DLQ: they are not part of its depth.
                if record.state == "dead" and record.replayed_by is not None:
                    continue
                entry[record.state] = entry.get(record.state, 0) + 1
        return [
            base.QueueStats(
                queue=queue,
                pending=counts[queue].get("pending", 0),
                scheduled=counts[queue].get("scheduled", 0),
                processing=counts[queue].get("processing", 0),
                completed=counts[queue].get("completed", 0),
                dead=counts[queue].get("dead", 0),
                expired=counts[queue].get("expired", 0),
                cancelled=counts[queue].get("cancelled", 0),
                oldest_pending_age=(max(0.0, (now - oldest[queue]).total_seconds()) if queue in oldest else None),
            )
            for queue in sorted(counts)
        ]

    def archive_read(self, params: base.ArchiveReadParams) -> list[base.JobRecord]:
        """Archived rows in (finished_at, id) order strictly after the watermark."""
        after = None if params.after is None else (_utc(params.after[0]), params.after[1])
        with self._lock:
            rows = [r for r in self._archive.values() if after is None or _finished(r) > after]
        return heapq.nsmallest(max(0, params.limit), rows, key=_finished)

    # ------------------------------------------------------------------ dead letters and audit

    def dead_list(self, params: base.DeadListParams) -> list[base.JobRecord]:
        """Unreplayed dead letters, newest first, filtered by queue, task and error type."""
        with self._lock:
            rows = [
                r
                for r in self._archive.values()
                if r.state == "dead"
                and r.replayed_by is None
                and (params.queue is None or r.queue == params.queue)
                and (params.task is None or r.task == params.task)
                and (params.error_type is None or r.error_type == params.error_type)
            ]
        rows.sort(key=_finished, reverse=True)
        start = max(0, params.offset)
        return rows[start : start + max(0, params.limit)]

    def dead_replay_many(self, params: base.DeadReplayParams) -> list[tuple[UUID, UUID]]:
        """Re-enqueue dead letters with fresh attempts; return the pairs actually replayed.

        A dead id named twice is replayed once (its first pair). A new id that is already live, or
        named twice, raises BackendError and replays nothing."""
        now = _utc(params.now)
        with self._lock:
            pairs: list[tuple[UUID, UUID]] = []
            seen: set[UUID] = set()
            new_ids: set[UUID] = set()
            for dead_id, new_id in params.replays:
                record = self._archive.get(dead_id)
                # A dead letter is replayed at most once, even if the caller names it twice.
                if dead_id in seen or record is None or record.state != "dead" or record.replayed_by is not None:
                    continue
                seen.add(dead_id)
                if new_id in self._jobs or new_id in self._archive or new_id in new_ids:
                    raise BackendError(f"cannot replay {dead_id} as {new_id}: a job with that id already exists")
                new_ids.add(new_id)
                pairs.append((dead_id, new_id))
            rows: list[_Row] = []
            for dead_id, new_id in pairs:
                dead = self._archive[dead_id]
                rows.append(
                    _Row(
                        id=new_id,
                        queue=dead.queue,
                        task=dead.task,
                        payload=dead.payload,
                        headers=dead.headers,
                        state="pending",
                        priority=dead.priority,
                        run_at=now,
                        enqueued_at=now,
                        expires_at=None,
                        max_attempts=dead.max_attempts,
                        max_deliveries=dead.max_deliveries,
                        idempotency_key=dead.idempotency_key,
                        ordering_key=dead.ordering_key,
                        replay_of=dead_id,
                    )
                )
                self._archive[dead_id] = dataclasses.replace(dead, replayed_by=new_id)
            # The new jobs bypass the idempotency keys, as on the SQL engines: a replay is an
            # operator's explicit decision to run the job again.
            self._apply_insert(rows, {})
            self._write_audit(
                now,
                params.actor,
                "replay",
                params.reason,
                [d for d, _ in pairs],
                {"replays": [[str(d), str(n)] for d, n in pairs]},
            )
            return pairs

    def dead_purge_many(self, params: base.DeadPurgeParams) -> int:
        """Delete dead letters for good (one audit row, even when nothing matched); return how many."""
        now = _utc(params.now)
        with self._lock:
            purged = sorted({i for i in params.ids if (r := self._archive.get(i)) is not None and r.state == "dead"})
            for job_id in purged:
                del self._archive[job_id]
            self._write_audit(now, params.actor, "purge", params.reason, purged, {"count": len(purged)})
            return len(purged)

    def audit_list(self, params: base.AuditListParams) -> list[base.AuditEntry]:
        """Operator actions, newest first."""
        with self._lock:
            return self._audit[::-1][: max(0, params.limit)]

    def _write_audit(
        self, now: datetime, actor: str, action: str, reason: str, job_ids: Iterable[UUID], details: dict[str, Any]
    ) -> None:
        self._audit.append(
            base.AuditEntry(
                id=len(self._audit) + 1,
                at=now,
                actor=actor,
                action=action,
                reason=reason,
                job_ids=tuple(job_ids),
                details=json.dumps(details),
            )
        )

    # ------------------------------------------------------------------ effects-once keys

    def processed_keys_claim(self, params: base.ProcessedKeyClaimParams) -> bool:
        """Claim the side effect ``key``; True if claimed now, False if an unexpired claim exists.

        ``params.conn`` is refused with ConfigurationError (see the class docstring)."""
        _refuse_conn(params.conn, "processed_keys_claim")
        now, expires_at = _utc(params.now), _utc(params.expires_at)
        with self._lock:
            held = self._processed.get(params.key)
            if held is not None and held > now:
                return False
            self._processed[params.key] = expires_at
            return True

    def keys_prune(self, params: base.KeysPruneParams) -> int:
        """Delete up to ``limit`` expired idempotency and processed keys, oldest first; return how many.

        Idempotency keys without an expiry are held for ever and never pruned."""
        now = _utc(params.now)
        limit = max(0, params.limit)
        with self._lock:
            idempotency = heapq.nsmallest(
                limit,
                (
                    (key.expires_at, slot)
                    for slot, key in self._idempotency.items()
                    if key.expires_at is not None and key.expires_at < now
                ),
            )
            for _, slot in idempotency:
                del self._idempotency[slot]
            remaining = limit - len(idempotency)
            processed = heapq.nsmallest(remaining, ((at, key) for key, at in self._processed.items() if at < now))
            for _, key in processed:
                del self._processed[key]
            return len(idempotency) + len(processed)

    # ------------------------------------------------------------------ schedules

    def schedules_upsert(self, params: base.SchedulesUpsertParams) -> None:
        """Create schedules or update existing ones (see SchedulesUpsertParams)."""
        schedules = [_utc_schedule(s) for s in params.schedules]
        with self._lock:
            for schedule in schedules:
                existing = self._schedules.get(schedule.name)
                if existing is not None:
                    # Re-declaring (every worker start does) keeps the pause state, the last run and,
                    # unless the cron changed, the next tick: otherwise a restart could skip or
                    # repeat a tick.
                    schedule = dataclasses.replace(
                        schedule,
                        paused=existing.paused,
                        last_run_at=existing.last_run_at,
                        next_run_at=existing.next_run_at if existing.cron == schedule.cron else schedule.next_run_at,
                    )
                self._schedules[schedule.name] = schedule

    def schedules_list(self) -> list[base.Schedule]:
        """Every schedule, by name."""
        with self._lock:
            return [self._schedules[name] for name in sorted(self._schedules)]

    def schedules_update(self, params: base.SchedulesUpdateParams) -> bool:
        """Pause/resume a schedule or give it a new cron and next tick; False if it does not exist."""
        next_run_at = _utc_or_none(params.next_run_at)
        with self._lock:
            existing = self._schedules.get(params.name)
            if existing is None:
                return False
            self._schedules[params.name] = dataclasses.replace(
                existing,
                paused=existing.paused if params.paused is None else params.paused,
                cron=existing.cron if params.cron is None else params.cron,
                next_run_at=existing.next_run_at if next_run_at is None else next_run_at,
            )
            return True

    def schedules_delete(self, params: base.SchedulesDeleteParams) -> bool:
        """Delete a schedule; False if it did not exist."""
        with self._lock:
            return self._schedules.pop(params.name, None) is not None

    def schedule_fire(self, params: base.ScheduleFireParams) -> bool:
        """Fire one tick once, however many schedulers try (see ScheduleFireParams)."""
        due_at, after, now = _utc(params.due_at), _utc(params.next_run_at_after), _utc(params.now)
        with self._lock:
            existing = self._schedules.get(params.name)
            if existing is None or existing.paused or existing.next_run_at != due_at:
                return False
            # Plan the insert first: if it cannot be done, the tick must not be consumed either.
            _, rows, claims = self._plan_insert([params.job], now)
            self._schedules[params.name] = dataclasses.replace(existing, next_run_at=after, last_run_at=due_at)
            self._apply_insert(rows, claims)
            return True

    # ------------------------------------------------------------------ topics

    def subscriptions_upsert(self, params: base.SubscriptionsUpsertParams) -> None:
        """Create subscriptions or update the task and filter of existing (topic, queue) pairs."""
        with self._lock:
            for subscription in params.subscriptions:
                self._subscriptions[(subscription.topic, subscription.queue)] = subscription

    def subscriptions_list(self, params: base.SubscriptionsListParams) -> list[base.Subscription]:
        """Subscriptions of one topic (or all), by topic then queue."""
        with self._lock:
            return [
                self._subscriptions[slot]
                for slot in sorted(self._subscriptions)
                if params.topic is None or slot[0] == params.topic
            ]

    def subscriptions_delete(self, params: base.SubscriptionsDeleteParams) -> bool:
        """Delete one subscription; False if it did not exist."""
        with self._lock:
            return self._subscriptions.pop((params.topic, params.queue), None) is not None

    # ------------------------------------------------------------------ backpressure and retention

    def queue_load(self, params: base.QueueLoadParams) -> base.QueueLoad:
        """The live depth of one queue and how many of its jobs ended in the last ``window`` seconds."""
        now = _utc(params.now)
        since = now - timedelta(seconds=params.window)
        with self._lock:
            queue = self._queues.get(params.queue)
            depth = 0 if queue is None else len(queue.rows)
            drained = sum(
                1
                for r in self._archive.values()
                if r.queue == params.queue and r.finished_at is not None and since <= r.finished_at <= now
            )
        return base.QueueLoad(queue=params.queue, depth=depth, drained=drained, window=params.window)

    def archive_prune(self, params: base.ArchivePruneParams) -> int:
        """Delete up to ``limit`` archived rows past retention, oldest first; return how many (call until 0)."""
        before = {q: _utc(t) for q, t in params.before.items()}
        dead_before = {q: _utc(t) for q, t in params.dead_before.items()}
        default_before, default_dead_before = _utc(params.default_before), _utc(params.default_dead_before)

        def past_retention(r: base.JobRecord) -> bool:
            if r.state == "dead":
                cutoff = dead_before.get(r.queue, default_dead_before)
            else:
                cutoff = before.get(r.queue, default_before)
            return _finished(r)[0] < cutoff

        with self._lock:
            doomed = heapq.nsmallest(
                max(0, params.limit), (r for r in self._archive.values() if past_retention(r)), key=_finished
            )
            for record in doomed:
                del self._archive[record.id]
            return len(doomed)


# ---------------------------------------------------------------------- helpers


def _refuse_conn(conn: object, method: str) -> None:
    if conn is not None:
        raise ConfigurationError(
            f"the memory backend cannot join a caller's transaction ({method} got conn={conn!r}); "
            "drop conn, or test transactional enqueues against sqlite:// or postgresql://"
        )


def _utc(at: datetime) -> datetime:
    """``at`` in UTC; a naive datetime is refused, as the SQL engines cannot store it either."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise BackendError(f"times must be timezone-aware (UTC), got naive {at!r}")
    return at.astimezone(UTC)


def _utc_or_none(at: datetime | None) -> datetime | None:
    return None if at is None else _utc(at)


def _utc_schedule(schedule: base.Schedule) -> base.Schedule:
    return dataclasses.replace(
        schedule, next_run_at=_utc(schedule.next_run_at), last_run_at=_utc_or_none(schedule.last_run_at)
    )


def _new_row(job: base.NewJob, now: datetime) -> _Row:
    return _Row(
        id=job.id,
        queue=job.queue,
        task=job.task,
        payload=job.payload,
        headers=job.headers,
        state="pending",
        priority=job.priority,
        run_at=_utc(job.run_at),
        enqueued_at=now,
        expires_at=_utc_or_none(job.expires_at),
        max_attempts=job.max_attempts,
        max_deliveries=job.max_deliveries,
        idempotency_key=job.idempotency_key,
        ordering_key=job.ordering_key,
        replay_of=job.replay_of,
    )


def _delivery(row: _Row, receipt: str, lease_expires_at: datetime) -> base.Delivery:
    return base.Delivery(
        id=row.id,
        queue=row.queue,
        task=row.task,
        payload=row.payload,
        headers=row.headers,
        priority=row.priority,
        run_at=row.run_at,
        enqueued_at=row.enqueued_at,
        expires_at=row.expires_at,
        attempts=row.attempts,
        deliveries=row.deliveries,
        max_attempts=row.max_attempts,
        max_deliveries=row.max_deliveries,
        idempotency_key=row.idempotency_key,
        ordering_key=row.ordering_key,
        receipt=receipt,
        lease_expires_at=lease_expires_at,
    )


def _hand_out_order(row: _Row) -> tuple[int, datetime, int]:
    """Acquire's order: priority DESC, run_at, id."""
    return (-row.priority, row.run_at, row.id.int)


def _archived(row: _Row, item: base.Finish, now: datetime) -> base.JobRecord:
    """The archive row for a live row ended by ``item`` at ``now``: an error given by the item
    replaces the row's last one, a run counts an attempt."""
    error = item.error
    return base.JobRecord(
        id=row.id,
        queue=row.queue,
        task=row.task,
        payload=row.payload,
        headers=row.headers,
        state=item.state,
        priority=row.priority,
        run_at=row.run_at,
        enqueued_at=row.enqueued_at,
        expires_at=row.expires_at,
        attempts=row.attempts + (1 if item.ran else 0),
        deliveries=row.deliveries,
        max_attempts=row.max_attempts,
        max_deliveries=row.max_deliveries,
        idempotency_key=row.idempotency_key,
        ordering_key=row.ordering_key,
        replay_of=row.replay_of,
        first_started_at=row.first_started_at,
        started_at=row.started_at,
        lease_expires_at=None,
        worker_id=row.worker_id,
        error_type=row.error_type if error is None else error.type,
        error_message=row.error_message if error is None else error.message,
        traceback=row.traceback if error is None else error.traceback,
        finished_at=now,
        result=item.result,
        reason=item.reason,
    )


def _finished(record: base.JobRecord) -> tuple[datetime, UUID]:
    """The archive's order key: (finished_at, id). Archived rows always have a finished_at."""
    assert record.finished_at is not None
    return (record.finished_at, record.id)


def _first_per_id(items: Sequence[_Item]) -> list[_Item]:
    # One outcome per job and batch, as on the SQL engines: a second item for the same id would
    # otherwise act on the job twice.
    seen: set[UUID] = set()
    kept: list[_Item] = []
    for item in items:
        if item.id not in seen:
            seen.add(item.id)
            kept.append(item)
    return kept


def _satisfies_the_contract(backend: MemoryBackend) -> base.Backend:
    # Never called: mypy checks here that MemoryBackend implements every method of the Protocol.
    return backend
