"""The MySQL / MariaDB implementation of the storage seam."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pymysql

from conveyor._errors import BackendRefused, ConfigurationError, TooLargeForDatabase
from conveyor._idempotency import refuse_reused_keys
from conveyor.backends import _convert as cv
from conveyor.backends import _deadline, base
from conveyor.backends._promotion import Promotions, earliest_by_queue, scheduled_earliest
from conveyor.backends._sql import load_migrations, load_queries
from conveyor.backends.mysql import _connection
from conveyor.backends.mysql._connection import Cursor, Pool, StatementTooLong, is_duplicate, translated
from conveyor.backends.mysql._url import connect_kwargs

_PACKAGE = "conveyor.backends.mysql"
_QUERIES = load_queries(_PACKAGE)


class MysqlBackend:
    """The storage contract on one MySQL (8.0.4+) or MariaDB (10.8+: descending indexes) database, InnoDB tables.

    Safe to share between threads (a small pool of connections) and between worker processes and hosts:
    an acquire locks the rows it hands out (``FOR UPDATE SKIP LOCKED``), every outcome names its
    delivery's receipt. There are no notifications (MySQL has no LISTEN): ``listen`` returns a polling
    listener, and a worker's pickup latency is its poll interval. A transaction InnoDB picks as a
    deadlock's victim is run again (``DEADLOCK_RETRIES``); errors surface as
    :class:`conveyor.BackendError`, or :class:`conveyor.BackendUnavailable` when the server cannot be
    reached."""

    engine = "mysql"
    notifies = False

    def __init__(self, url: str, *, statement_deadline: float | None = _deadline.STATEMENT_DEADLINE) -> None:
        self.url = url
        self._pool = Pool(connect_kwargs(url), statement_deadline=_deadline.check_seconds(statement_deadline))
        self._q = _QUERIES
        # The next scheduled job each queue's last acquire saw, and those this process wrote since.
        self._promotions = Promotions()

    # ------------------------------------------------------------------ lifecycle

    def migrate(self) -> list[str]:
        """Apply pending migrations; return their names. Idempotent and safe across processes."""
        return _connection.migrate(self._pool, self._q, _PACKAGE)

    def close(self) -> None:
        """Close the connections; calls made afterwards raise BackendError."""
        self._pool.close()

    def forked(self) -> MysqlBackend:
        """The same database, connections of its own (see :meth:`Backend.forked`)."""
        return MysqlBackend(self.url, statement_deadline=self.statement_deadline)

    @property
    def statement_deadline(self) -> float | None:
        """How long a call may wait for the server's answers before its connection is cut (None: for ever)."""
        return self._pool.statement_deadline

    def listen(self, queues: Sequence[str]) -> base.Listener:
        """A polling listener: MySQL cannot notify other sessions."""
        return base.PollingListener()

    def jobs_next_due(self, queues: Sequence[str]) -> datetime | None:
        """The earliest scheduled job of ``queues`` known to come due (see :mod:`conveyor.backends._promotion`)."""
        return self._promotions.next_due(queues)

    def loop_statements(self) -> None:
        """None: PyMySQL has no async mode; the worker calls this backend from threads."""
        return None

    def _caller_connection(self, conn: object) -> pymysql.connections.Connection:
        """The caller's own connection (``conn=``), whose transaction a call joins."""
        if not isinstance(conn, pymysql.connections.Connection):
            raise ConfigurationError(
                f"conn= must be an open pymysql Connection, not {type(conn).__module__}.{type(conn).__qualname__}"
            )
        # The connection's character set is what the server converts the text it is sent from: on a
        # 'utf8' (utf8mb3) connection an emoji was refused with a column's error, or, outside strict
        # mode, stored as '????'; on 'latin1' it cannot even be sent.
        if conn.charset != "utf8mb4":
            raise ConfigurationError(
                f"conn= must be a connection with charset='utf8mb4' (PyMySQL's default), not {conn.charset!r}: "
                "text outside its character set would be refused or stored as '?'"
            )
        return conn

    # ------------------------------------------------------------------ producing

    def jobs_insert_many(self, params: base.JobsInsertParams) -> list[UUID]:
        """Insert jobs; return the stored id for each, in order (the holder's id for a duplicate
        idempotency key inside its window).

        With ``params.conn`` (a PyMySQL connection to the same database, inside the caller's
        transaction) the statements run there and are not committed: the caller's commit decides."""
        jobs = list(params.jobs)
        if params.conn is not None:
            conn = self._caller_connection(params.conn)
            with translated("jobs_insert_many", callers=True), _all_or_nothing(conn) as cur:
                ids = self._insert(cur, jobs, params.now, params.strict_keys)
        else:
            # A bounded wait only where a row another transaction holds can be met: a key, a resent id.
            bounded = params.lock_wait is not None and any(j.idempotency_key is not None or not j.fresh for j in jobs)
            ids = self._pool.write(
                "jobs_insert_many",
                lambda cur: self._insert(cur, jobs, params.now, params.strict_keys),
                lock_wait=int(params.lock_wait) if bounded and params.lock_wait is not None else None,
            )
        self._promotions.scheduled_many(scheduled_earliest(jobs, params.now))
        return ids

    def _insert(self, cur: Cursor, jobs: Sequence[base.NewJob], at: datetime, strict_keys: bool) -> list[UUID]:
        ids = self._insert_rows(cur, jobs, at)
        if strict_keys:

            def held(job_id: UUID) -> tuple[str, str] | None:
                cur.execute(self._q["idempotency_holder_job"], {"id": cv.to_db_id(job_id)})
                row = cur.fetchone()
                return None if row is None else (row["task"], row["payload"])

            # Raised inside the transaction (or the caller's savepoint): nothing is written.
            refuse_reused_keys(jobs, ids, held)
        return ids

    def _insert_rows(self, cur: Cursor, jobs: Sequence[base.NewJob], at: datetime) -> list[UUID]:
        now = cv.to_db_time(at)
        resent = self._archived(cur, [job.id for job in jobs if not job.fresh])
        # Keys are claimed in one order, by (queue, key), whatever the order of the jobs: producers sending
        # the same keys in other orders would each hold a key another waits for, and InnoDB would end
        # the deadlock by rolling a batch back, again and again past DEADLOCK_RETRIES. A stable sort, so
        # that of two jobs with one key in a batch the first still takes it.
        keyed = sorted(
            (i for i, job in enumerate(jobs) if job.idempotency_key is not None),
            key=lambda i: (jobs[i].queue, jobs[i].idempotency_key),
        )
        holders = {i: self._claim_key(cur, jobs[i], now) for i in keyed}
        ids: list[UUID] = []
        rows: list[dict[str, Any]] = []
        for i, job in enumerate(jobs):
            holder = holders.get(i)
            if holder is not None:
                ids.append(holder)
                continue
            ids.append(job.id)
            if job.id in resent:
                continue
            run_at = cv.to_db_time(job.run_at)
            rows.append(
                {
                    "id": cv.to_db_id(job.id),
                    "queue": job.queue,
                    "task": job.task,
                    "payload": job.payload,
                    "headers": job.headers,
                    "state": "scheduled" if run_at > now else "pending",
                    "priority": job.priority,
                    "run_at": run_at,
                    "now": now,
                    "expires_at": cv.to_db_time_or_none(job.expires_at),
                    "max_attempts": job.max_attempts,
                    "max_deliveries": job.max_deliveries,
                    "idempotency_key": job.idempotency_key,
                    "ordering_key": job.ordering_key,
                    "replay_of": None if job.replay_of is None else cv.to_db_id(job.replay_of),
                }
            )
        if rows:
            try:
                cur.executemany(self._q["jobs_insert"], rows)
            except StatementTooLong as exc:
                raise _too_large(jobs, {row["id"] for row in rows}, exc) from exc
        return ids

    def _archived(self, cur: Cursor, ids: Sequence[UUID]) -> set[UUID]:
        """Which of ``ids`` are archived already: a resend of a job that ended inserts nothing."""
        if not ids:
            return set()
        cur.execute(self._q["archive_ids_held"], {"ids": tuple(cv.to_db_id(i) for i in ids)})
        return {UUID(row["id"]) for row in cur.fetchall()}

    def _claim_key(self, cur: Cursor, job: base.NewJob, now: float) -> UUID | None:
        """Take the job's idempotency key if it is free or its window has passed (None), else the id
        of the job that holds it. The key's row is locked for the rest of the transaction, so the
        check and the claim are one step.

        The insert comes first, the (locking) read only once the key is found taken: a locking read of a
        key no row holds takes a gap lock at REPEATABLE READ (MySQL's default, so in a caller's own
        transaction, ``conn=``), and two transactional sends of different new keys then waited for each
        other and deadlocked, the victim's whole transaction rolled back. The read sees the committed
        holder (a locking read reads the latest row); a holder deleted meanwhile (pruned) lets the
        insert be tried again."""
        claim = {
            "queue": job.queue,
            "key": job.idempotency_key,
            "job_id": cv.to_db_id(job.id),
            "expires_at": cv.to_db_time_or_none(job.dedup_until),
        }
        holder = self._claim(cur, "idempotency", claim, now)
        return None if holder is None else UUID(holder["job_id"])

    def _claim(self, cur: Cursor, kind: str, claim: dict[str, Any], now: float) -> dict[str, Any] | None:
        """Take a key (``kind``: the statements ``{kind}_take``, ``{kind}_lock``, ``{kind}_retake``) if it is
        free or its window has passed (None), else the unexpired holder's row, left share-locked. Insert
        first, read only if taken: see :meth:`_claim_key`."""
        while True:
            try:
                cur.execute(self._q[f"{kind}_take"], claim)
            except pymysql.err.IntegrityError as exc:
                if not is_duplicate(exc):
                    raise
            else:
                return None
            cur.execute(self._q[f"{kind}_lock"], claim)
            row = cur.fetchone()
            if row is None:
                continue  # the holder was pruned meanwhile: take the key
            if row["expires_at"] is not None and row["expires_at"] <= now:
                cur.execute(self._q[f"{kind}_retake"], claim)
                return None
            return dict(row)

    # ------------------------------------------------------------------ consuming

    def jobs_acquire(self, params: base.JobsAcquireParams) -> list[base.Delivery]:
        """Lease up to ``limit`` ready jobs (see JobsAcquireParams), in hand-out order."""
        if params.limit <= 0:
            return []
        now = cv.to_db_time(params.now)
        lease_end = cv.lease_end(params.now, params.visibility_timeout)

        def acquire(cur: Cursor) -> tuple[list[dict[str, Any]], tuple[int, int, datetime | None] | None]:
            # In the acquire's transaction, so it sees them; one index probe when nothing is due. Skipped
            # with promote False, as on the other engines (the caller's next acquire promotes).
            moved = self._promote(cur, params.queue, now) if params.promote else None
            cur.execute(self._q["jobs_acquire_pick"], {"queue": params.queue, "now": now, "limit": params.limit})
            picked = list(cur.fetchall())
            if picked:
                for row in picked:
                    row["receipt"] = secrets.token_hex(16)
                    row["lease_expires_at"] = lease_end
                items = json.dumps([[row["id"], row["receipt"]] for row in picked])
                cur.execute(
                    self._q["jobs_acquire_lease"],
                    {
                        "items": items,
                        "ids": tuple(row["id"] for row in picked),
                        "lease_expires_at": lease_end,
                        "worker_id": params.worker_id,
                        "now": now,
                    },
                )
            seen = None
            if moved is not None and len(picked) < params.limit:
                # The worker may go idle: note when the queue's next scheduled job is due (jobs_next_due).
                cur.execute(self._q["jobs_next_scheduled"], {"queue": params.queue})
                upcoming = cur.fetchone()
                seen = (moved, 0, None if upcoming is None else cv.from_db_time(upcoming["run_at"]))
            return picked, seen

        picked, seen = self._pool.write("jobs_acquire", acquire)
        if seen is not None:
            self._promotions.promoted(params.queue, params.now, seen)
        return [cv.delivery(row) for row in picked]

    def _promote(self, cur: Cursor, queue: str, now: float) -> int:
        """Make the queue's due scheduled jobs pending (at most 1,000); return how many."""
        cur.execute(self._q["jobs_promote_pick"], {"queue": queue, "now": now})
        due = [row["id"] for row in cur.fetchall()]
        if due:
            cur.execute(self._q["jobs_promote"], {"ids": tuple(due)})
        return len(due)

    def _held_leases(self, cur: Cursor, items: Sequence[base.LeaseRef], wait: bool) -> list[dict[str, Any]]:
        """The rows of ``items`` still leased by their delivery (same receipt, processing), locked."""
        refs = cv.lease_refs(items)
        lock = self._q["leases_lock"] + ("" if wait else " SKIP LOCKED")  # the statement ends in FOR UPDATE
        cur.execute(lock, {"items": refs, "ids": _keys(items)})
        return list(cur.fetchall())

    def jobs_start_many(self, params: base.JobsStartParams) -> list[UUID]:
        """Count deliveries as started; return the ids that still held their lease (with ``wait``
        False, rows another transaction holds are skipped: not counted now, not returned)."""
        if not params.items:
            return []

        def start(cur: Cursor) -> list[dict[str, Any]]:
            held = self._held_leases(cur, params.items, params.wait)
            if held:
                cur.execute(self._q["jobs_start_many"], {"ids": tuple(sorted({r["id"] for r in held}))})
            return held

        return cv.held(params.items, self._pool.write("jobs_start_many", start))

    def jobs_finish_many(self, params: base.JobsFinishParams) -> int:
        """Archive deliveries in their terminal state; return how many applied (the rest were stale)."""
        items = cv.finish_items(params)
        if not items:
            return 0
        args = {
            "items": cv.outcomes_json(items, "MySQL", "jobs_finish_many"),
            "ids": tuple(item["id"] for item in items),
            "now": cv.to_db_time(params.now),
        }

        def finish(cur: Cursor) -> int:
            cur.execute(self._q["leases_lock"], args)
            if not cur.fetchall():
                return 0
            cur.execute(self._q["jobs_finish_count"], args)
            cur.execute(self._q["jobs_finish_archive"], args)
            return int(cur.execute(self._q["jobs_finish_delete"], args))

        return self._pool.write("jobs_finish_many", finish)

    def jobs_retry_many(self, params: base.JobsRetryParams) -> int:
        """Return deliveries to pending at their run_at; return how many applied."""
        by_id: dict[str, float] = {}
        items = []
        for item in base.one_outcome_per_job(params.items):
            run_at = cv.to_db_time(item.run_at)
            by_id[cv.to_db_id(item.id)] = run_at
            items.append(
                _present(
                    {
                        "id": cv.to_db_id(item.id),
                        "receipt": item.receipt,
                        "run_at": run_at,
                        "error_type": item.error.type,
                        "error_message": item.error.message,
                        "traceback": item.error.traceback,
                        "counted": 1 if item.counted else 0,
                    }
                )
            )
        if not items:
            return 0
        now = cv.to_db_time(params.now)
        args = {"items": cv.outcomes_json(items, "MySQL", "jobs_retry_many"), "ids": tuple(by_id), "now": now}

        def retry(cur: Cursor) -> list[dict[str, Any]]:
            cur.execute(self._q["leases_lock"], args)
            held = list(cur.fetchall())
            if held:
                cur.execute(self._q["jobs_retry_many"], args)
            return held

        held = self._pool.write("jobs_retry_many", retry)
        # Retries whose backoff is ahead are scheduled: an idle worker wakes when they come due.
        scheduled = ((row["queue"], cv.from_db_time(by_id[row["id"]])) for row in held if by_id[row["id"]] > now)
        self._promotions.scheduled_many(earliest_by_queue(scheduled))
        return len(held)

    def jobs_release_many(self, params: base.JobsReleaseParams) -> int:
        """Hand leased jobs that never started back to pending; return how many applied."""
        if not params.items:
            return 0
        refs = cv.lease_refs(params.items)
        return self._pool.write(
            "jobs_release_many",
            lambda cur: int(cur.execute(self._q["jobs_release_many"], {"items": refs, "ids": _keys(params.items)})),
        )

    def leases_extend_many(self, params: base.LeasesExtendParams) -> list[UUID]:
        """Extend the leases still held; return their ids (a missing id means the lease was lost). With
        ``wait`` False a row another transaction holds is skipped and still returned: held, extended
        at the next call."""
        if not params.items:
            return []
        lease_end = cv.lease_end(params.now, params.visibility_timeout)

        def extend(cur: Cursor) -> list[dict[str, Any]]:
            if params.wait:
                held = free = self._held_leases(cur, params.items, wait=True)
            else:
                # Rows another transaction holds (the completer counting a start, an operator) are skipped,
                # not waited for, and still held by their delivery: returned, extended at the next beat.
                cur.execute(self._q["leases_held"], {"items": cv.lease_refs(params.items), "ids": _keys(params.items)})
                held = list(cur.fetchall())
                free = self._held_leases(cur, params.items, wait=False) if held else []
            if free:
                ids = tuple(sorted({r["id"] for r in free}))
                cur.execute(self._q["leases_extend_many"], {"ids": ids, "lease_expires_at": lease_end})
            return held

        return cv.held(params.items, self._pool.write("leases_extend_many", extend))

    def jobs_rescue_expired(self, params: base.JobsRescueParams) -> int:
        """Return up to ``limit`` expired leases to pending; return how many."""
        now = cv.to_db_time(params.now)

        def rescue(cur: Cursor) -> int:
            # Picked first with SKIP LOCKED (an expired lease another transaction holds is rescued later),
            # then named by primary key, as the other batch statements.
            cur.execute(self._q["jobs_rescue_pick"], {"now": now, "limit": params.limit})
            ids = tuple(row["id"] for row in cur.fetchall())
            if not ids:
                return 0
            return int(cur.execute(self._q["jobs_rescue_expired"], {"ids": ids, "now": now}))

        return self._pool.write("jobs_rescue_expired", rescue)

    # ------------------------------------------------------------------ reading

    def _select(self, action: str, name: str, args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The rows of one named statement, read on one snapshot."""

        def read(cur: Cursor) -> list[dict[str, Any]]:
            cur.execute(self._q[name], args)
            return list(cur.fetchall())

        return self._pool.read(action, read)

    def job_get(self, params: base.JobGetParams) -> base.JobRecord | None:
        """The job, live or archived, or None."""
        args = {"id": cv.to_db_id(params.id)}

        def get(cur: Cursor) -> list[dict[str, Any]]:
            cur.execute(self._q["job_get_live"], args)
            rows = list(cur.fetchall())
            if not rows:
                cur.execute(self._q["job_get_archived"], args)
                rows = list(cur.fetchall())
            return rows

        rows = self._pool.read("job_get", get)
        return cv.job_record(rows[0]) if rows else None

    def jobs_list(self, params: base.JobsListParams) -> list[base.JobRecord]:
        """Live rows in id order after ``params.after``."""
        args = {
            "queue": params.queue,
            "after": None if params.after is None else cv.to_db_id(params.after),
            "limit": params.limit,
        }
        return [cv.job_record(row) for row in self._select("jobs_list", "jobs_list", args)]

    def queues_stats(self, params: base.QueuesStatsParams) -> list[base.QueueStats]:
        """Counts for every queue that has live or archived rows, by queue name."""
        now = cv.to_db_time(params.now)

        def read(cur: Cursor) -> tuple[list[dict[str, Any]], ...]:
            found = []
            for name, args in (
                ("queues_stats_live", {"now": now}),
                ("queues_stats_totals", None),
                ("queues_stats_dlq", None),
            ):
                cur.execute(self._q[name], args)
                found.append(list(cur.fetchall()))
            return tuple(found)

        live, totals, dlq = self._pool.read("queues_stats", read)
        return cv.queue_stats(live, totals, dlq, now)

    def archive_read(self, params: base.ArchiveReadParams) -> list[base.JobRecord]:
        """Archived rows in (finished_at, id) order strictly after the watermark."""
        if params.after is None:
            rows = self._select("archive_read", "archive_read_first", {"limit": params.limit})
        else:
            after_at, after_id = params.after
            args = {"after_at": cv.to_db_time(after_at), "after_id": cv.to_db_id(after_id), "limit": params.limit}
            rows = self._select("archive_read", "archive_read_after", args)
        return [cv.job_record(row) for row in rows]

    # ------------------------------------------------------------------ dead letters and audit

    def dead_list(self, params: base.DeadListParams) -> list[base.JobRecord]:
        """Unreplayed dead letters, newest first, filtered by queue, task and error type."""
        args = cv.dead_list_args(params)
        return [cv.job_record(row) for row in self._select("dead_list", "dead_list", args)]

    def dead_replay_many(self, params: base.DeadReplayParams) -> list[tuple[UUID, UUID]]:
        """Re-enqueue dead letters with fresh attempts; return the pairs actually replayed."""
        pairs = cv.once_each(params.replays)
        new_ids = dict(pairs)
        replays = json.dumps([[cv.to_db_id(d), cv.to_db_id(n)] for d, n in pairs])
        now = cv.to_db_time(params.now)

        def replay(cur: Cursor) -> list[tuple[UUID, UUID]]:
            replayed: set[UUID] = set()
            if pairs:
                cur.execute(self._q["dead_replay_lock"], {"ids": tuple(cv.to_db_id(d) for d, _ in pairs)})
                replayed = {UUID(row["id"]) for row in cur.fetchall()}
            if replayed:
                args = {"replays": replays, "ids": tuple(sorted(cv.to_db_id(d) for d in replayed)), "now": now}
                cur.execute(self._q["dead_replay_insert"], args)
                cur.execute(self._q["dead_replay_mark"], args)
                cur.execute(self._q["dead_replay_rekey"], args)
            done = [(d, new_ids[d]) for d, _ in pairs if d in replayed]
            self._audit(
                cur,
                now,
                params.actor,
                "replay",
                params.reason,
                [d for d, _ in done],
                {"replays": [[str(d), str(n)] for d, n in done]},
            )
            return done

        return self._pool.write("dead_replay_many", replay)

    def dead_purge_many(self, params: base.DeadPurgeParams) -> int:
        """Delete dead letters for good (one audit row); return how many were deleted."""
        ids = tuple(cv.to_db_id(i) for i in params.ids)
        now = cv.to_db_time(params.now)

        def purge(cur: Cursor) -> int:
            purged: list[UUID] = []
            if ids:
                cur.execute(self._q["dead_purge_lock"], {"ids": ids})
                purged = sorted(UUID(row["id"]) for row in cur.fetchall())
            if purged:
                cur.execute(self._q["dead_purge_many"], {"ids": tuple(cv.to_db_id(i) for i in purged)})
            self._audit(cur, now, params.actor, "purge", params.reason, purged, {"count": len(purged)})
            return len(purged)

        return self._pool.write("dead_purge_many", purge)

    def audit_insert(self, params: base.AuditInsertParams) -> None:
        """Record one operator action."""
        args = {
            "now": cv.to_db_time(params.now),
            "actor": params.actor,
            "action": params.action,
            "reason": params.reason,
            "job_ids": json.dumps([str(i) for i in params.job_ids]),
            "details": params.details,
        }
        self._pool.write("audit_insert", lambda cur: cur.execute(self._q["audit_insert"], args))

    def audit_list(self, params: base.AuditListParams) -> list[base.AuditEntry]:
        """Operator actions, newest first."""
        args = {"limit": params.limit, "job_id": cv.quoted_id(params.job_id)}
        return [cv.audit_entry(row) for row in self._select("audit_list", "audit_list", args)]

    def _audit(
        self,
        cur: Cursor,
        now: float,
        actor: str,
        action: str,
        reason: str,
        job_ids: Iterable[UUID],
        details: dict[str, Any],
    ) -> None:
        cur.execute(
            self._q["audit_insert"],
            {
                "now": now,
                "actor": actor,
                "action": action,
                "reason": reason,
                "job_ids": json.dumps([str(i) for i in job_ids]),
                "details": json.dumps(details),
            },
        )

    # ------------------------------------------------------------------ effects-once keys

    def processed_keys_claim(self, params: base.ProcessedKeyClaimParams) -> bool:
        """Claim the side effect ``key``; True if claimed now, False if an unexpired claim exists.

        With ``params.conn`` (a PyMySQL connection) the claim joins the caller's transaction."""
        now = cv.to_db_time(params.now)
        args = {"key": params.key, "expires_at": cv.to_db_time(params.expires_at), "now": now}

        def claim(cur: Cursor) -> bool:
            # Inserted first, read (locked) only if taken, as an idempotency key is (_claim).
            return self._claim(cur, "processed_key", args, now) is None

        if params.conn is not None:
            conn = self._caller_connection(params.conn)
            with translated("processed_keys_claim", callers=True), _all_or_nothing(conn) as cur:
                return claim(cur)
        return self._pool.write("processed_keys_claim", claim)

    def keys_prune(self, params: base.KeysPruneParams) -> int:
        """Delete up to ``limit`` expired idempotency and processed keys; return how many."""
        now = cv.to_db_time(params.now)

        def prune(cur: Cursor) -> int:
            deleted = int(cur.execute(self._q["idempotency_keys_prune"], {"now": now, "limit": params.limit}))
            if deleted < params.limit:
                deleted += int(
                    cur.execute(self._q["processed_keys_prune"], {"now": now, "limit": params.limit - deleted})
                )
            return deleted

        return self._pool.write("keys_prune", prune)

    # ------------------------------------------------------------------ schedules

    def schedules_upsert(self, params: base.SchedulesUpsertParams) -> None:
        """Create schedules or update existing ones (see SchedulesUpsertParams)."""
        rows = cv.schedule_rows(params.schedules)
        if rows:

            def upsert(cur: Cursor) -> None:
                for row in rows:  # one by one: executemany would fold them into one multi-row statement
                    cur.execute(self._q["schedules_upsert"], row)

            self._pool.write("schedules_upsert", upsert)

    def schedules_list(self) -> list[base.Schedule]:
        """Every schedule, by name."""
        return [cv.schedule(row) for row in self._select("schedules_list", "schedules_list")]

    def schedules_update(self, params: base.SchedulesUpdateParams) -> bool:
        """Pause/resume a schedule or give it a new cron and next tick; False if it does not exist."""
        args = {
            "name": params.name,
            "paused": None if params.paused is None else int(params.paused),
            "cron": params.cron,
            "next_run_at": cv.to_db_time_or_none(params.next_run_at),
        }
        return self._pool.write("schedules_update", lambda cur: cur.execute(self._q["schedules_update"], args) > 0)

    def schedules_delete(self, params: base.SchedulesDeleteParams) -> bool:
        """Delete a schedule; False if it did not exist."""
        args = {"name": params.name}
        return self._pool.write("schedules_delete", lambda cur: cur.execute(self._q["schedules_delete"], args) > 0)

    def schedule_fire(self, params: base.ScheduleFireParams) -> bool:
        """Fire one tick once, however many schedulers try (see ScheduleFireParams)."""
        args = {
            "name": params.name,
            "due_at": cv.to_db_time(params.due_at),
            "next_run_at_after": cv.to_db_time(params.next_run_at_after),
            "last_run_at": cv.to_db_time(params.last_run_at),
            **params.read_args(),
        }

        def fire(cur: Cursor) -> bool:
            if cur.execute(self._q["schedule_fire"], args) != 1:
                return False
            self._insert_rows(cur, [params.job], params.now)
            return True

        fired = self._pool.write("schedule_fire", fire)
        if fired:
            self._promotions.scheduled_many(scheduled_earliest([params.job], params.now))
        return fired

    def schedule_move(self, params: base.ScheduleMoveParams) -> bool:
        """Move a stored next tick, firing nothing (see ScheduleMoveParams)."""
        args = {
            "name": params.name,
            "due_at": cv.to_db_time(params.due_at),
            "next_run_at": cv.to_db_time(params.next_run_at),
            **params.read_args(),
        }
        return self._pool.write("schedule_move", lambda cur: cur.execute(self._q["schedule_move"], args) == 1)

    # ------------------------------------------------------------------ topics

    def subscriptions_upsert(self, params: base.SubscriptionsUpsertParams) -> None:
        """Create subscriptions or update the task and filter of existing (topic, queue) pairs."""
        rows = [{"topic": s.topic, "queue": s.queue, "task": s.task, "filter": s.filter} for s in params.subscriptions]
        if rows:

            def upsert(cur: Cursor) -> None:
                for row in rows:
                    cur.execute(self._q["subscriptions_upsert"], row)

            self._pool.write("subscriptions_upsert", upsert)

    def subscriptions_list(self, params: base.SubscriptionsListParams) -> list[base.Subscription]:
        """Subscriptions of one topic (or all), by topic then queue."""
        rows = self._select("subscriptions_list", "subscriptions_list", {"topic": params.topic})
        return [
            base.Subscription(topic=row["topic"], queue=row["queue"], task=row["task"], filter=row["filter"])
            for row in rows
        ]

    def subscriptions_delete(self, params: base.SubscriptionsDeleteParams) -> bool:
        """Delete one subscription; False if it did not exist."""
        args = {"topic": params.topic, "queue": params.queue}
        return self._pool.write(
            "subscriptions_delete", lambda cur: cur.execute(self._q["subscriptions_delete"], args) > 0
        )

    # ------------------------------------------------------------------ backpressure and retention

    def queue_load(self, params: base.QueueLoadParams) -> base.QueueLoad:
        """The live depth of one queue and how many of its jobs ended in the last ``window`` seconds."""
        now = cv.to_db_time(params.now)
        # The window's start on exact microseconds, as on the other engines.
        since = cv.to_db_time(params.now - timedelta(seconds=params.window))

        def load(cur: Cursor) -> tuple[int, int, frozenset[str]]:
            cur.execute(self._q["queue_depth"], {"queue": params.queue})
            depth = int(next(iter(cur.fetchone().values())))  # type: ignore[union-attr]
            cur.execute(self._q["queue_drained"], {"queue": params.queue, "since": since, "now": now})
            drained = int(next(iter(cur.fetchone().values())))  # type: ignore[union-attr]
            held: frozenset[str] = frozenset()
            if params.keys:
                cur.execute(
                    self._q["queue_keys_held"], {"queue": params.queue, "keys": json.dumps(params.keys), "now": now}
                )
                held = frozenset(row["key"] for row in cur.fetchall())
            return depth, drained, held

        depth, drained, held = self._pool.read("queue_load", load)
        return base.QueueLoad(queue=params.queue, depth=depth, drained=drained, window=params.window, held=held)

    def archive_prune(self, params: base.ArchivePruneParams) -> int:
        """Delete up to ``limit`` archived rows past retention; return how many (call until 0)."""
        cutoffs = [params.default_before, params.default_dead_before, *params.before.values()]
        cutoffs.extend(params.dead_before.values())
        args = {
            "before": json.dumps([[q, cv.to_db_time(t)] for q, t in params.before.items()]),
            "dead_before": json.dumps([[q, cv.to_db_time(t)] for q, t in params.dead_before.items()]),
            "default_before": cv.to_db_time(params.default_before),
            "default_dead_before": cv.to_db_time(params.default_dead_before),
            "latest_cutoff": cv.to_db_time(max(cutoffs)),
            "limit": params.limit,
        }

        def prune(cur: Cursor) -> int:
            cur.execute(self._q["archive_prune_pick"], args)
            ids = [row["id"] for row in cur.fetchall()]
            if not ids:
                return 0
            return int(cur.execute(self._q["archive_delete"], {"ids": tuple(ids)}))

        return self._pool.write("archive_prune", prune)

    # ------------------------------------------------------------------ schema and API tokens

    def database_now(self) -> datetime | None:
        """The server's clock (``NOW(6)``), the one referee every worker's scheduler then agrees on."""
        rows = self._select("database_now", "database_now")
        return cv.from_db_time(float(next(iter(rows[0].values()))))

    def migrations_pending(self) -> list[str]:
        """The names of the migrations not yet applied to this database."""

        def done(cur: Cursor) -> set[int]:
            cur.execute(self._q["migrations_ledger_exists"])
            if cur.fetchone() is None:
                return set()
            cur.execute(self._q["migrations_applied"])
            return {row["version"] for row in cur.fetchall()}

        applied = self._pool.read("migrations_pending", done)
        return [m.name for m in load_migrations(_PACKAGE) if m.version not in applied]

    def tokens_insert(self, params: base.TokensInsertParams) -> bool:
        """Store a token; False, with nothing written, if its name or id is taken."""
        t = params.token
        args = cv.token_args(t)

        def insert(cur: Cursor) -> bool:
            try:
                cur.execute(self._q["tokens_insert"], args)
            except pymysql.err.IntegrityError as exc:
                if is_duplicate(exc):
                    return False
                raise
            return True

        return self._pool.write("tokens_insert", insert)

    def token_get(self, params: base.TokenGetParams) -> base.Token | None:
        """The token with this public id, or None."""
        rows = self._select("token_get", "token_get", {"id": params.id})
        return cv.token(rows[0]) if rows else None

    def tokens_list(self) -> list[base.Token]:
        """Every token, by name."""
        return [cv.token(row) for row in self._select("tokens_list", "tokens_list")]

    def tokens_revoke(self, params: base.TokensRevokeParams) -> bool:
        """Revoke the unrevoked token named ``name``; False if there is none."""
        args = {"name": params.name, "now": cv.to_db_time(params.now)}
        return self._pool.write("tokens_revoke", lambda cur: cur.execute(self._q["tokens_revoke"], args) > 0)

    # ------------------------------------------------------------------ observability

    def task_totals(self, params: base.TaskTotalsParams) -> list[base.TaskTotals]:
        """Terminal totals per (queue, task), from the counters."""
        rows = self._select("task_totals", "task_totals", {"queue": params.queue})
        return [
            base.TaskTotals(
                queue=row["queue"],
                task=row["task"],
                completed=int(row["completed"]),
                dead=int(row["dead"]),
                expired=int(row["expired"]),
                cancelled=int(row["cancelled"]),
            )
            for row in rows
        ]

    def database_health(self, params: base.DatabaseHealthParams) -> base.DatabaseHealth:
        """The oldest open transaction's age on this database (None without the PROCESS privilege that
        InnoDB's transaction list needs). Dead rows: None, InnoDB purges them server-wide in the
        background and counts no such number per table."""
        try:
            rows = self._select("database_health", "database_health", {"now": cv.to_db_time(params.now)})
        except BackendRefused:
            return base.DatabaseHealth(None, None)
        return base.DatabaseHealth(float(rows[0]["oldest_transaction_age"]), None)

    def workers_beat(self, params: base.WorkersBeatParams) -> None:
        """Insert or refresh one worker's row."""
        w = params.worker
        args = cv.worker_args(w, params.now)
        self._pool.write("workers_beat", lambda cur: cur.execute(self._q["workers_beat"], args))

    def workers_remove(self, params: base.WorkersRemoveParams) -> bool:
        """Delete one worker's row; False if there was none."""
        args = {"id": params.id}
        return self._pool.write("workers_remove", lambda cur: cur.execute(self._q["workers_remove"], args) > 0)

    def workers_list(self, params: base.WorkersListParams) -> list[base.WorkerInfo]:
        """Workers seen since ``seen_after``, each with its in-flight job ids."""
        seen_after = None if params.seen_after is None else cv.to_db_time(params.seen_after)

        def read(cur: Cursor) -> tuple[list[dict[str, Any]], dict[str, list[UUID]]]:
            cur.execute(self._q["workers_list"], {"seen_after": seen_after})
            workers = list(cur.fetchall())
            in_flight: dict[str, list[UUID]] = {}
            if workers:
                cur.execute(self._q["workers_in_flight"])
                for row in cur.fetchall():
                    in_flight.setdefault(row["worker_id"], []).append(UUID(row["id"]))
            return workers, in_flight

        workers, in_flight = self._pool.read("workers_list", read)
        return [
            base.WorkerInfo(
                id=row["id"],
                host=row["host"],
                pid=row["pid"],
                queues=tuple(json.loads(row["queues"])),
                concurrency=row["concurrency"],
                started_at=cv.from_db_time(row["started_at"]),
                last_seen=cv.from_db_time(row["last_seen"]),
                in_flight=tuple(in_flight.get(row["id"], ())),
            )
            for row in workers
        ]

    def jobs_vacuum(self) -> None:
        """Nothing to do: InnoDB purges deleted rows in the background."""

    def workers_prune(self, params: base.WorkersPruneParams) -> int:
        """Delete workers not seen since ``before``."""
        args = {"before": cv.to_db_time(params.before)}
        return self._pool.write("workers_prune", lambda cur: int(cur.execute(self._q["workers_prune"], args)))

    def alerts_list(self) -> list[base.AlertState]:
        """Every stored alert, by rule and queue."""
        return [cv.alert(row) for row in self._select("alerts_list", "alerts_list")]

    def alerts_set(self, params: base.AlertsSetParams) -> list[base.AlertState]:
        """Write an evaluation in one transaction; return the alerts whose state it changed."""

        def write(cur: Cursor) -> list[base.AlertState]:
            changed: list[base.AlertState] = []
            for item in params.items:
                args = cv.alert_args(item, params.now)
                if cur.execute(self._q["alerts_change"], args) > 0 or (
                    item.state == "firing" and self._fire_new(cur, args)
                ):
                    changed.append(item)
                else:
                    cur.execute(self._q["alerts_refresh"], args)
            return changed

        return self._pool.write("alerts_set", write)

    def _fire_new(self, cur: Cursor, args: dict[str, Any]) -> bool:
        try:
            cur.execute(self._q["alerts_fire_new"], args)
        except pymysql.err.IntegrityError as exc:
            if is_duplicate(exc):
                return False  # stored already, in this state (alerts_change matched nothing)
            raise
        return True


def _keys(items: Sequence[base.LeaseRef]) -> tuple[str, ...]:
    """The job ids of ``items`` as a tuple, which PyMySQL writes as an ``IN`` list: the batch statements name
    their rows by primary key as well as through the JSON of their items (see jobs_promote's comment)."""
    return tuple(cv.to_db_id(item.id) for item in items)


def _present(item: dict[str, Any]) -> dict[str, Any]:
    """An item without its None values: JSON_TABLE reads a missing path as NULL."""
    return {k: v for k, v in item.items() if v is not None}


@contextmanager
def _all_or_nothing(conn: pymysql.connections.Connection) -> Iterator[Cursor]:
    """The caller's transaction gains all of a call's writes or none of them (a savepoint in it). A
    connection in autocommit mode commits them as one: the savepoint then needs a transaction begun."""
    began = bool(conn.get_autocommit())
    cur = conn.cursor(_connection.Cursor)
    if began:
        cur.execute("START TRANSACTION")
    cur.execute("SAVEPOINT conveyor_send")
    try:
        yield cur
    except BaseException:
        with suppress(pymysql.err.MySQLError):  # a deadlock rolled the whole transaction back already
            cur.execute("ROLLBACK TO SAVEPOINT conveyor_send")
            if began:
                cur.execute("ROLLBACK")
        raise
    cur.execute("RELEASE SAVEPOINT conveyor_send")
    if began:
        cur.execute("COMMIT")


def _satisfies_the_contract(backend: MysqlBackend) -> base.Backend:
    # Never called: mypy checks here that MysqlBackend implements every method of the Protocol.
    return backend


def _too_large(jobs: Sequence[base.NewJob], inserted: set[str], exc: StatementTooLong) -> TooLargeForDatabase:
    """The refusal of a batch one of whose jobs is too large for a statement, naming that job and field.

    A batch's rows are folded into statements that each fit the server's packet, so a statement too long
    holds one row alone: the largest inserted job's (not a duplicate's, nor a resend's). Its payload or
    headers (whichever is larger) is named, as a limit above the seam names a field, so that the HTTP API
    answers 413 naming it, not 503."""
    sizes = [
        (len(job.payload.encode()) + len(job.headers.encode()), i)
        for i, job in enumerate(jobs)
        if cv.to_db_id(job.id) in inserted
    ]
    _, i = max(sizes)
    job = jobs[i]
    field = "payload" if len(job.payload) >= len(job.headers) else "headers"
    size = len(getattr(job, field).encode())
    where = f" (job {i} of the batch)" if len(jobs) > 1 else ""
    return TooLargeForDatabase(
        f"{field} is {size:,} bytes of JSON{where}, too large for one statement of this MySQL server "
        f"(max_allowed_packet {exc.limit:,} bytes): nothing was sent; enqueue a "
        "reference (an object key, a row id) instead, or raise the server's max_allowed_packet"
    )
