"""The SQLite implementation of the storage seam."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from conveyor._errors import ConfigurationError
from conveyor._idempotency import refuse_reused_keys
from conveyor.backends import _convert as cv
from conveyor.backends import base, sqlite_url
from conveyor.backends._promotion import Promotions, earliest_by_queue, scheduled_earliest
from conveyor.backends._sql import load_migrations, load_queries
from conveyor.backends.sqlite import _schema
from conveyor.backends.sqlite._connection import ConnectionPool, Connections, MemoryConnection, translated

_QUERIES = load_queries("conveyor.backends.sqlite")


class SqliteBackend:
    """The storage contract on one SQLite file; the embedded default that needs no server.

    Safe to share between threads (a small pool of connections) and between worker processes on
    the same file (WAL mode, every write in ``BEGIN IMMEDIATE``). There are no notifications across
    processes: ``listen`` returns a polling listener. Errors surface as :class:`conveyor.BackendError`,
    or :class:`conveyor.BackendUnavailable` when the file stayed locked past the busy timeout.

    ``SqliteBackend(":memory:")`` is a private in-memory database instead (``memory://``, the
    testing kit's engine, see :class:`MemoryBackend`): the same SQL on one connection, gone with
    the process, with real notifications (every writer is in this process)."""

    engine = "sqlite"
    notifies = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = self.path = os.fspath(path)
        self._pool: Connections
        if path == ":memory:":
            self._commits = _Commits()
            self._pool = MemoryConnection(on_commit=self._commits.committed)
            self.engine = "memory"
            self.notifies = True
            self.url = "memory://"
        else:
            self._pool = ConnectionPool(path)
            self.url = sqlite_url(path)
        self._q = _QUERIES
        # The next scheduled job each queue's last acquire saw, and those this process wrote since.
        self._promotions = Promotions()
        if isinstance(self._pool, MemoryConnection):
            _schema.migrate_memory(self._pool, self._q)  # a private in-memory database is always new

    # ------------------------------------------------------------------ lifecycle

    def migrate(self) -> list[str]:
        """Apply pending migrations; return their names. Idempotent and safe across processes."""
        return _schema.migrate(self._pool, self._q)

    def close(self) -> None:
        """Close the connections; calls made afterwards raise BackendError."""
        self._pool.close()

    def forked(self) -> SqliteBackend:
        """The same file, connections of its own; a private in-memory database: itself (see
        :meth:`Backend.forked`)."""
        return self if self.engine == "memory" else SqliteBackend(self.path)

    def listen(self, queues: Sequence[str]) -> base.Listener:
        """A polling listener on a file (SQLite cannot notify other processes); on a private
        in-memory database, a listener woken by every committed write (a wake-up may be spurious)."""
        if isinstance(self._pool, MemoryConnection):
            return _CommitListener(self._commits)
        return base.PollingListener()

    def jobs_next_due(self, queues: Sequence[str]) -> datetime | None:
        """The earliest scheduled job of ``queues`` known to come due (see :mod:`conveyor.backends._promotion`)."""
        return self._promotions.next_due(queues)

    def loop_statements(self) -> None:
        """None: SQLite's driver has no async mode (its calls are local and short)."""
        return None

    def _caller_connection(self, conn: object) -> sqlite3.Connection:
        """The caller's own connection (``conn=``), whose transaction a call joins."""
        if isinstance(self._pool, MemoryConnection):
            raise ConfigurationError(
                "an in-memory database cannot join a caller's transaction (conn=...); drop conn, or test "
                "transactional enqueues against sqlite:///file.db or postgresql://"
            )
        if not isinstance(conn, sqlite3.Connection):
            raise ConfigurationError(
                f"conn= must be an open sqlite3.Connection, not {type(conn).__module__}.{type(conn).__qualname__}"
            )
        return conn

    # ------------------------------------------------------------------ producing

    def jobs_insert_many(self, params: base.JobsInsertParams) -> list[UUID]:
        """Insert jobs; return the stored id for each, in order (the holder's id for a duplicate
        idempotency key inside its window).

        With ``params.conn`` (a ``sqlite3.Connection`` on the same file, schema migrated) the
        statements run on that connection and are not committed: the caller's transaction
        decides."""
        if params.conn is not None:
            conn = self._caller_connection(params.conn)
            # Every row built (validated) before the first is written, and the writes in a savepoint:
            # a bad row or a refused statement leaves the caller's transaction as it was (before,
            # the idempotency keys of the rows ahead of a bad one stayed claimed by jobs never stored).
            jobs = list(params.jobs)
            with translated(), _all_or_nothing(conn):
                return self._insert(conn, jobs, params.now, params.strict_keys)
        with self._pool.write() as conn:
            return self._insert(conn, params.jobs, params.now, params.strict_keys)

    def _insert(
        self, conn: sqlite3.Connection, jobs: Sequence[base.NewJob], at: datetime, strict_keys: bool
    ) -> list[UUID]:
        ids = self._insert_rows(conn, jobs, at)
        if strict_keys:

            def held(job_id: UUID) -> tuple[str, str] | None:
                row = conn.execute(self._q["idempotency_holder_job"], {"id": cv.to_db_id(job_id)}).fetchone()
                return None if row is None else (row[0], row[1])

            # Raised inside the write's transaction (or the caller's savepoint): nothing is written.
            refuse_reused_keys(jobs, ids, held)
        return ids

    def _insert_rows(self, conn: sqlite3.Connection, jobs: Sequence[base.NewJob], at: datetime) -> list[UUID]:
        now = cv.to_db_time(at)
        ids: list[UUID] = []
        rows: list[dict[str, Any]] = []
        for job in jobs:
            if job.idempotency_key is not None:
                # Claiming the key row first, in the same transaction as the insert, makes the
                # check-then-insert atomic; a later job of this very batch sees the claim too.
                key = {"queue": job.queue, "key": job.idempotency_key}
                claimed = conn.execute(
                    self._q["idempotency_claim"],
                    {
                        **key,
                        "job_id": cv.to_db_id(job.id),
                        "expires_at": cv.to_db_time_or_none(job.dedup_until),
                        "now": now,
                    },
                ).fetchall()
                if not claimed:
                    holder = conn.execute(self._q["idempotency_holder"], key).fetchall()
                    ids.append(UUID(holder[0][0]))
                    continue
            rows.append(
                {
                    "id": cv.to_db_id(job.id),
                    "queue": job.queue,
                    "task": job.task,
                    "payload": job.payload,
                    "headers": job.headers,
                    "priority": job.priority,
                    "run_at": cv.to_db_time(job.run_at),
                    "now": now,
                    "expires_at": cv.to_db_time_or_none(job.expires_at),
                    "max_attempts": job.max_attempts,
                    "max_deliveries": job.max_deliveries,
                    "idempotency_key": job.idempotency_key,
                    "ordering_key": job.ordering_key,
                    "replay_of": None if job.replay_of is None else cv.to_db_id(job.replay_of),
                }
            )
            ids.append(job.id)
        if rows:
            conn.executemany(self._q["jobs_insert"], rows)
        self._promotions.scheduled_many(scheduled_earliest(jobs, at))
        return ids

    # ------------------------------------------------------------------ consuming

    def jobs_acquire(self, params: base.JobsAcquireParams) -> list[base.Delivery]:
        """Lease up to ``limit`` ready jobs (see JobsAcquireParams), in hand-out order."""
        if params.limit <= 0:
            return []
        now = cv.to_db_time(params.now)
        with self._pool.write() as conn:
            # In the acquire's transaction, so it sees them; one index probe when nothing is due. Skipped
            # with promote False, as on the other engines (the caller's next acquire promotes).
            moved = (
                conn.execute(self._q["jobs_promote"], {"queue": params.queue, "now": now}).rowcount
                if params.promote
                else None
            )
            rows = conn.execute(
                self._q["jobs_acquire"],
                {
                    "queue": params.queue,
                    "limit": params.limit,
                    "lease_expires_at": cv.lease_end(params.now, params.visibility_timeout),
                    "worker_id": params.worker_id,
                    "now": now,
                },
            ).fetchall()
            if moved is not None and len(rows) < params.limit:
                # The worker may go idle: note when the queue's next scheduled job is due (jobs_next_due).
                upcoming = conn.execute(self._q["jobs_next_scheduled"], {"queue": params.queue}).fetchone()
                next_run_at = None if upcoming is None else cv.from_db_time(upcoming[0])
                self._promotions.promoted(params.queue, params.now, (moved, 0, next_run_at))
        rows.sort(key=lambda r: (-r["priority"], r["run_at"], r["id"]))
        return [cv.delivery(row) for row in rows]

    def jobs_start_many(self, params: base.JobsStartParams) -> list[UUID]:
        """Count deliveries as started; return the ids that still held their lease (``wait`` changes
        nothing here: SQLite locks the database, not rows)."""
        items = cv.lease_refs(params.items)
        if items == "[]":
            return []
        with self._pool.write() as conn:
            rows = conn.execute(self._q["jobs_start_many"], {"items": items}).fetchall()
        return cv.held(params.items, rows)

    def jobs_finish_many(self, params: base.JobsFinishParams) -> int:
        """Archive deliveries in their terminal state; return how many applied (the rest were stale)."""
        items = cv.finish_items(params)
        if not items:
            return 0
        args = {"items": cv.outcomes_json(items, "SQLite", "jobs_finish_many"), "now": cv.to_db_time(params.now)}
        with self._pool.write() as conn:
            conn.execute(self._q["jobs_finish_count"], args)
            conn.execute(self._q["jobs_finish_archive"], args)
            return conn.execute(self._q["jobs_finish_delete"], args).rowcount

    def jobs_retry_many(self, params: base.JobsRetryParams) -> int:
        """Return deliveries to pending at their run_at; return how many applied."""
        items = [
            {
                "id": cv.to_db_id(item.id),
                "receipt": item.receipt,
                "run_at_us": cv.micros(item.run_at),
                "error_type": item.error.type,
                "error_message": item.error.message,
                "traceback": item.error.traceback,
                "counted": 1 if item.counted else 0,
            }
            for item in base.one_outcome_per_job(params.items)
        ]
        if not items:
            return 0
        args = {"items": cv.outcomes_json(items, "SQLite", "jobs_retry_many"), "now": cv.to_db_time(params.now)}
        with self._pool.write() as conn:
            rows = conn.execute(self._q["jobs_retry_many"], args).fetchall()
        # Retries whose backoff is ahead are scheduled: an idle worker wakes when they come due.
        scheduled = ((queue, cv.from_db_time(run_at)) for queue, run_at in rows if run_at is not None)
        self._promotions.scheduled_many(earliest_by_queue(scheduled))
        return len(rows)

    def jobs_release_many(self, params: base.JobsReleaseParams) -> int:
        """Hand leased jobs that never started back to pending; return how many applied."""
        items = cv.lease_refs(params.items)
        if items == "[]":
            return 0
        with self._pool.write() as conn:
            return conn.execute(self._q["jobs_release_many"], {"items": items}).rowcount

    def leases_extend_many(self, params: base.LeasesExtendParams) -> list[UUID]:
        """Extend the leases still held; return their ids (a missing id means the lease was lost).
        ``wait`` changes nothing here: SQLite locks the database, not rows (a writer waits its busy timeout)."""
        items = cv.lease_refs(params.items)
        if items == "[]":
            return []
        with self._pool.write() as conn:
            rows = conn.execute(
                self._q["leases_extend_many"],
                {
                    "items": items,
                    "lease_expires_at": cv.lease_end(params.now, params.visibility_timeout),
                },
            ).fetchall()
        return cv.held(params.items, rows)

    def jobs_rescue_expired(self, params: base.JobsRescueParams) -> int:
        """Return up to ``limit`` expired leases to pending; return how many."""
        with self._pool.write() as conn:
            return conn.execute(
                self._q["jobs_rescue_expired"],
                {"now": cv.to_db_time(params.now), "limit": params.limit},
            ).rowcount

    # ------------------------------------------------------------------ reading

    def job_get(self, params: base.JobGetParams) -> base.JobRecord | None:
        """The job, live or archived, or None."""
        args = {"id": cv.to_db_id(params.id)}
        with self._pool.read() as conn, _lenient_text(conn):
            rows = conn.execute(self._q["job_get_live"], args).fetchall()
            if not rows:
                rows = conn.execute(self._q["job_get_archived"], args).fetchall()
        return cv.job_record(rows[0]) if rows else None

    def jobs_list(self, params: base.JobsListParams) -> list[base.JobRecord]:
        """Live rows in id order after ``params.after``."""
        with self._pool.read() as conn:
            rows = conn.execute(
                self._q["jobs_list"],
                {
                    "queue": params.queue,
                    "after": None if params.after is None else cv.to_db_id(params.after),
                    "limit": params.limit,
                },
            ).fetchall()
        return [cv.job_record(row) for row in rows]

    def queues_stats(self, params: base.QueuesStatsParams) -> list[base.QueueStats]:
        """Counts for every queue that has live or archived rows, by queue name."""
        now = cv.to_db_time(params.now)
        with self._pool.read() as conn:
            live = conn.execute(self._q["queues_stats_live"], {"now": now}).fetchall()
            totals = conn.execute(self._q["queues_stats_totals"]).fetchall()
            dlq = conn.execute(self._q["queues_stats_dlq"]).fetchall()
        return cv.queue_stats(live, totals, dlq, now)

    def archive_read(self, params: base.ArchiveReadParams) -> list[base.JobRecord]:
        """Archived rows in (finished_at, id) order strictly after the watermark."""
        with self._pool.read() as conn:
            if params.after is None:
                rows = conn.execute(self._q["archive_read_first"], {"limit": params.limit}).fetchall()
            else:
                after_at, after_id = params.after
                rows = conn.execute(
                    self._q["archive_read_after"],
                    {
                        "after_at": cv.to_db_time(after_at),
                        "after_id": cv.to_db_id(after_id),
                        "limit": params.limit,
                    },
                ).fetchall()
        return [cv.job_record(row) for row in rows]

    # ------------------------------------------------------------------ dead letters and audit

    def dead_list(self, params: base.DeadListParams) -> list[base.JobRecord]:
        """Unreplayed dead letters, newest first, filtered by queue, task and error type."""
        with self._pool.read() as conn, _lenient_text(conn):
            rows = conn.execute(
                self._q["dead_list"],
                cv.dead_list_args(params),
            ).fetchall()
        return [cv.job_record(row) for row in rows]

    def dead_replay_many(self, params: base.DeadReplayParams) -> list[tuple[UUID, UUID]]:
        """Re-enqueue dead letters with fresh attempts; return the pairs actually replayed."""
        pairs = cv.once_each(params.replays)
        replays = json.dumps([[cv.to_db_id(d), cv.to_db_id(n)] for d, n in pairs])
        now = cv.to_db_time(params.now)
        with self._pool.write() as conn:
            rows = conn.execute(self._q["dead_replay_insert"], {"replays": replays, "now": now}).fetchall()
            conn.execute(self._q["dead_replay_mark"], {"replays": replays})
            conn.execute(self._q["dead_replay_rekey"], {"replays": replays, "now": now})
            replayed = {UUID(row[0]): UUID(row[1]) for row in rows}
            done = [(d, replayed[d]) for d, _ in pairs if d in replayed]
            self._audit(
                conn,
                now,
                params.actor,
                "replay",
                params.reason,
                [d for d, _ in done],
                {"replays": [[str(d), str(n)] for d, n in done]},
            )
        return done

    def dead_purge_many(self, params: base.DeadPurgeParams) -> int:
        """Delete dead letters for good (one audit row); return how many were deleted."""
        ids = json.dumps([cv.to_db_id(i) for i in params.ids])
        now = cv.to_db_time(params.now)
        with self._pool.write() as conn:
            rows = conn.execute(self._q["dead_purge_many"], {"ids": ids}).fetchall()
            purged = sorted(UUID(row[0]) for row in rows)
            self._audit(conn, now, params.actor, "purge", params.reason, purged, {"count": len(purged)})
        return len(purged)

    def audit_insert(self, params: base.AuditInsertParams) -> None:
        """Record one operator action."""
        with self._pool.write() as conn:
            conn.execute(
                self._q["audit_insert"],
                {
                    "now": cv.to_db_time(params.now),
                    "actor": params.actor,
                    "action": params.action,
                    "reason": params.reason,
                    "job_ids": json.dumps([str(i) for i in params.job_ids]),
                    "details": params.details,
                },
            )

    def audit_list(self, params: base.AuditListParams) -> list[base.AuditEntry]:
        """Operator actions, newest first."""
        with self._pool.read() as conn:
            rows = conn.execute(
                self._q["audit_list"], {"limit": params.limit, "job_id": cv.quoted_id(params.job_id)}
            ).fetchall()
        return [cv.audit_entry(row) for row in rows]

    def _audit(
        self,
        conn: sqlite3.Connection,
        now: float,
        actor: str,
        action: str,
        reason: str,
        job_ids: Iterable[UUID],
        details: dict[str, Any],
    ) -> None:
        conn.execute(
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

        With ``params.conn`` (a ``sqlite3.Connection``) the claim joins the caller's transaction."""
        args = {
            "key": params.key,
            "expires_at": cv.to_db_time(params.expires_at),
            "now": cv.to_db_time(params.now),
        }
        if params.conn is not None:
            conn = self._caller_connection(params.conn)
            with translated():
                return bool(conn.execute(self._q["processed_keys_claim"], args).fetchall())
        with self._pool.write() as conn:
            return bool(conn.execute(self._q["processed_keys_claim"], args).fetchall())

    def keys_prune(self, params: base.KeysPruneParams) -> int:
        """Delete up to ``limit`` expired idempotency and processed keys; return how many."""
        now = cv.to_db_time(params.now)
        with self._pool.write() as conn:
            deleted: int = conn.execute(self._q["idempotency_keys_prune"], {"now": now, "limit": params.limit}).rowcount
            if deleted < params.limit:
                deleted += conn.execute(
                    self._q["processed_keys_prune"], {"now": now, "limit": params.limit - deleted}
                ).rowcount
        return deleted

    # ------------------------------------------------------------------ schedules

    def schedules_upsert(self, params: base.SchedulesUpsertParams) -> None:
        """Create schedules or update existing ones (see SchedulesUpsertParams)."""
        rows = cv.schedule_rows(params.schedules)
        if rows:
            with self._pool.write() as conn:
                conn.executemany(self._q["schedules_upsert"], rows)

    def schedules_list(self) -> list[base.Schedule]:
        """Every schedule, by name."""
        with self._pool.read() as conn:
            rows = conn.execute(self._q["schedules_list"]).fetchall()
        return [cv.schedule(row) for row in rows]

    def schedules_update(self, params: base.SchedulesUpdateParams) -> bool:
        """Pause/resume a schedule or give it a new cron and next tick; False if it does not exist."""
        args = {
            "name": params.name,
            "paused": None if params.paused is None else int(params.paused),
            "cron": params.cron,
            "next_run_at": cv.to_db_time_or_none(params.next_run_at),
        }
        with self._pool.write() as conn:
            return conn.execute(self._q["schedules_update"], args).rowcount > 0

    def schedules_delete(self, params: base.SchedulesDeleteParams) -> bool:
        """Delete a schedule; False if it did not exist."""
        with self._pool.write() as conn:
            return conn.execute(self._q["schedules_delete"], {"name": params.name}).rowcount > 0

    def schedule_fire(self, params: base.ScheduleFireParams) -> bool:
        """Fire one tick once, however many schedulers try (see ScheduleFireParams)."""
        args = {
            "name": params.name,
            "due_at": cv.to_db_time(params.due_at),
            "next_run_at_after": cv.to_db_time(params.next_run_at_after),
            "last_run_at": cv.to_db_time(params.last_run_at),
            **params.read_args(),
        }
        with self._pool.write() as conn:
            if conn.execute(self._q["schedule_fire"], args).rowcount != 1:
                return False
            self._insert_rows(conn, [params.job], params.now)
        return True

    def schedule_move(self, params: base.ScheduleMoveParams) -> bool:
        """Move a stored next tick back, firing nothing (see ScheduleMoveParams)."""
        args = {
            "name": params.name,
            "due_at": cv.to_db_time(params.due_at),
            "next_run_at": cv.to_db_time(params.next_run_at),
            **params.read_args(),
        }
        with self._pool.write() as conn:
            return conn.execute(self._q["schedule_move"], args).rowcount == 1

    # ------------------------------------------------------------------ topics

    def subscriptions_upsert(self, params: base.SubscriptionsUpsertParams) -> None:
        """Create subscriptions or update the task and filter of existing (topic, queue) pairs."""
        rows = [{"topic": s.topic, "queue": s.queue, "task": s.task, "filter": s.filter} for s in params.subscriptions]
        if rows:
            with self._pool.write() as conn:
                conn.executemany(self._q["subscriptions_upsert"], rows)

    def subscriptions_list(self, params: base.SubscriptionsListParams) -> list[base.Subscription]:
        """Subscriptions of one topic (or all), by topic then queue."""
        with self._pool.read() as conn:
            rows = conn.execute(self._q["subscriptions_list"], {"topic": params.topic}).fetchall()
        return [
            base.Subscription(topic=row["topic"], queue=row["queue"], task=row["task"], filter=row["filter"])
            for row in rows
        ]

    def subscriptions_delete(self, params: base.SubscriptionsDeleteParams) -> bool:
        """Delete one subscription; False if it did not exist."""
        with self._pool.write() as conn:
            return (
                conn.execute(self._q["subscriptions_delete"], {"topic": params.topic, "queue": params.queue}).rowcount
                > 0
            )

    # ------------------------------------------------------------------ backpressure and retention

    def queue_load(self, params: base.QueueLoadParams) -> base.QueueLoad:
        """The live depth of one queue and how many of its jobs ended in the last ``window`` seconds."""
        now = cv.to_db_time(params.now)
        # The window's start on exact microseconds (as PostgreSQL subtracts an interval), not a
        # difference of REAL seconds that could round past a row finished at that very instant.
        since = cv.to_db_time(params.now - timedelta(seconds=params.window))
        with self._pool.read() as conn:
            depth = conn.execute(self._q["queue_depth"], {"queue": params.queue}).fetchall()[0][0]
            drained = conn.execute(
                self._q["queue_drained"], {"queue": params.queue, "since": since, "now": now}
            ).fetchall()[0][0]
            held: frozenset[str] = frozenset()
            if params.keys:
                keys = json.dumps(params.keys)
                rows = conn.execute(self._q["queue_keys_held"], {"queue": params.queue, "keys": keys, "now": now})
                held = frozenset(r[0] for r in rows.fetchall())
        return base.QueueLoad(queue=params.queue, depth=depth, drained=drained, window=params.window, held=held)

    def archive_prune(self, params: base.ArchivePruneParams) -> int:
        """Delete up to ``limit`` archived rows past retention; return how many (call until 0)."""
        cutoffs = [params.default_before, params.default_dead_before, *params.before.values()]
        cutoffs.extend(params.dead_before.values())
        args = {
            "before": json.dumps({q: cv.micros(t) for q, t in params.before.items()}),
            "dead_before": json.dumps({q: cv.micros(t) for q, t in params.dead_before.items()}),
            "default_before": cv.to_db_time(params.default_before),
            "default_dead_before": cv.to_db_time(params.default_dead_before),
            "latest_cutoff": cv.to_db_time(max(cutoffs)),
            "limit": params.limit,
        }
        with self._pool.write() as conn:
            return conn.execute(self._q["archive_prune"], args).rowcount

    # ------------------------------------------------------------------ schema and API tokens

    def database_now(self) -> datetime | None:
        """None: a SQLite file has no clock but this host's."""
        return None

    def migrations_pending(self) -> list[str]:
        """The names of the migrations not yet applied to this database."""
        with self._pool.read() as conn:
            ledger = conn.execute(self._q["migrations_ledger_exists"]).fetchone()
            done = {row[0] for row in conn.execute(self._q["migrations_applied"])} if ledger else set()
        return [m.name for m in load_migrations("conveyor.backends.sqlite") if m.version not in done]

    def tokens_insert(self, params: base.TokensInsertParams) -> bool:
        """Store a token; False, with nothing written, if its name or id is taken."""
        t = params.token
        with self._pool.write() as conn:
            rows = conn.execute(
                self._q["tokens_insert"],
                cv.token_args(t),
            ).fetchall()
        return bool(rows)

    def token_get(self, params: base.TokenGetParams) -> base.Token | None:
        """The token with this public id, or None."""
        with self._pool.read() as conn:
            row = conn.execute(self._q["token_get"], {"id": params.id}).fetchone()
        return None if row is None else cv.token(row)

    def tokens_list(self) -> list[base.Token]:
        """Every token, by name."""
        with self._pool.read() as conn:
            return [cv.token(row) for row in conn.execute(self._q["tokens_list"]).fetchall()]

    def tokens_revoke(self, params: base.TokensRevokeParams) -> bool:
        """Revoke the unrevoked token named ``name``; False if there is none."""
        with self._pool.write() as conn:
            cur = conn.execute(self._q["tokens_revoke"], {"name": params.name, "now": cv.to_db_time(params.now)})
            return cur.rowcount > 0

    # ------------------------------------------------------------------ observability

    def task_totals(self, params: base.TaskTotalsParams) -> list[base.TaskTotals]:
        """Terminal totals per (queue, task), from the counters."""
        with self._pool.read() as conn:
            rows = conn.execute(self._q["task_totals"], {"queue": params.queue}).fetchall()
        return [base.TaskTotals(**dict(row)) for row in rows]

    def database_health(self, params: base.DatabaseHealthParams) -> base.DatabaseHealth:
        """SQLite has no long transactions holding back cleanup and no dead tuples: both None."""
        return base.DatabaseHealth(None, None)

    def workers_beat(self, params: base.WorkersBeatParams) -> None:
        """Insert or refresh one worker's row."""
        w = params.worker
        with self._pool.write() as conn:
            conn.execute(
                self._q["workers_beat"],
                cv.worker_args(w, params.now),
            )

    def workers_remove(self, params: base.WorkersRemoveParams) -> bool:
        """Delete one worker's row; False if there was none."""
        with self._pool.write() as conn:
            return conn.execute(self._q["workers_remove"], {"id": params.id}).rowcount > 0

    def workers_list(self, params: base.WorkersListParams) -> list[base.WorkerInfo]:
        """Workers seen since ``seen_after``, each with its in-flight job ids."""
        seen_after = None if params.seen_after is None else cv.to_db_time(params.seen_after)
        with self._pool.read() as conn:
            rows = conn.execute(self._q["workers_list"], {"seen_after": seen_after}).fetchall()
        return [
            base.WorkerInfo(
                id=row["id"],
                host=row["host"],
                pid=row["pid"],
                queues=tuple(json.loads(row["queues"])),
                concurrency=row["concurrency"],
                started_at=cv.from_db_time(row["started_at"]),
                last_seen=cv.from_db_time(row["last_seen"]),
                in_flight=tuple(UUID(i) for i in json.loads(row["in_flight"])),
            )
            for row in rows
        ]

    def jobs_vacuum(self) -> None:
        """Nothing to do: SQLite updates rows in place and reuses a deleted row's space at once."""

    def workers_prune(self, params: base.WorkersPruneParams) -> int:
        """Delete workers not seen since ``before``."""
        with self._pool.write() as conn:
            return conn.execute(self._q["workers_prune"], {"before": cv.to_db_time(params.before)}).rowcount

    def alerts_list(self) -> list[base.AlertState]:
        """Every stored alert, by rule and queue."""
        with self._pool.read() as conn:
            rows = conn.execute(self._q["alerts_list"]).fetchall()
        return [cv.alert(row) for row in rows]

    def alerts_set(self, params: base.AlertsSetParams) -> list[base.AlertState]:
        """Write an evaluation in one transaction; return the alerts whose state it changed."""
        changed: list[base.AlertState] = []
        with self._pool.write() as conn:
            for item in params.items:
                args = cv.alert_args(item, params.now)
                if conn.execute(self._q["alerts_change"], args).rowcount > 0 or (
                    item.state == "firing" and conn.execute(self._q["alerts_fire_new"], args).rowcount > 0
                ):
                    changed.append(item)
                else:
                    conn.execute(self._q["alerts_refresh"], args)
        return changed


class MemoryBackend(SqliteBackend):
    """A private in-memory database for tests: ``App(backend=MemoryBackend())`` is ``App("memory://")``.

    The SQLite engine's own SQL on one connection, so a test passes here only if the same calls
    pass on a SQLite file. Nothing is shared between two instances and nothing survives the
    process. ``conn=`` is refused with ConfigurationError (there is no transaction of yours to
    join: test transactional enqueues against a SQLite file or PostgreSQL)."""

    def __init__(self) -> None:
        super().__init__(":memory:")


class _Commits:
    """Counts the writes committed on a private in-memory database and wakes whoever waits for one."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.count = 0

    def committed(self) -> None:
        with self.condition:
            self.count += 1
            self.condition.notify_all()


class _CommitListener:
    """Wakes when a write commits on a private in-memory database (every writer is in this process).

    A write that commits while nobody waits is remembered, so the next ``wait`` returns at once: a
    fetcher that found nothing and then waits cannot miss a job inserted in between."""

    def __init__(self, commits: _Commits) -> None:
        self._commits = commits
        self._seen = commits.count
        self._closed = False

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if a write committed since the last wait."""
        commits = self._commits
        with commits.condition:
            if not self._closed:
                commits.condition.wait_for(lambda: commits.count != self._seen or self._closed, max(0.0, timeout))
            woken = commits.count != self._seen
            self._seen = commits.count
            return woken

    def close(self) -> None:
        with self._commits.condition:
            self._closed = True
            self._commits.condition.notify_all()


def _satisfies_the_contract(backend: SqliteBackend) -> base.Backend:
    # Never called: mypy checks here that SqliteBackend implements every method of the Protocol.
    return backend


@contextmanager
def _all_or_nothing(conn: sqlite3.Connection) -> Iterator[None]:
    """The caller's transaction gains all of a call's writes or none of them (a savepoint in it).
    Outside a transaction, one is begun first as sqlite3 would for the first INSERT, so the caller's
    commit still decides; a connection in autocommit mode commits the writes as one."""
    autocommit = getattr(conn, "autocommit", None)  # Python 3.12+: True, False or legacy (-1)
    legacy = autocommit not in (True, False)
    if legacy and conn.isolation_level is not None and not conn.in_transaction:
        conn.execute("BEGIN")
    conn.execute("SAVEPOINT conveyor_send")
    try:
        yield
    except BaseException:
        with suppress(sqlite3.Error):  # a broken connection: the caller's rollback says so
            conn.execute("ROLLBACK TO conveyor_send")
            conn.execute("RELEASE conveyor_send")
        raise
    conn.execute("RELEASE conveyor_send")


def _escaped(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


@contextmanager
def _lenient_text(conn: sqlite3.Connection) -> Iterator[None]:
    """Read text that is not UTF-8 with its bad bytes backslash-escaped (``\\xff``), for the reads an operator
    looks at one job or the DLQ through: SQLite stores any bytes a writer gives it as text, and sqlite3 refused the
    whole read (``Could not decode to UTF-8 column``), so one such row hid every other dead letter of its listing.
    Not for the worker's reads: a Python callable per text value costs there, and a payload so escaped is not
    the job's."""
    conn.text_factory = _escaped
    try:
        yield
    finally:
        conn.text_factory = str
