"""The operator API: every action an operator takes on a Conveyor database, in one typed place.

The CLI, the HTTP service and the dashboard are presenters over :class:`Admin`; none of them touches
the storage seam or holds a rule of its own (which dead letters ``--all`` selects, how a replay is
rate-limited and chunked, what a schedule's next tick is). Every action that changes something
(replay, purge, schedule and subscription changes, tokens) is audited with the actor that took it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from conveyor import _tokens
from conveyor._alerts import AlertRules, evaluate
from conveyor._cron import Cron
from conveyor._errors import BackendUnavailable, ConfigurationError, JobNotFoundError, NotFoundError
from conveyor._ids import uuid7
from conveyor._job import JobStatus
from conveyor._limits import check_int, check_name, check_seconds, is_utf8, preview
from conveyor._message import LATEST
from conveyor._scaling import ScalingDecision, ScalingPolicy, sum_load
from conveyor.backends import open_backend
from conveyor.backends.base import (
    AlertsSetParams,
    AlertState,
    AuditEntry,
    AuditInsertParams,
    AuditListParams,
    DatabaseHealth,
    DatabaseHealthParams,
    DeadListParams,
    DeadPurgeParams,
    DeadReplayParams,
    QueuesStatsParams,
    QueueStats,
    Schedule,
    SchedulesDeleteParams,
    SchedulesUpdateParams,
    SchedulesUpsertParams,
    Subscription,
    SubscriptionsListParams,
    TaskTotals,
    TaskTotalsParams,
    Token,
    TokenGetParams,
    TokensInsertParams,
    TokensRevokeParams,
    WorkerInfo,
    WorkersListParams,
)

if TYPE_CHECKING:
    from conveyor._app import App

__all__ = [
    "Admin",
    "AlertState",
    "AuditEntry",
    "DatabaseHealth",
    "PurgeResult",
    "QueueStats",
    "ReplayResult",
    "ScalingDecision",
    "ScalingPolicy",
    "Schedule",
    "Subscription",
    "TaskTotals",
    "Token",
    "WorkerInfo",
]

#: A replay without a rate writes this many dead letters per transaction.
REPLAY_CHUNK = 500
#: The slowest a paced replay may go, in jobs per second: one job every 100 s. Slower is a typo more
#: often than a plan (1e-6 waited 11 days between two jobs), and a schedule does it better.
MIN_REPLAY_RATE = 0.01
#: The fastest a paced replay may go, in jobs per second.
MAX_REPLAY_RATE = 1_000_000
#: Rows read per page when a filter selects dead letters: a page's payloads are in memory at once (up to
#: 100 x 256 KiB).
_PAGE = 100
#: A worker that has not reported for this long is listed as not alive (three default heartbeats).
WORKER_STALE_AFTER = timedelta(seconds=30)
#: Workers not seen for this long are left out of :meth:`Admin.workers` (the pruner deletes them).
WORKER_FORGET_AFTER = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did: ``replayed`` pairs each dead letter with the id of its new job; ``skipped``
    names the ids asked for that were not unreplayed dead letters (already replayed, purged, not dead)."""

    replayed: list[tuple[UUID, UUID]]
    skipped: list[UUID]


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What a purge did: the number of dead letters deleted, of ``selected`` asked for."""

    purged: int
    selected: int


class Admin:
    """The operator API of one :class:`~conveyor.App` (``app.admin``).

    Reads: :meth:`queues`, :meth:`task_totals`, :meth:`workers`, :meth:`alerts`,
    :meth:`database_health`, :meth:`job`, :meth:`dead_letters`, :meth:`dead_letter`, :meth:`audit`,
    :meth:`schedules`, :meth:`subscriptions`, :meth:`scaling`. Actions, each audited under ``actor``: :meth:`replay`,
    :meth:`purge`, :meth:`add_schedule`, :meth:`pause_schedule`, :meth:`resume_schedule`,
    :meth:`set_schedule`, :meth:`remove_schedule`, :meth:`subscribe`, :meth:`unsubscribe`,
    :meth:`create_token`, :meth:`revoke_token`. Bad input
    raises :class:`~conveyor.ConfigurationError` or :class:`~conveyor.PayloadError` before anything
    is written; a job, schedule or subscription that does not exist raises
    :class:`~conveyor.NotFoundError` (:class:`~conveyor.JobNotFoundError` for a job)."""

    def __init__(self, app: App) -> None:
        self.app = app
        # authenticate()'s cache: token id -> (token, when it was read). Bounded; see authenticate.
        self._tokens_seen: dict[str, tuple[Token | None, float]] = {}

    # -- schema ------------------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the names of those applied."""
        # A backend of its own: the App's migrates the embedded default on open, and would then
        # report nothing applied. An App given its backend migrates that one (its database_url
        # would name the default SQLite file): it never migrates on open.
        if self.app._backend_given:
            return self.app.backend.migrate()
        backend = open_backend(self.app.database_url)
        try:
            return backend.migrate()
        finally:
            backend.close()

    # -- reads -------------------------------------------------------------------------------------

    def queues(self) -> list[QueueStats]:
        """Counts for every queue with a live or archived job, by name: depth by state and the oldest
        ready job's age from the live table, terminal totals from the per-queue counters, the DLQ depth
        from an index of unreplayed dead letters. Costs the same on a 10M-row archive as on an empty one."""
        return self.app.backend.queues_stats(QueuesStatsParams(self.app.clock.now()))

    def task_totals(self, queue: str | None = None) -> list[TaskTotals]:
        """Terminal totals per (queue, task) since the counters began (monotonic), from the counters:
        the cost does not grow with the archive."""
        if queue is not None:
            check_name(queue, "queue", ConfigurationError)
        return self.app.backend.task_totals(TaskTotalsParams(queue))

    def database_health(self) -> DatabaseHealth:
        """Database-wide signals: the oldest open transaction's age and the jobs table's dead tuples
        (None where the engine has no such thing: SQLite)."""
        return self.app.backend.database_health(DatabaseHealthParams(self.app.clock.now()))

    def workers(self, *, stale_after: timedelta = WORKER_STALE_AFTER) -> list[WorkerInfo]:
        """Worker processes seen within the last hour, by id, each with the ids of the jobs it holds
        leases on now (``in_flight``) and whether it reported within ``stale_after`` (``alive``)."""
        now = self.app.clock.now()
        found = self.app.backend.workers_list(WorkersListParams(seen_after=now - WORKER_FORGET_AFTER))
        return [replace(w, alive=now - w.last_seen <= stale_after) for w in found]

    def alerts(self) -> list[AlertState]:
        """Alert states as ``conveyor serve`` last evaluated them (firing and resolved), by rule and
        queue. Empty until an evaluator has run."""
        return self.app.backend.alerts_list()

    def evaluate_alerts(self, rules: AlertRules | None = None) -> list[AlertState]:
        """Measure every alert rule now and store the states (see ``conveyor._alerts``); return the
        alerts whose state this call changed (fired or resolved), which are the caller's to notify.
        A change is a compare-and-set in the database, so of several evaluators (``conveyor serve
        --workers N``) exactly one gets each change back. ``rules`` default to the App's queue
        declarations (SLA, max_depth) with the default thresholds."""
        rules = rules if rules is not None else AlertRules(queues=self.app.catalogue.queues)
        now = self.app.clock.now()
        states = evaluate(rules, self.queues(), self.workers(), self.database_health(), now)
        return self.app.backend.alerts_set(AlertsSetParams(states, now))

    def scaling(
        self,
        policy: ScalingPolicy,
        *,
        queues: Sequence[str] | None = None,
        current: int | None = None,
        concurrency: int | None = None,
    ) -> ScalingDecision:
        """How many worker processes the load of ``queues`` (None: every queue) asks for under ``policy``, now:
        the recommendation for an external autoscaler (KEDA, an HPA on an external metric, a step policy).

        ``current``: the processes running now (None: ``policy.minimum``); target tracking does not depend on
        it, steps add to it. ``concurrency``: slots per process (None: the worker's default, 10). Stateless:
        no cool-downs apply (the caller has no memory here); the external autoscaler's own stabilisation
        window does that work. Raises ConfigurationError on a bad queue name or number."""
        from conveyor.worker._config import DEFAULT_CONCURRENCY

        if isinstance(queues, str | bytes):
            # A string is a sequence of its characters: "emails" counted the queues e, m, a, i, l and s.
            raise ConfigurationError("queues must be a list of queue names (or None for every queue), not one string")
        names = None if queues is None else [check_name(q, "queue", ConfigurationError) for q in queues]
        if names is not None and not names:
            raise ConfigurationError("queues: give at least one queue name (or None for every queue)")
        ready, in_flight = sum_load(self.queues(), names)
        return policy.decide(
            ready=ready,
            in_flight=in_flight,
            current=policy.minimum if current is None else current,
            concurrency=DEFAULT_CONCURRENCY if concurrency is None else concurrency,
        )

    def job(self, job_id: UUID | str) -> JobStatus:
        """One job, live or archived. Raises JobNotFoundError."""
        return self.app.job(job_id)

    def dead_letters(
        self,
        *,
        queue: str | None = None,
        task: str | None = None,
        error_type: str | None = None,
        limit: int = 100,
        before: tuple[datetime, UUID] | None = None,
    ) -> list[JobStatus]:
        """Unreplayed dead letters, newest first, filtered by queue, task and error type.

        Page with ``before``: the ``(finished_at, id)`` of the last dead letter of the previous page (a
        timezone-aware datetime and a job id). Raises ConfigurationError for a bad filter, limit or ``before``."""
        # An int, never a bool or a float: each engine took those differently (SQLite refused 1.5 and took
        # True, PostgreSQL the reverse, MySQL a syntax error), as a BackendError or a TypeError.
        limit = check_int(limit, "limit", 1, 10_000, ConfigurationError)
        before = _cursor(before)
        _check_filters(queue, task, error_type)
        params = DeadListParams(queue, task, error_type, limit=limit, before=before)
        return [JobStatus.from_record(r) for r in self.app.backend.dead_list(params)]

    def dead_letter(self, job_id: UUID | str) -> JobStatus:
        """One dead letter in full. Raises JobNotFoundError if there is no such job or it is not dead."""
        status = self.app.job(job_id)
        if status.state != "dead":
            raise JobNotFoundError(f"job {status.id} is {status.state}, not a dead letter")
        return status

    def audit(self, limit: int = 100, *, job: UUID | str | None = None) -> list[AuditEntry]:
        """Operator actions, newest first; with ``job``, only those that name that job (its replay, its
        purge), however many others came after them. Raises ConfigurationError for a limit that is not
        an int from 1 to 100000, or a ``job`` that is not a job id."""
        limit = check_int(limit, "limit", 1, 100_000, ConfigurationError)
        return self.app.backend.audit_list(AuditListParams(limit, None if job is None else _uuid(job)))

    def ready(self) -> list[str]:
        """The migrations this database still lacks (empty: ready). Raises BackendUnavailable if
        the database cannot be reached."""
        return self.app.backend.migrations_pending()

    def schedules(self) -> list[Schedule]:
        """Every schedule, by name, with its next tick."""
        return self.app.backend.schedules_list()

    def subscriptions(self, topic: str | None = None) -> list[Subscription]:
        """The subscriptions of one topic, or of all, by topic then queue."""
        return self.app.backend.subscriptions_list(SubscriptionsListParams(topic))

    # -- dead letters ------------------------------------------------------------------------------

    def select(
        self,
        ids: Sequence[UUID | str] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        error_type: str | None = None,
    ) -> list[UUID]:
        """The dead letters an action names: ``ids`` (in the order given), or every unreplayed dead
        letter of ``queue`` (narrowed by ``task`` and ``error_type``) in the order they were enqueued,
        oldest first. A filter must name a queue: acting on every queue at once is too easy a mistake.
        Raises ConfigurationError for both or neither, or a bad id."""
        if ids is not None and (queue or task or error_type):
            raise ConfigurationError("give job ids or a filter (queue, task, error type), not both")
        if isinstance(ids, str | bytes):
            # A string is a sequence of its characters: it was refused for its first one ("not a job id: '0'").
            raise ConfigurationError("ids must be a list of job ids, not one string")
        if ids is not None:
            return [_uuid(i) for i in ids]
        if not queue:
            raise ConfigurationError("selecting dead letters by filter needs a queue")
        _check_filters(queue, task, error_type)
        # Listed newest first; a replay mints the new ids in this order, and jobs of one ordering key
        # run in id order: enqueue order, so that they run again in their original order.
        return [job_id for _, job_id in sorted(self._all_dead(queue, task, error_type))]

    def _all_dead(self, queue: str, task: str | None, error_type: str | None) -> Iterator[tuple[datetime, UUID]]:
        """The (enqueued_at, id) of every unreplayed dead letter of a filter, a page of raw rows at a time: a
        selection holds only these, never the dead letters' payloads (400 of 230 KB held 245 MB decoded)."""
        before: tuple[datetime, UUID] | None = None
        while True:
            params = DeadListParams(queue, task, error_type, limit=_PAGE, before=before)
            page = self.app.backend.dead_list(params)
            yield from ((record.enqueued_at, record.id) for record in page)
            if len(page) < _PAGE:
                return
            last = page[-1]
            assert last.finished_at is not None
            before = (last.finished_at, last.id)

    def replay(
        self,
        ids: Sequence[UUID | str] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        error_type: str | None = None,
        reason: str,
        actor: str,
        rate: float | None = None,
        max_seconds: float | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> ReplayResult:
        """Re-enqueue dead letters to their source queue with fresh attempts and ``replay_of`` set;
        audited (who, when, which jobs, why).

        Selects as :meth:`select` does. ``rate`` caps it at that many jobs per second (in chunks of
        ``rate`` jobs, a second apart; below 1, one job every ``1 / rate`` seconds), so that a big
        replay cannot flood the workers; without it, chunks of 500 go as fast as the database takes
        them. ``max_seconds`` refuses a paced replay whose waits between chunks would add up to more
        than that (the HTTP service passes one: the replay holds its request and a server thread
        until it ends). ``on_progress(done, total)`` is called after each chunk.

        Raises ConfigurationError, before anything is written, for a rate that is not a finite
        number from 0.01 (one job every 100 s) to 1000000, or whose pacing is over ``max_seconds``."""
        _check_reason(reason, actor)
        if rate is not None:
            _check_rate(rate)
        if max_seconds is not None:
            # NaN slipped past the comparison below and switched the limit off.
            max_seconds = check_seconds(max_seconds, "max_seconds", ConfigurationError)
        selected = self.select(ids, queue=queue, task=task, error_type=error_type)
        chunk = max(1, int(rate)) if rate else REPLAY_CHUNK
        if rate and max_seconds is not None:
            # The waits come between chunks: none after the last one.
            waiting = max(0, (len(selected) - 1) // chunk) * chunk / rate
            if waiting > max_seconds:
                raise ConfigurationError(
                    f"rate {rate:g} per second would spread this replay of {len(selected)} dead letter(s) over "
                    f"{waiting:,.0f} s, more than the {max_seconds:g} s allowed here: give a higher rate or fewer "
                    "dead letters (the CLI's conveyor dlq replay has no such limit)"
                )
        replayed: list[tuple[UUID, UUID]] = []
        for start in range(0, len(selected), chunk):
            began = time.monotonic()
            part = selected[start : start + chunk]
            params = DeadReplayParams([(dead, uuid7()) for dead in part], actor, reason, self.app.clock.now())
            replayed.extend(self.app.backend.dead_replay_many(params))
            if on_progress is not None:
                on_progress(min(start + chunk, len(selected)), len(selected))
            if rate and start + chunk < len(selected):
                time.sleep(max(0.0, len(part) / rate - (time.monotonic() - began)))
        done = {dead for dead, _ in replayed}
        return ReplayResult(replayed, [i for i in dict.fromkeys(selected) if i not in done])

    def purge(
        self,
        ids: Sequence[UUID | str] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        error_type: str | None = None,
        reason: str,
        actor: str,
    ) -> PurgeResult:
        """Delete dead letters for good (replayed or not); audited. Selects as :meth:`select` does
        (an id named twice counts once, as in :meth:`replay`)."""
        _check_reason(reason, actor)
        selected = list(dict.fromkeys(self.select(ids, queue=queue, task=task, error_type=error_type)))
        purged = 0
        for start in range(0, len(selected), REPLAY_CHUNK):
            part = selected[start : start + REPLAY_CHUNK]
            purged += self.app.backend.dead_purge_many(DeadPurgeParams(part, actor, reason, self.app.clock.now()))
        return PurgeResult(purged, len(selected))

    # -- schedules ---------------------------------------------------------------------------------

    def add_schedule(
        self,
        name: str,
        cron: str,
        task: str,
        *,
        queue: str | None = None,
        payload: Mapping[str, Any] | None = None,
        priority: int = 0,
        actor: str,
    ) -> Schedule:
        """Store (or redefine) a schedule: workers fire it from its next tick, no restart needed.
        ``queue`` defaults to the task's queue (``default`` for a task this App does not know)."""
        schedule = self.app.catalogue.new_schedule(name, cron, task, queue, payload, priority, self.app.clock.now())
        self.app.backend.schedules_upsert(SchedulesUpsertParams([schedule]))
        self._audit(actor, "schedule.add", {"schedule": name, "cron": schedule.cron, "task": schedule.task})
        return schedule

    def pause_schedule(self, name: str, *, actor: str) -> Schedule:
        """Stop firing a schedule until it is resumed. Raises NotFoundError (ConfigurationError for a name no
        schedule can have, as add_schedule refuses it)."""
        name = _schedule_name(name)
        self._update(name, SchedulesUpdateParams(name, paused=True))
        self._audit(actor, "schedule.pause", {"schedule": name})
        return self._schedule(name)

    def resume_schedule(self, name: str, *, actor: str) -> Schedule:
        """Fire a paused schedule again, from its next tick after now (missed ticks are not fired)."""
        name = _schedule_name(name)
        schedule = self._schedule(name)
        following = Cron.parse(schedule.cron, stored=True).next_after(self.app.clock.now())
        self._update(name, SchedulesUpdateParams(name, paused=False, next_run_at=following))
        self._audit(actor, "schedule.resume", {"schedule": name})
        return self._schedule(name)

    def set_schedule(self, name: str, cron: str, *, actor: str) -> Schedule:
        """Give a schedule a new cron expression (its next tick is recomputed from now)."""
        name = _schedule_name(name)
        parsed = Cron.parse(cron)
        self._update(
            name,
            SchedulesUpdateParams(name, cron=parsed.expression, next_run_at=parsed.next_after(self.app.clock.now())),
        )
        self._audit(actor, "schedule.set", {"schedule": name, "cron": parsed.expression})
        return self._schedule(name)

    def remove_schedule(self, name: str, *, actor: str) -> None:
        """Delete a schedule (a worker whose App still declares it adds it back when it starts)."""
        name = _schedule_name(name)
        if not self.app.backend.schedules_delete(SchedulesDeleteParams(name)):
            raise NotFoundError(f"no schedule named {name!r}")
        self._audit(actor, "schedule.remove", {"schedule": name})

    def _schedule(self, name: str) -> Schedule:
        found = next((s for s in self.schedules() if s.name == name), None)
        if found is None:
            raise NotFoundError(f"no schedule named {name!r}")
        return found

    def _update(self, name: str, params: SchedulesUpdateParams) -> None:
        if not self.app.backend.schedules_update(params):
            raise NotFoundError(f"no schedule named {name!r}")

    # -- topics ------------------------------------------------------------------------------------

    def subscribe(
        self, topic: str, queue: str, task: str, filter: Mapping[str, Any] | None = None, *, actor: str
    ) -> Subscription:
        """Bind ``queue`` to ``topic`` (see :meth:`conveyor.App.subscribe`)."""
        subscription = self.app.subscribe(topic, queue, task, filter)
        self._audit(actor, "topic.subscribe", {"topic": topic, "queue": queue, "task": task, "filter": filter or {}})
        return subscription

    def unsubscribe(self, topic: str, queue: str, *, actor: str) -> None:
        """Remove ``queue``'s subscription to ``topic``. Raises NotFoundError if there was none."""
        if not self.app.unsubscribe(topic, queue):
            raise NotFoundError(f"queue {queue!r} is not subscribed to {topic!r}")
        self._audit(actor, "topic.unsubscribe", {"topic": topic, "queue": queue})

    # -- API tokens --------------------------------------------------------------------------------

    def create_token(
        self,
        name: str,
        role: str,
        *,
        queues: Sequence[str] | None = None,
        expires_at: datetime | None = None,
        actor: str,
    ) -> tuple[Token, str]:
        """Make an API token; return it and its bearer string, which is shown this once and never
        stored (only its SHA-256 is). ``role`` is producer, operator or admin; ``queues`` limits the
        token to those queues. Raises ConfigurationError for a bad or taken name (names stay taken
        after a revoke: a name is an actor in the audit log), role, queue or expiry."""
        check_name(name, "token name", ConfigurationError)
        if role not in _tokens.ROLES:
            raise ConfigurationError(f"role must be one of {', '.join(_tokens.ROLES)}, got {role!r}")
        if queues is not None:
            if isinstance(queues, str) or not queues:
                raise ConfigurationError("queues must be a non-empty list of queue names (or none: every queue)")
            queues = tuple(dict.fromkeys(check_name(q, "queue", ConfigurationError) for q in queues))
        now = self.app.clock.now()
        if expires_at is not None:
            expires_at = _expiry(expires_at, now)
        token_id, secret, bearer = _tokens.mint()
        token = Token(token_id, name, role, queues, _tokens.hash_secret(secret), now, expires_at)
        if not self.app.backend.tokens_insert(TokensInsertParams(token)):
            raise ConfigurationError(f"a token named {name!r} exists (or existed: revoked names stay taken)")
        details = {"token": name, "id": token_id, "role": role, "queues": list(queues) if queues else None}
        self._audit(actor, "token.create", {**details, "expires_at": expires_at})
        return token, bearer

    def tokens(self) -> list[Token]:
        """Every token (revoked and expired ones too), by name; secrets are not stored, so not shown."""
        return self.app.backend.tokens_list()

    def revoke_token(self, name: str, *, actor: str) -> None:
        """Revoke a token for good. Raises NotFoundError if no unrevoked token has that name.
        This Admin refuses it at once; another that caches tokens (``authenticate(max_age=...)``), such as
        another process of a service, within max_age."""
        check_name(name, "token name", ConfigurationError)
        now = self.app.clock.now()
        if not self.app.backend.tokens_revoke(TokensRevokeParams(name, now)):
            raise NotFoundError(f"no unrevoked token named {name!r}")
        # This process knows at once: its cached copy is marked revoked (not dropped, so that it stays the last
        # verdict while the database is away). A service's other processes learn it within max_age.
        for token_id, (seen, at) in list(self._tokens_seen.items()):
            if seen is not None and seen.name == name:
                self._tokens_seen[token_id] = (replace(seen, revoked_at=now), at)
        self._audit(actor, "token.revoke", {"token": name})

    def authenticate(
        self, bearer: str | None, *, max_age: float = 0.0, last_known_if_unavailable: bool = False
    ) -> Token:
        """The token a bearer string presents; raise Unauthenticated if it is malformed, unknown,
        has a wrong secret, or is revoked or expired. The secret is compared in constant time.

        ``max_age`` > 0 reuses a token read from the database up to that many seconds ago (the
        HTTP service's default is 5 s), so that a busy service does not read the token table on
        every request; a revoke then takes effect within ``max_age``. Expiry is checked on every
        call.

        ``last_known_if_unavailable``: while the database cannot be reached, the token as it was last
        read (however long ago) decides, rather than BackendUnavailable; a token never read, or
        revoked when last read, is still refused. The HTTP service's /metrics uses it, so that a
        scrape can say ``conveyor_database_up 0``."""
        token_id, secret = _tokens.parse_bearer(bearer)
        found = self._token_seen(token_id, max_age)
        if found is None:
            try:
                token = self.app.backend.token_get(TokenGetParams(token_id))
            except BackendUnavailable:
                last = self._tokens_seen.get(token_id) if last_known_if_unavailable else None
                if last is None:
                    raise
                # self.app.clock(): this host's time (plus the offset measured), not a database read.
                return _tokens.verify(last[0], token_id, secret, self.app.clock())
            if len(self._tokens_seen) >= 10_000:
                # Unknown ids cost a read each; a flood of them must not grow the cache.
                self._tokens_seen.clear()
            # Kept even without max_age: the last verdict is what a token is when the database is away.
            self._tokens_seen[token_id] = (token, time.monotonic())
            found = (token,)
        return _tokens.verify(found[0], token_id, secret, self.app.clock.now())

    def authenticate_cached(self, bearer: str | None, *, max_age: float) -> Token | None:
        """:meth:`authenticate` without reading the database: None when the token was not read
        within ``max_age`` seconds (call :meth:`authenticate` then, off the event loop)."""
        token_id, secret = _tokens.parse_bearer(bearer)
        found = self._token_seen(token_id, max_age)
        # self.app.clock(): on the event loop, the database's clock is not read (authenticate reads it).
        return None if found is None else _tokens.verify(found[0], token_id, secret, self.app.clock())

    def _token_seen(self, token_id: str, max_age: float) -> tuple[Token | None] | None:
        seen = self._tokens_seen.get(token_id)
        if seen is None or time.monotonic() - seen[1] >= max_age:
            return None
        return (seen[0],)

    # -- audit -------------------------------------------------------------------------------------

    def _audit(self, actor: str, action: str, details: Mapping[str, Any], reason: str = "") -> None:
        check_name(actor, "actor", ConfigurationError)
        text = json.dumps(details, separators=(",", ":"), sort_keys=True, default=str)
        self.app.backend.audit_insert(AuditInsertParams(actor, action, reason, self.app.clock.now(), (), text))


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ConfigurationError(f"not a job id: {preview(str(value))}") from None


def _check_filters(queue: str | None, task: str | None, error_type: str | None) -> None:
    # Filters are names: one that no engine can store (NUL, a lone surrogate) matches nothing,
    # and is refused here rather than by the database.
    for value, what in ((queue, "queue"), (task, "task"), (error_type, "error_type")):
        if value is not None:
            check_name(value, what, ConfigurationError)


def _cursor(before: object) -> tuple[datetime, UUID] | None:
    """A dead-letter page's ``before`` as a (timezone-aware datetime, UUID) pair, or ConfigurationError.
    Checked here: a naive time or a string was a TypeError on SQLite and MySQL, and PostgreSQL read a naive
    time in the session's time zone and any string as a time."""
    if before is None:
        return None
    if not isinstance(before, tuple) or len(before) != 2:
        raise ConfigurationError("before must be the (finished_at, id) of the last dead letter of the previous page")
    at, job_id = before
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise ConfigurationError(f"before's finished_at must be a timezone-aware datetime, got {repr(at)[:60]}")
    return at, _uuid(job_id)


def _expiry(expires_at: object, now: datetime) -> datetime:
    """A token's expiry: a timezone-aware datetime after ``now`` and not after the latest time a database keeps
    (PostgreSQL stored 9999-12-31T23:59:59.999999-14:00 as the year 10000, and then every read of the token table
    failed: tokens list, and every request that token made)."""
    if not isinstance(expires_at, datetime) or expires_at.utcoffset() is None or expires_at <= now:
        raise ConfigurationError("expires_at must be a timezone-aware time in the future")
    try:
        at = expires_at.astimezone(UTC)
    except OverflowError:
        at = datetime.max.replace(tzinfo=UTC)
    if at > LATEST:
        raise ConfigurationError(f"expires_at must not be after {LATEST.isoformat()}, got {expires_at.isoformat()}")
    return expires_at


def _check_rate(rate: float) -> None:
    """A replay's rate is a finite number of jobs per second from MIN_REPLAY_RATE to MAX_REPLAY_RATE."""
    # bool is an int to Python, and NaN fails every comparison: both are refused by name. (An int is
    # never converted: a 400-digit one from JSON made math.isfinite raise OverflowError, a 500.)
    number = isinstance(rate, int | float) and not isinstance(rate, bool)
    if not number or (isinstance(rate, float) and not math.isfinite(rate)):
        raise ConfigurationError(f"rate must be a finite number of jobs per second, got {repr(rate)[:40]}")
    if not MIN_REPLAY_RATE <= rate <= MAX_REPLAY_RATE:
        raise ConfigurationError(
            f"rate must be from {MIN_REPLAY_RATE:g} to {MAX_REPLAY_RATE} jobs per second, got {str(rate)[:40]}"
        )


def _check_reason(reason: str, actor: str) -> None:
    check_name(actor, "actor", ConfigurationError)
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigurationError("reason is required for an action on dead letters (it is kept in the audit log)")
    # A lone surrogate too: it was refused by the database in the first chunk's transaction (UnstorableText), and
    # a purge or replay that selected nothing wrote no audit row and so took it.
    if len(reason) > 2000 or "\x00" in reason or not is_utf8(reason):
        raise ConfigurationError("reason must be at most 2000 characters of valid Unicode, without NUL")


def _schedule_name(name: object) -> str:
    # A name no schedule can have (a NUL, a lone surrogate, past the length limit, not a string) is
    # refused as add_schedule refuses it: PostgreSQL failed the lookup itself with a BackendError, and
    # a NotFoundError quoted a 100 KB name whole.
    return check_name(name, "schedule name", ConfigurationError)
