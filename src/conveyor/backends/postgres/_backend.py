"""The PostgreSQL backend: psycopg 3 over a small connection pool, every call one statement."""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.copy import LibpqWriter
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from conveyor._errors import (
    BackendCorrupt,
    BackendError,
    BackendRefused,
    BackendUnavailable,
    ConfigurationError,
    LockWaitTimeout,
    StatementCancelled,
    UnstorableText,
    first_line,
    printable,
)
from conveyor._idempotency import refuse_reused_keys
from conveyor.backends import _deadline
from conveyor.backends._promotion import Promotions, scheduled_earliest
from conveyor.backends._redact import hide, redact_url, scrub
from conveyor.backends._sql import load_migrations, load_queries, pending
from conveyor.backends.base import (
    AlertsSetParams,
    AlertState,
    ArchivePruneParams,
    ArchiveReadParams,
    AuditEntry,
    AuditInsertParams,
    AuditListParams,
    DatabaseHealth,
    DatabaseHealthParams,
    DeadListParams,
    DeadPurgeParams,
    DeadReplayParams,
    Delivery,
    JobGetParams,
    JobRecord,
    JobsAcquireParams,
    JobsFinishParams,
    JobsInsertParams,
    JobsListParams,
    JobsReleaseParams,
    JobsRescueParams,
    JobsRetryParams,
    JobsStartParams,
    KeysPruneParams,
    LeaseRef,
    LeasesExtendParams,
    NewJob,
    ProcessedKeyClaimParams,
    QueueLoad,
    QueueLoadParams,
    QueuesStatsParams,
    QueueStats,
    Schedule,
    ScheduleFireParams,
    ScheduleMoveParams,
    SchedulesDeleteParams,
    SchedulesUpdateParams,
    SchedulesUpsertParams,
    Subscription,
    SubscriptionsDeleteParams,
    SubscriptionsListParams,
    SubscriptionsUpsertParams,
    TaskTotals,
    TaskTotalsParams,
    Token,
    TokenGetParams,
    TokensInsertParams,
    TokensRevokeParams,
    WorkerInfo,
    WorkersBeatParams,
    WorkersListParams,
    WorkersPruneParams,
    WorkersRemoveParams,
    one_outcome_per_job,
)
from conveyor.backends.postgres._args import acquire_args, finish_args, promote_args, receipt_of
from conveyor.backends.postgres._copy import TEXT_MAX, NotCopyable, copyable, write_binary, write_text
from conveyor.backends.postgres._listener import PostgresListener
from conveyor.backends.postgres._loop import PostgresLoopStatements, has_input
from conveyor.backends.postgres._rows import record_row
from conveyor.backends.postgres._times import adapters

_PACKAGE = "conveyor.backends.postgres"

# The adapters every connection reads with (see _times).
_TIMES = adapters()

# Before a pooled connection is handed out it is checked (one empty round trip) if it was idle
# for longer than this, or if its socket is readable although no query is running: that is how
# a server restart or pg_terminate_backend shows (the server sends a FATAL message and closes
# the socket). Checked connections that are broken are discarded instead of failing the caller.
# A busy, healthy connection is thus never charged an extra round trip; a server that vanishes
# without closing its sockets fails one call per pooled connection with BackendUnavailable.
_CHECK_IDLE_AFTER = 1.0

# Very large inserts are split into statements of this many jobs, all in one transaction, to
# bound the size of a single statement's parameters.
_INSERT_CHUNK = 50_000

Conn = psycopg.Connection[TupleRow]
R = TypeVar("R")


# Batches of at least this many jobs without idempotency keys are inserted by COPY (see jobs_copy);
# below it the single INSERT statement (one round trip) is quicker.
_COPY_MIN = 64

# Seconds an archive partition drop is not tried again after one was skipped because another transaction held
# the archive: a pruner working through a backlog calls archive_prune batch after batch, and each call waited
# out the drop's 1 s lock timeout (and logged a warning) while the same holder stayed.
DROP_RETRY_AFTER = 30.0


def _lock_timeout(seconds: float) -> str:
    """A bounded insert's ``lock_timeout`` (``JobsInsertParams.lock_wait``): whole milliseconds, at least 1
    (0 is no bound)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _check_url(url: str, secrets: set[str]) -> None:
    """Raise ConfigurationError for a URL libpq cannot parse, or with a port that is not a number,
    at once: the pool would otherwise retry it in the background until every call timed out."""
    try:
        params = conninfo_to_dict(url)
    except UnicodeEncodeError:
        # Bytes that are not UTF-8 (a shell's $'\xff'), read as lone surrogates: libpq takes UTF-8.
        raise ConfigurationError(
            f"malformed PostgreSQL URL {printable(redact_url(url))}: it is not valid UTF-8 text "
            "(percent-encode other bytes, e.g. %FF)"
        ) from None
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"malformed PostgreSQL URL {redact_url(url)!r}: {scrub(first_line(exc), secrets)}"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigurationError(
                f"malformed PostgreSQL URL {redact_url(url)!r}: port {scrub(port, secrets)!r} is not a number "
                "from 1 to 65535"
            )


class _Pool(ConnectionPool[Conn]):
    """A connection pool that remembers why its last connection attempt failed, so that a caller
    who timed out waiting for a connection is told the reason (refused, bad password, ...)."""

    last_error = ""
    _replaced_at = -math.inf

    def replace_all(self) -> None:
        """Replace the idle connections now and those in use when they come back, at most once a second.

        For a server that answered read-only: after a failover the pool's connections may all reach the
        old primary, now a standby; replaced one by one, each failed a caller first. At most once a
        second, so that callers retrying through a read-only spell do not reconnect the pool at every
        retry (a connection opened meanwhile is closed at its own refusal)."""
        now = time.monotonic()
        if now - self._replaced_at < 1.0:
            return
        self._replaced_at = now
        self.drain()

    def _connect(self, timeout: float | None = None) -> Conn:
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            self.last_error = first_line(exc)
            raise
        self.last_error = ""
        return conn


# Connections the backend closed itself (a read-only session): psycopg_pool logs a WARNING, "discarding
# closed connection", for each closed connection handed back, which is news only when someone else closed it.
_closed_on_purpose: weakref.WeakSet[Conn] = weakref.WeakSet()


class _QuietPool(logging.Filter):
    """Drops psycopg_pool's warning for a connection in ``_closed_on_purpose``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and args and args[0] in _closed_on_purpose)


logging.getLogger("psycopg.pool").addFilter(_QuietPool())

log = logging.getLogger("conveyor")


def _held(ids: Sequence[UUID], receipts: Sequence[UUID], rows: Sequence[TupleRow]) -> list[UUID]:
    """The ids of the deliveries (id, receipt) that ``rows`` name, in the caller's order (RETURNING
    promises none), one per item: an item naming the same job with a stale receipt is not held."""
    held = {(row[0], row[1]) for row in rows}
    return [job_id for job_id, receipt in zip(ids, receipts, strict=True) if (job_id, receipt) in held]


class PostgresBackend:
    """The :class:`~conveyor.backends.base.Backend` for PostgreSQL (13 or later).

    Thread-safe: calls borrow a connection from a small pool (``min_size`` .. ``max_size``). The
    pool opens in the background, so constructing a backend never blocks on a server that is down;
    a call that cannot get a working connection within ``connect_timeout`` seconds raises
    :class:`BackendUnavailable`, and so does any connection failure mid-call (callers retry with
    backoff; nothing is lost). Other database errors raise :class:`BackendError`. After a server
    restart broken pooled connections are discarded and replaced."""

    engine = "postgres"
    notifies = True

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout: float = 5.0,
        durable_acks: bool = False,
        statement_deadline: float | None = _deadline.STATEMENT_DEADLINE,
    ) -> None:
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(f"not a PostgreSQL URL: {redact_url(url)!r}")
        # The password never reaches a message or a log line: ours are scrubbed, the drivers' filtered.
        self._secrets = hide(url)
        _check_url(url, self._secrets)
        self._url = self.url = url
        self._connect_timeout = connect_timeout
        #: How long a call may wait for the server's answer before its connection is cut (None: for ever).
        self.statement_deadline = _deadline.check_seconds(statement_deadline)
        self._sizes = (min_size, max_size)
        self._q = load_queries(_PACKAGE)
        self._last_used: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()
        self._listeners: weakref.WeakSet[PostgresListener] = weakref.WeakSet()
        self._lock = threading.Lock()
        # When acquires must first make due scheduled jobs ready (see _promotion).
        self._promotions = Promotions()
        # time.monotonic() of the last partition drop skipped for a held archive (see archive_prune), or None.
        self._drop_skipped_at: float | None = None
        self._pool = self._new_pool("conveyor", min_size, max_size, synchronous_commit=True)
        # Outcomes (acquire, finish, retry, release, extend, rescue) commit without waiting for the
        # WAL flush: the flush is the largest cost of a drain on most disks. A server crash can then
        # forget the last few hundred milliseconds of outcomes; those jobs come back as expired
        # leases and run again, which at-least-once allows. Inserts always wait for the flush, so an
        # accepted job is never lost. ``durable_acks=True`` makes outcomes wait too.
        self._durable_acks = durable_acks
        self._acks = (
            self._pool
            if durable_acks
            else self._new_pool("conveyor-acks", min_size, max_size, synchronous_commit=False)
        )

    # ---------------------------------------------------------------------------------------
    # Connections
    # ---------------------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        """psycopg's connection arguments (for the pools and for :meth:`loop_statements`). No startup
        ``options`` of Conveyor's own: PgBouncer refuses a connection that carries them (``unsupported
        startup parameter``), and the URL's own (a ``search_path``) must reach the server as given."""
        return {
            "autocommit": True,
            # libpq wants whole seconds and at least 2.
            "connect_timeout": max(2, int(self._connect_timeout)),
            # A time no datetime holds (infinity, a year before 1) is read as the first or last one.
            "context": _TIMES,
        }

    def _setup(self, synchronous_commit: bool) -> list[str]:
        """The statements every new connection runs first; outcome connections commit asynchronously
        unless ``durable_acks``; under a deadline, the server gives up what a cut connection asked."""
        return [
            self._q["session_setup"],
            *([] if synchronous_commit else [self._q["session_async_commit"]]),
            *([] if self.statement_deadline is None else [self._q["session_client_check"]]),
        ]

    def _new_pool(self, name: str, min_size: int, max_size: int, synchronous_commit: bool) -> _Pool:
        pool = _Pool(
            self._url,
            min_size=min_size,
            max_size=max_size,
            timeout=self._connect_timeout,
            open=False,
            name=name,
            kwargs=self._connect_kwargs(),
            configure=partial(self._configure, self._setup(synchronous_commit)),
            check=self._check,
        )
        pool.open(wait=False)
        return pool

    def _configure(self, setup: Sequence[str], conn: Conn) -> None:
        # The pool's own statements under the deadline too: a connection that cannot answer them is discarded.
        with _deadline.watching(conn.fileno(), self.statement_deadline):
            for statement in setup:
                conn.execute(statement)
        self._last_used[conn] = time.monotonic()

    def _check(self, conn: Conn) -> None:
        idle = time.monotonic() - self._last_used.get(conn, 0.0)
        if idle > _CHECK_IDLE_AFTER or has_input(conn):
            with _deadline.watching(conn.fileno(), self.statement_deadline):
                ConnectionPool.check_connection(conn)

    def _no_answer(self, action: str) -> BackendUnavailable:
        return _deadline.no_answer("PostgreSQL", action, self.statement_deadline)

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate psycopg's exceptions into Conveyor's."""
        try:
            yield
        except PoolClosed as exc:
            # This backend was closed (App.close(), say from a handler): no wait brings it back. As an
            # OperationalError it was retried as "unavailable" for ever, and a worker wedged on it.
            raise BackendError(f"the PostgreSQL backend is closed ({action}): {self._line(exc)}") from exc
        except PoolTimeout as exc:
            why = self._pool.last_error or self._acks.last_error
            raise BackendUnavailable(
                f"PostgreSQL unreachable ({action}): no connection within {self._connect_timeout:g}s"
                + (f" ({scrub(why, self._secrets)})" if why else "")
            ) from exc
        except UnicodeEncodeError as exc:
            # A database whose encoding is not UTF-8 (LATIN1, say) cannot hold every character;
            # psycopg finds out while encoding the statement's parameters, before sending it.
            raise UnstorableText(action, exc) from None
        except psycopg.errors.ProgramLimitExceeded as exc:
            # An OperationalError to psycopg, but no retry can fix it (an index entry too large, too
            # many parameters): reporting it as "unavailable" made callers retry it forever.
            raise BackendError(f"PostgreSQL refused {action}: {self._line(exc)}") from exc
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            # A standby (a failover under way, a URL or DNS name still pointing at the old primary) or
            # default_transaction_read_only: waited out like a lost server, on a new connection each
            # time (the session that said so never writes; see _connection).
            raise BackendUnavailable(
                f"PostgreSQL is read-only ({action}): {self._line(exc)} (a standby, or default_transaction_read_only)"
            ) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            # A role's grant revoked (or never given): every row of a statement is refused alike. As a
            # plain BackendError, the worker split each refused batch of outcomes down to single jobs,
            # failed to dead-letter them too and dropped their results: each of those jobs ran again.
            raise BackendRefused(
                f"PostgreSQL refused a privilege ({action}): {self._line(exc)} (a GRANT missing or revoked)"
            ) from exc
        except psycopg.errors.LockNotAvailable as exc:
            # Past a lock_timeout (a bounded insert's, see jobs_insert_many): a row another transaction holds.
            raise LockWaitTimeout(
                f"PostgreSQL gave up {action}: another transaction holds a row it needs (lock wait past "
                f"lock_timeout); nothing was written: {self._line(exc)}"
            ) from exc
        except psycopg.errors.QueryCanceled as exc:
            # A statement_timeout (or an operator's pg_cancel_backend): retried like a lost server,
            # but not reported as one, and a batch so cancelled is split by its callers.
            raise StatementCancelled(f"PostgreSQL cancelled {action}: {self._line(exc)}") from exc
        except psycopg.OperationalError as exc:
            raise BackendUnavailable(f"PostgreSQL unavailable ({action}): {self._line(exc)}") from exc
        except (psycopg.errors.DataCorrupted, psycopg.errors.IndexCorrupted) as exc:
            raise BackendCorrupt(
                f"PostgreSQL found damaged data ({action}): {self._line(exc)}; an operator must repair it "
                "(REINDEX a corrupt index, restore a damaged table)"
            ) from exc
        except psycopg.errors.UndefinedTable as exc:
            raise BackendError(
                f"the Conveyor schema is missing in this database, or is not on this connection's search_path "
                f"({self._line(exc)}): run `conveyor migrate` with the same URL"
            ) from exc
        except psycopg.Error as exc:
            raise BackendError(f"PostgreSQL failed {action}: {self._line(exc)}") from exc

    def _line(self, exc: BaseException) -> str:
        return scrub(first_line(exc), self._secrets)

    @contextmanager
    def _connection(self, action: str, ack: bool = False, deadline: bool = True) -> Iterator[Conn]:
        """A pooled connection; ``ack`` picks the outcome pool (see ``durable_acks``). The call is cut
        past ``statement_deadline`` unless ``deadline`` is False (maintenance that may take long)."""
        pool = self._acks if ack else self._pool
        with self._errors(action), pool.connection() as conn:
            watch = _deadline.watch(conn.fileno(), self.statement_deadline if deadline else None)
            try:
                yield conn
            except psycopg.OperationalError as exc:
                if _deadline.done(watch):
                    raise self._no_answer(action) from exc
                raise
            except psycopg.errors.ReadOnlySqlTransaction:
                # This session never writes: the pool replaces it (quietly, see _QuietPool), and the
                # idle ones, which may reach the same server, with it.
                _deadline.done(watch)  # before its socket closes: the number may be another's next
                _closed_on_purpose.add(conn)
                conn.close()
                pool.replace_all()
                raise
            finally:
                _deadline.done(watch)
                # Stamped here rather than in a pool ``reset`` hook: with one, psycopg_pool hands
                # every returned connection to its worker thread (a thread wake-up per statement,
                # and the next caller, not finding it back yet, took a colder connection).
                self._last_used[conn] = time.monotonic()

    def _fetchall(self, name: str, params: Mapping[str, Any], ack: bool = False) -> list[TupleRow]:
        with self._connection(name, ack) as conn:
            return conn.execute(self._q[name], params, prepare=True).fetchall()

    def _fetchone(self, name: str, params: Mapping[str, Any], ack: bool = False) -> TupleRow | None:
        with self._connection(name, ack) as conn:
            return conn.execute(self._q[name], params, prepare=True).fetchone()

    def _records(self, name: str, params: Mapping[str, Any], record: type[R], ack: bool = False) -> list[R]:
        """The rows of a statement as ``record`` dataclasses, mapped by column name (a statement's
        select list names its columns as the record's fields, so that adding a field cannot shift
        the others)."""
        with self._connection(name, ack) as conn:
            cur = conn.cursor(row_factory=record_row(record))
            return cur.execute(self._q[name], params, prepare=True).fetchall()

    def forked(self) -> PostgresBackend:
        """The same URL and options, new pools (see :meth:`Backend.forked`)."""
        min_size, max_size = self._sizes
        return PostgresBackend(
            self._url,
            min_size=min_size,
            max_size=max_size,
            connect_timeout=self._connect_timeout,
            durable_acks=self._durable_acks,
            statement_deadline=self.statement_deadline,
        )

    def close(self) -> None:
        """Close the pool and every listener this backend opened."""
        for listener in list(self._listeners):
            listener.close()
        if self._acks is not self._pool:
            self._acks.close()
        self._pool.close()

    # ---------------------------------------------------------------------------------------
    # Schema
    # ---------------------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply pending migrations in one transaction, then make sure archive partitions exist.

        Safe to call from many processes at once: an advisory lock serialises them and the later
        ones find nothing to apply. Returns the names of the migrations applied."""
        applied: list[str] = []
        with self._connection("migrate", deadline=False) as conn, conn.transaction():
            conn.execute(self._q["migrations_lock"])
            conn.execute(self._q["migrations_table"])
            done = [row[0] for row in conn.execute(self._q["migrations_applied"]).fetchall()]
            for migration in pending(done, load_migrations(_PACKAGE)):
                conn.execute(migration.sql)
                conn.execute(self._q["migrations_record"], {"version": migration.version, "name": migration.name})
                applied.append(migration.name)
            elsewhere = [row[0] for row in conn.execute(self._q["migrations_elsewhere"]).fetchall()]
            if elsewhere:
                # Two sets of tables, one picked by the role's name: producers and workers connecting as
                # other roles use the other set, and their jobs meet nobody (see the query).
                log.warning(
                    "Conveyor's tables are in schema %s, named after this role by search_path's \"$user\", and "
                    "schema(s) %s hold another set: processes connecting as other roles use that one; to share "
                    "one set, name it in the URL (options=-csearch_path=...)",
                    conn.info.user,
                    ", ".join(elsewhere),
                )
        self.archive_partitions_ensure(datetime.now(UTC), days_ahead=7)
        return applied

    def archive_partitions_ensure(self, now: datetime, days_ahead: int = 7) -> list[str]:
        """Create the daily archive partitions from the day before ``now`` to ``days_ahead`` after.

        Called by :meth:`migrate` and at the start of every :meth:`archive_prune` (so the pruner
        keeps partitions ahead of the rows that land in them; rows with no partition go to the
        DEFAULT one). Returns the names of the partitions created. Raises BackendUnavailable if
        the archive stays locked for a second (a long transaction reading it); try again later."""
        first_day = (now.astimezone(UTC) - timedelta(days=1)).date()
        rows = self._fetchall("archive_partitions_ensure", {"first_day": first_day, "days": days_ahead + 1})
        return [str(row[0]) for row in rows]

    # ---------------------------------------------------------------------------------------
    # Producer
    # ---------------------------------------------------------------------------------------

    def jobs_insert_many(self, params: JobsInsertParams) -> list[UUID]:
        """Insert jobs and notify their queues: a large batch without idempotency keys by COPY,
        anything else in one statement per 50,000 jobs.

        With ``params.conn`` (an open psycopg ``Connection``) the statements run on it and are not
        committed: the caller's commit or rollback decides, and the notification is delivered
        only on commit."""
        jobs = params.jobs
        if not jobs:
            return []
        conn = params.conn
        if conn is not None and not isinstance(conn, psycopg.Connection):
            raise ConfigurationError(f"conn= must be an open psycopg (sync) Connection, not {_kind(conn)}")
        # Decided on the first job, so that rows built lazily (see App.send_many) are built while
        # they stream; a later keyed or replayed job sends the batch down the statement path.
        by_copy = copyable(jobs[0]) and len(jobs) >= _COPY_MIN
        now = params.now
        with self._errors("jobs_insert_many"):
            if conn is not None:
                if conn.info.transaction_status == TransactionStatus.INERROR:
                    # Any statement would fail the same way; the COPY's savepoint also left psycopg printing
                    # "error ignored in rollback" on stderr beside the error.
                    raise BackendError(
                        "the transaction of the conn= connection has failed (an earlier statement raised): "
                        "roll it back, then send in a new one; nothing was written"
                    )
                if by_copy and not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
                    # Outside a transaction, conn.transaction() in _copy would begin *and commit*
                    # one; start the caller's transaction first so that it becomes a savepoint.
                    conn.execute(self._q["transaction_begin"])
                if by_copy and self._copy(conn, jobs, now, pooled=False):
                    return [j.id for j in jobs]
                return self._insert(psycopg.Cursor(conn, row_factory=tuple_row), jobs, now, params.strict_keys)
        with self._connection("jobs_insert_many") as pooled:
            if by_copy and self._copy(pooled, jobs, now, pooled=True):
                return [j.id for j in jobs]
            # Bounded only where a row another transaction holds can be met (a key, a resent id: a fresh id
            # conflicts with no one), so the unkeyed groups' statement is the same as before.
            wait = params.lock_wait
            bounded = wait is not None and any(j.idempotency_key is not None or not j.fresh for j in jobs)
            multi = len(jobs) > _INSERT_CHUNK
            if wait is not None and bounded and not multi and not params.strict_keys:
                return self._insert_bounded(pooled, jobs, now, wait)
            # A strict send reads the key holders after its insert: both in one transaction, so that
            # a conflict rolls the insert back. A bounded one sets its lock wait in it first.
            with pooled.transaction() if multi or params.strict_keys or bounded else nullcontext():
                if wait is not None and bounded:
                    pooled.execute(self._q["lock_timeout_set"], {"wait": _lock_timeout(wait)})
                return self._insert(pooled.cursor(row_factory=tuple_row), jobs, now, params.strict_keys)

    def _insert_bounded(self, conn: Conn, jobs: Sequence[NewJob], now: datetime, lock_wait: float) -> list[UUID]:
        """The statement path with its waits for a row lock ending after ``lock_wait`` seconds
        (LockWaitTimeout, nothing written): a key or a job id another transaction has written and not
        committed yet. The setting (``lock_timeout`` for this transaction only) and the insert go in one
        pipeline, which the server runs as one implicit transaction ended by the pipeline's Sync: one
        round trip as before, no BEGIN or COMMIT, and a failure rolls back both."""
        self._promotions.scheduled_many(scheduled_earliest(jobs, now))
        cur = conn.cursor(row_factory=tuple_row)
        holders: dict[tuple[str, str], UUID] = {}
        try:
            with conn.pipeline():
                conn.execute(self._q["lock_timeout_set"], {"wait": _lock_timeout(lock_wait)}, prepare=True)
                keyed = self._execute_chunk(cur, jobs, now)
        except BaseException:
            with suppress(psycopg.Error):  # a broken connection: the pool discards it
                conn.rollback()
            raise
        if keyed:
            self._read_holders(cur, holders)
        return [holders[(j.queue, j.idempotency_key)] if j.idempotency_key is not None else j.id for j in jobs]

    def _copy(self, conn: Conn, jobs: Sequence[NewJob], now: datetime, *, pooled: bool) -> bool:
        """COPY ``jobs`` in a transaction and notify their queues: on a ``pooled`` connection
        (autocommit) a transaction of its own, the notifications and the COMMIT sent as one query;
        on the caller's connection a savepoint inside the caller's transaction.

        False, with nothing inserted, if a job id is already live (a producer's resend: the
        statement path then inserts the others and skips it), or if a job has an idempotency key,
        replays one or has an id that is not fresh (those need the statement's key claims or its
        archive probe)."""
        try:
            if not pooled:
                with conn.transaction():
                    self._copy_rows(conn, jobs, now)
                    conn.execute(self._notify(jobs, commit=False), prepare=False)
                return True
            conn.execute(self._q["transaction_open"])
            try:
                self._copy_rows(conn, jobs, now)
                conn.execute(self._notify(jobs, commit=True), prepare=False)
            except BaseException:
                with suppress(psycopg.Error):  # a broken connection: the pool discards it
                    conn.rollback()
                raise
        except (psycopg.errors.UniqueViolation, NotCopyable):
            return False
        return True

    def _copy_rows(self, conn: Conn, jobs: Sequence[NewJob], now: datetime) -> None:
        cur = conn.cursor()
        # Each 32 KiB block psycopg hands over is flushed to the server before the next is
        # built: left to libpq's output buffer (psycopg's default on Linux, up to 1 MiB), the
        # unsent rest is moved to the buffer's front at every partial send, which made
        # building a 1,000-job batch ~2 ms (15 %) slower (docs/benchmarks.md, session 19).
        scheduled: dict[str, datetime] = {}  # per queue, the earliest run_at written as scheduled
        text = len(jobs) < TEXT_MAX
        statement = self._q["jobs_copy_text" if text else "jobs_copy"]
        with cur.copy(statement, writer=LibpqWriter(cur, flush_threshold=0)) as copy:
            if text:
                write_text(copy, jobs, now, scheduled, conn.info.encoding)
            else:
                write_binary(copy, jobs, now, scheduled)
        self._promotions.scheduled_many(scheduled)

    def _notify(self, jobs: Sequence[NewJob], *, commit: bool) -> sql.Composed:
        """One NOTIFY per distinct queue of ``jobs``, then the COMMIT if ``commit``: one query."""
        one = sql.SQL(self._q["jobs_notify_queue"])
        statements: list[sql.Composable] = [one.format(queue=sql.Literal(q)) for q in {j.queue: None for j in jobs}]
        if commit:
            statements.append(sql.SQL(self._q["transaction_commit"]))
        return sql.SQL("; ").join(statements)

    def _insert(
        self, cur: psycopg.Cursor[TupleRow], jobs: Sequence[NewJob], now: datetime, strict_keys: bool = False
    ) -> list[UUID]:
        # The statements write a job whose run_at is ahead as scheduled (see _promotion).
        self._promotions.scheduled_many(scheduled_earliest(jobs, now))
        holders: dict[tuple[str, str], UUID] = {}
        for i in range(0, len(jobs), _INSERT_CHUNK):
            self._insert_chunk(cur, jobs[i : i + _INSERT_CHUNK], now, holders)
        ids = [holders[(job.queue, job.idempotency_key)] if job.idempotency_key is not None else job.id for job in jobs]
        if strict_keys:

            def held(job_id: UUID) -> tuple[str, str] | None:
                row = cur.execute(self._q["idempotency_holder_job"], {"id": job_id}).fetchone()
                return None if row is None else (row[0], row[1])

            refuse_reused_keys(jobs, ids, held)
        return ids

    def _insert_chunk(
        self,
        cur: psycopg.Cursor[TupleRow],
        jobs: Sequence[NewJob],
        now: datetime,
        holders: dict[tuple[str, str], UUID],
    ) -> None:
        if self._execute_chunk(cur, jobs, now):
            self._read_holders(cur, holders)

    def _execute_chunk(self, cur: psycopg.Cursor[TupleRow], jobs: Sequence[NewJob], now: datetime) -> bool:
        """Send the insert of ``jobs``; True if it answers the holders of their keys (_read_holders)."""
        keyed = any(j.idempotency_key is not None for j in jobs)
        if not keyed and len(jobs) == 1:
            j = jobs[0]
            one = {
                "id": j.id, "queue": j.queue, "task": j.task, "payload": j.payload, "headers": j.headers,
                "priority": j.priority, "run_at": j.run_at, "now": now, "expires_at": j.expires_at,
                "max_attempts": j.max_attempts, "max_deliveries": j.max_deliveries,
                "ordering_key": j.ordering_key, "replay_of": j.replay_of,
            }  # fmt: skip
            cur.execute(self._q["jobs_insert_one" if j.fresh else "jobs_insert_one_resent"], one, prepare=True)
            return False
        params: dict[str, Any] = {
            "ids": [j.id for j in jobs],
            "queues": [j.queue for j in jobs],
            "tasks": [j.task for j in jobs],
            "payloads": [j.payload for j in jobs],
            "headers": [j.headers for j in jobs],
            "priorities": [j.priority for j in jobs],
            "run_ats": [j.run_at for j in jobs],
            "expires_ats": [j.expires_at for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "max_deliveries": [j.max_deliveries for j in jobs],
            "ordering_keys": [j.ordering_key for j in jobs],
            "replay_ofs": [j.replay_of for j in jobs],
            "freshes": [j.fresh for j in jobs],
            "now": now,
        }
        if not keyed:
            cur.execute(self._q["jobs_insert_many_unkeyed"], params, prepare=True)
            return False
        params["idempotency_keys"] = [j.idempotency_key for j in jobs]
        params["dedup_untils"] = [j.dedup_until for j in jobs]
        cur.execute(self._q["jobs_insert_many"], params, prepare=True)
        return True

    @staticmethod
    def _read_holders(cur: psycopg.Cursor[TupleRow], holders: dict[tuple[str, str], UUID]) -> None:
        for queue, key, job_id in cur.fetchall():
            if queue is not None:
                holders[(queue, key)] = job_id

    # ---------------------------------------------------------------------------------------
    # Worker
    # ---------------------------------------------------------------------------------------

    def jobs_acquire(self, params: JobsAcquireParams) -> list[Delivery]:
        """Lease up to ``limit`` ready jobs of one queue in one statement (FOR UPDATE SKIP LOCKED),
        after making its due scheduled jobs ready when some may be (see :mod:`conveyor.backends._promotion`)."""
        if params.limit <= 0:
            return []
        with self._connection("jobs_acquire", ack=True) as conn:
            if params.promote and self._promotions.due(params.queue, params.now):
                promote = conn.execute(self._q["jobs_promote"], promote_args(params), prepare=True)
                self._promotions.promoted(params.queue, params.now, promote.fetchone())
            cur = conn.cursor(row_factory=record_row(Delivery))
            return cur.execute(self._q["jobs_acquire"], acquire_args(params), prepare=True).fetchall()

    def jobs_start_many(self, params: JobsStartParams) -> list[UUID]:
        """Count deliveries as started, in one statement; return the ids still held."""
        ids, receipts = self._leases(params.items)
        if not ids:
            return []
        name = "jobs_start_many" if params.wait else "jobs_start_many_skip_locked"
        rows = self._fetchall(name, {"ids": ids, "receipts": receipts, "now": params.now}, ack=True)
        return _held(ids, receipts, rows)

    def jobs_finish_many(self, params: JobsFinishParams) -> int:
        """Archive deliveries in their terminal state in one statement; return how many applied."""
        args = finish_args(params)
        if args is None:
            return 0
        with self._connection("jobs_finish_many", ack=True) as conn:
            return conn.execute(self._q["jobs_finish_many"], args, prepare=True).rowcount

    def jobs_retry_many(self, params: JobsRetryParams) -> int:
        """Return deliveries to pending at their ``run_at`` in one statement; return how many applied."""
        items = [(item, receipt_of(item.receipt)) for item in one_outcome_per_job(params.items)]
        items = [(item, receipt) for item, receipt in items if receipt is not None]
        if not items:
            return 0
        row = self._fetchone(
            "jobs_retry_many",
            {
                "ids": [item.id for item, _ in items],
                "receipts": [receipt for _, receipt in items],
                "run_ats": [item.run_at for item, _ in items],
                "error_types": [item.error.type for item, _ in items],
                "error_messages": [item.error.message for item, _ in items],
                "tracebacks": [item.error.traceback for item, _ in items],
                "counted": [item.counted for item, _ in items],
                "now": params.now,
            },
            ack=True,
        )
        if not row:
            return 0
        # Retries whose backoff is ahead are scheduled: promote their queues when they come due.
        self._promotions.scheduled_many(dict(zip(row[2] or (), row[3] or (), strict=True)))
        return int(row[0])

    def _leases(self, items: Sequence[LeaseRef]) -> tuple[list[UUID], list[UUID]]:
        ids: list[UUID] = []
        receipts: list[UUID] = []
        for item in items:
            receipt = receipt_of(item.receipt)
            if receipt is not None:
                ids.append(item.id)
                receipts.append(receipt)
        return ids, receipts

    def jobs_release_many(self, params: JobsReleaseParams) -> int:
        """Hand leased jobs that never started back to pending now; return how many applied."""
        ids, receipts = self._leases(params.items)
        if not ids:
            return 0
        row = self._fetchone("jobs_release_many", {"ids": ids, "receipts": receipts}, ack=True)
        return int(row[0]) if row else 0

    def leases_extend_many(self, params: LeasesExtendParams) -> list[UUID]:
        """Extend the leases still held; return their ids (a missing id lost its lease; with
        ``wait=False`` a row locked by another transaction is skipped and its id returned)."""
        ids, receipts = self._leases(params.items)
        if not ids:
            return []
        rows = self._fetchall(
            "leases_extend_many" if params.wait else "leases_extend_many_skip_locked",
            {
                "ids": ids,
                "receipts": receipts,
                "visibility_timeout": float(params.visibility_timeout),
                "now": params.now,
            },
            ack=True,
        )
        return _held(ids, receipts, rows)

    def jobs_rescue_expired(self, params: JobsRescueParams) -> int:
        """Return up to ``limit`` expired leases to pending; return how many."""
        row = self._fetchone("jobs_rescue_expired", {"now": params.now, "limit": params.limit}, ack=True)
        return int(row[0]) if row else 0

    # ---------------------------------------------------------------------------------------
    # Reads
    # ---------------------------------------------------------------------------------------

    def job_get(self, params: JobGetParams) -> JobRecord | None:
        """The job, live or archived, or None."""
        rows = self._records("job_get", {"id": params.id}, JobRecord)
        return rows[0] if rows else None

    def jobs_list(self, params: JobsListParams) -> list[JobRecord]:
        """Live jobs ordered by id, after ``after``."""
        return self._records(
            "jobs_list", {"queue": params.queue, "after": params.after, "limit": params.limit}, JobRecord
        )

    def queues_stats(self, params: QueuesStatsParams) -> list[QueueStats]:
        """Counts per queue (every queue with a live or archived row), ordered by name."""
        return self._records("queues_stats", {"now": params.now}, QueueStats)

    def archive_read(self, params: ArchiveReadParams) -> list[JobRecord]:
        """Archived rows after the (finished_at, id) watermark, in that order."""
        after_at, after_id = params.after if params.after is not None else (None, None)
        return self._records(
            "archive_read", {"after_at": after_at, "after_id": after_id, "limit": params.limit}, JobRecord
        )

    # ---------------------------------------------------------------------------------------
    # Dead letters and audit
    # ---------------------------------------------------------------------------------------

    def dead_list(self, params: DeadListParams) -> list[JobRecord]:
        """Unreplayed dead letters, newest first."""
        return self._records(
            "dead_list",
            {
                "queue": params.queue,
                "task": params.task,
                "error_type": params.error_type,
                "limit": params.limit,
                "offset": params.offset,
                "before_at": params.before[0] if params.before else None,
                "before_id": params.before[1] if params.before else None,
            },
            JobRecord,
        )

    def dead_replay_many(self, params: DeadReplayParams) -> list[tuple[UUID, UUID]]:
        """Replay dead letters as new jobs in one transaction; return the pairs replayed, in input order."""
        # A dead letter is replayed at most once, as its first pair says (as on SQLite): the statement
        # would pick any one of its pairs, and the answer would list a pair given twice twice.
        pairs: list[tuple[UUID, UUID]] = []
        seen: set[UUID] = set()
        for dead, new in params.replays:
            if dead not in seen:
                seen.add(dead)
                pairs.append((dead, new))
        rows = self._fetchall(
            "dead_replay_many",
            {
                "dead_ids": [dead for dead, _ in pairs],
                "new_ids": [new for _, new in pairs],
                "actor": params.actor,
                "reason": params.reason,
                "now": params.now,
            },
        )
        done = {(row[0], row[1]) for row in rows if row[0] is not None}
        return [pair for pair in pairs if pair in done]

    def dead_purge_many(self, params: DeadPurgeParams) -> int:
        """Delete dead letters for good (one audit row); return how many were deleted."""
        row = self._fetchone(
            "dead_purge_many",
            {"ids": list(params.ids), "actor": params.actor, "reason": params.reason, "now": params.now},
        )
        return int(row[0]) if row else 0

    def audit_insert(self, params: AuditInsertParams) -> None:
        """Record one operator action."""
        with self._connection("audit_insert") as conn:
            conn.execute(
                self._q["audit_insert"],
                {
                    "now": params.now,
                    "actor": params.actor,
                    "action": params.action,
                    "reason": params.reason,
                    "job_ids": list(params.job_ids),
                    "details": params.details,
                },
            )

    def audit_list(self, params: AuditListParams) -> list[AuditEntry]:
        """Operator actions, newest first."""
        rows = self._fetchall("audit_list", {"limit": params.limit, "job_id": params.job_id})
        return [
            AuditEntry(
                id=row[0],
                at=row[1],
                actor=row[2],
                action=row[3],
                reason=row[4],
                job_ids=tuple(row[5]),
                details=row[6],
            )
            for row in rows
        ]

    # ---------------------------------------------------------------------------------------
    # Notifications
    # ---------------------------------------------------------------------------------------

    def listen(self, queues: Sequence[str]) -> PostgresListener:
        """A listener on its own connection, woken by inserts into any of ``queues``.

        Does not raise if the server is down: the listener connects on a later wait."""
        listener = PostgresListener(
            self._url,
            queues,
            self._q["listen"],
            connect_timeout=max(2, int(self._connect_timeout)),
            statement_deadline=self.statement_deadline,
        )
        self._listeners.add(listener)
        return listener

    def jobs_next_due(self, queues: Sequence[str]) -> datetime | None:
        """The earliest scheduled job of ``queues`` known to come due (see :mod:`conveyor.backends._promotion`)."""
        return self._promotions.next_due(queues)

    def loop_statements(self) -> PostgresLoopStatements:
        """Acquire and finish as coroutines for one worker run (see :class:`PostgresLoopStatements`)."""
        # With psycopg's own loaders: the clamping one of _times costs ~0.6 µs a time in Python, four a job on the
        # drain's path; the acquire clamps its times in the statement instead.
        plain = {k: v for k, v in self._connect_kwargs().items() if k != "context"}
        return PostgresLoopStatements(
            self._url,
            plain,
            self._setup(synchronous_commit=self._durable_acks),
            self._q,
            self._errors,
            self._promotions,
            self.statement_deadline,
        )

    # ---------------------------------------------------------------------------------------
    # Delivery features: processed keys, schedules, topics, backpressure, retention
    # ---------------------------------------------------------------------------------------

    def processed_keys_claim(self, params: ProcessedKeyClaimParams) -> bool:
        """Claim a side effect's key; True if claimed now, False if an unexpired claim exists.

        With ``params.conn`` (an open psycopg ``Connection``) the claim joins the caller's
        transaction and is not committed here. A concurrent claim of the same key waits for the
        caller's transaction to end."""
        values = {"key": params.key, "expires_at": params.expires_at, "now": params.now}
        if params.conn is not None:
            conn = params.conn
            if not isinstance(conn, psycopg.Connection):
                raise ConfigurationError(f"conn= must be an open psycopg (sync) Connection, not {_kind(conn)}")
            with self._errors("processed_keys_claim"):
                cur = psycopg.Cursor(conn, row_factory=tuple_row)
                return cur.execute(self._q["processed_keys_claim"], values, prepare=True).fetchone() is not None
        return self._fetchone("processed_keys_claim", values) is not None

    def keys_prune(self, params: KeysPruneParams) -> int:
        """Delete up to ``limit`` expired idempotency and processed keys; return how many."""
        row = self._fetchone("keys_prune", {"now": params.now, "limit": params.limit})
        return int(row[0]) if row else 0

    def schedules_upsert(self, params: SchedulesUpsertParams) -> None:
        """Create or update schedules (an existing one keeps its pause state and, unless its cron
        changed, its next tick). The last of several schedules with one name wins."""
        by_name = {s.name: s for s in params.schedules}
        if not by_name:
            return
        items = list(by_name.values())
        with self._connection("schedules_upsert") as conn:
            conn.execute(
                self._q["schedules_upsert"],
                {
                    "names": [s.name for s in items],
                    "crons": [s.cron for s in items],
                    "tasks": [s.task for s in items],
                    "queues": [s.queue for s in items],
                    "payloads": [s.payload for s in items],
                    "next_run_ats": [s.next_run_at for s in items],
                    "pauseds": [s.paused for s in items],
                    "priorities": [s.priority for s in items],
                    "last_run_ats": [s.last_run_at for s in items],
                },
            )

    def schedules_list(self) -> list[Schedule]:
        """Every schedule, by name."""
        return self._records("schedules_list", {}, Schedule)

    def schedules_update(self, params: SchedulesUpdateParams) -> bool:
        """Pause, resume or re-time one schedule; False if it does not exist."""
        with self._connection("schedules_update") as conn:
            cur = conn.execute(
                self._q["schedules_update"],
                {
                    "name": params.name,
                    "paused": params.paused,
                    "cron": params.cron,
                    "next_run_at": params.next_run_at,
                },
            )
            return cur.rowcount > 0

    def schedules_delete(self, params: SchedulesDeleteParams) -> bool:
        """Delete one schedule; False if it did not exist."""
        with self._connection("schedules_delete") as conn:
            return conn.execute(self._q["schedules_delete"], {"name": params.name}).rowcount > 0

    def schedule_fire(self, params: ScheduleFireParams) -> bool:
        """Fire one tick and insert its job, in one statement; True if this call fired it.

        The job is inserted as given; its idempotency key (if any) is not checked against the
        dedup window, because the tick itself already fires once."""
        job = params.job
        row = self._fetchone(
            "schedule_fire",
            {
                "name": params.name,
                "due_at": params.due_at,
                "next_run_at": params.next_run_at_after,
                "last_run_at": params.last_run_at,
                "id": job.id,
                "queue": job.queue,
                "task": job.task,
                "payload": job.payload,
                "headers": job.headers,
                "priority": job.priority,
                "run_at": job.run_at,
                "expires_at": job.expires_at,
                "max_attempts": job.max_attempts,
                "max_deliveries": job.max_deliveries,
                "idempotency_key": job.idempotency_key,
                "ordering_key": job.ordering_key,
                "replay_of": job.replay_of,
                "now": params.now,
                **params.read_args(),
            },
        )
        return bool(row and row[0])

    def schedule_move(self, params: ScheduleMoveParams) -> bool:
        """Move a stored next tick back, firing nothing (see ScheduleMoveParams)."""
        with self._connection("schedule_move") as conn:
            args = {
                "name": params.name,
                "due_at": params.due_at,
                "next_run_at": params.next_run_at,
                **params.read_args(),
            }
            return conn.execute(self._q["schedule_move"], args, prepare=True).rowcount == 1

    def subscriptions_upsert(self, params: SubscriptionsUpsertParams) -> None:
        """Create subscriptions or replace the task and filter of existing (topic, queue) pairs."""
        by_key = {(s.topic, s.queue): s for s in params.subscriptions}
        if not by_key:
            return
        items = list(by_key.values())
        with self._connection("subscriptions_upsert") as conn:
            conn.execute(
                self._q["subscriptions_upsert"],
                {
                    "topics": [s.topic for s in items],
                    "queues": [s.queue for s in items],
                    "tasks": [s.task for s in items],
                    "filters": [s.filter for s in items],
                },
            )

    def subscriptions_list(self, params: SubscriptionsListParams) -> list[Subscription]:
        """Subscriptions (of one topic, or all), ordered by topic then queue."""
        return self._records("subscriptions_list", {"topic": params.topic}, Subscription)

    def subscriptions_delete(self, params: SubscriptionsDeleteParams) -> bool:
        """Delete one subscription; False if it did not exist."""
        with self._connection("subscriptions_delete") as conn:
            cur = conn.execute(self._q["subscriptions_delete"], {"topic": params.topic, "queue": params.queue})
            return cur.rowcount > 0

    def queue_load(self, params: QueueLoadParams) -> QueueLoad:
        """A queue's live depth and how many of its jobs ended in ``[now - window, now]``."""
        row = self._fetchone(
            "queue_load",
            {
                "queue": params.queue,
                "since": params.now - timedelta(seconds=params.window),
                "now": params.now,
            },
        )
        depth, drained = (int(row[0]), int(row[1])) if row else (0, 0)
        held: frozenset[str] = frozenset()
        if params.keys:
            keys = {"queue": params.queue, "keys": list(params.keys), "now": params.now}
            rows = self._fetchall("queue_keys_held", keys)
            held = frozenset(r[0] for r in rows)
        return QueueLoad(queue=params.queue, depth=depth, drained=drained, window=params.window, held=held)

    def archive_prune(self, params: ArchivePruneParams) -> int:
        """Delete archived rows past retention; return how many (call again until 0).

        Daily partitions that hold only rows past retention are dropped whole (their rows count,
        so one call may return more than ``limit``); then up to ``limit`` rows are deleted one by
        one from what is left (the DEFAULT partition, partitions that still hold rows to keep, and
        partitions whose drop was skipped). A drop that waits past its lock timeout (another
        transaction holds the archive: an operator's session, a long report) is skipped, with one
        warning, and no drop is tried for ``DROP_RETRY_AFTER`` seconds; the row deletes skip rows other transactions
        hold locked. So the count is of rows gone, never of work left undone: a caller pruning
        "until 0" gets 0 once nothing it can reach is past retention, held or not."""
        queues = sorted(set(params.before) | set(params.dead_before))
        cutoffs = {
            "queues": queues,
            "befores": [params.before.get(q) for q in queues],
            "dead_befores": [params.dead_before.get(q) for q in queues],
            "default_before": params.default_before,
            "default_dead_before": params.default_dead_before,
        }
        every = [params.default_before, params.default_dead_before, *params.before.values()]
        every += params.dead_before.values()
        # If a long reader holds the archive, creating partitions ahead can wait for the next run
        # (rows meanwhile land in the DEFAULT partition); retention need not wait for it.
        with suppress(BackendUnavailable):
            self.archive_partitions_ensure(params.now)
        deleted = 0
        skipped_at = self._drop_skipped_at
        drops = skipped_at is None or time.monotonic() - skipped_at >= DROP_RETRY_AFTER
        with self._connection("archive_prune") as conn:
            old = conn.execute(self._q["archive_partitions_old"], {"before": max(every)}).fetchall() if drops else []
            if drops:
                self._drop_skipped_at = None  # set again below if a drop is skipped
            for i, (part, lo, hi) in enumerate(old):
                # Below every cutoff nothing can be kept; otherwise look for a row to keep.
                if hi > min(every):
                    keeps = conn.execute(self._q["archive_range_keeps"], {**cutoffs, "lo": lo, "hi": hi}).fetchone()
                    if keeps is None or keeps[0]:
                        continue
                try:
                    # Each drop is a transaction of its own (the connection is in autocommit).
                    dropped = conn.execute(self._q["archive_partition_drop"], {"part": part}).fetchone()
                except psycopg.errors.LockNotAvailable:
                    # A drop locks the whole archive, so what held this one (any open transaction that
                    # read or locked a row through the archive) holds the later ones too: they are left
                    # for the next call rather than each waiting out its second. The rows past retention
                    # go row by row below meanwhile, so retention does not wait for the holder.
                    self._drop_skipped_at = time.monotonic()
                    log.warning(
                        "archive partition %s not dropped: another transaction holds the archive (lock wait "
                        "past 1 s); it and %d later candidate(s) are tried again in %gs, their rows past "
                        "retention deleted row by row meanwhile",
                        part,
                        len(old) - i - 1,
                        DROP_RETRY_AFTER,
                    )
                    break
                deleted += int(dropped[0]) if dropped else 0
            if deleted < params.limit:
                cur = conn.execute(
                    self._q["archive_prune_rows"],
                    {**cutoffs, "max_cutoff": max(every), "limit": params.limit - deleted},
                )
                deleted += cur.rowcount
        return deleted

    # ---------------------------------------------------------------------------------------
    # Schema and API tokens
    # ---------------------------------------------------------------------------------------

    def database_now(self) -> datetime | None:
        """The database server's clock."""
        row = self._fetchone("database_now", {})
        return row[0] if row is not None else None

    def migrations_pending(self) -> list[str]:
        """The names of the migrations not yet applied to this database."""
        with self._connection("migrations_pending") as conn:
            ledger = conn.execute(self._q["migrations_ledger_exists"]).fetchone()
            rows = conn.execute(self._q["migrations_applied"]).fetchall() if ledger and ledger[0] else []
        done = {row[0] for row in rows}
        return [m.name for m in load_migrations(_PACKAGE) if m.version not in done]

    def tokens_insert(self, params: TokensInsertParams) -> bool:
        """Store a token; False, with nothing written, if its name or id is taken."""
        t = params.token
        row = self._fetchone(
            "tokens_insert",
            {
                "id": t.id,
                "name": t.name,
                "role": t.role,
                "queues": None if t.queues is None else list(t.queues),
                "secret_hash": t.secret_hash,
                "created_at": t.created_at,
                "expires_at": t.expires_at,
            },
        )
        return row is not None

    def token_get(self, params: TokenGetParams) -> Token | None:
        """The token with this public id, or None."""
        row = self._fetchone("token_get", {"id": params.id})
        return None if row is None else _token(row)

    def tokens_list(self) -> list[Token]:
        """Every token, by name."""
        return [_token(row) for row in self._fetchall("tokens_list", {})]

    def tokens_revoke(self, params: TokensRevokeParams) -> bool:
        """Revoke the unrevoked token named ``name``; False if there is none."""
        with self._connection("tokens_revoke") as conn:
            return conn.execute(self._q["tokens_revoke"], {"name": params.name, "now": params.now}).rowcount > 0

    # ---------------------------------------------------------------------------------------
    # Observability
    # ---------------------------------------------------------------------------------------

    def task_totals(self, params: TaskTotalsParams) -> list[TaskTotals]:
        """Terminal totals per (queue, task), summed over the counter stripes."""
        return self._records("task_totals", {"queue": params.queue}, TaskTotals)

    def database_health(self, params: DatabaseHealthParams) -> DatabaseHealth:
        """The oldest open transaction's age and the jobs table's dead tuples."""
        (found,) = self._records("database_health", {"now": params.now}, DatabaseHealth)
        return found

    def workers_beat(self, params: WorkersBeatParams) -> None:
        """Insert or refresh one worker's row."""
        w = params.worker
        with self._connection("workers_beat") as conn:
            conn.execute(
                self._q["workers_beat"],
                {
                    "id": w.id,
                    "host": w.host,
                    "pid": w.pid,
                    "queues": list(w.queues),
                    "concurrency": w.concurrency,
                    "started_at": w.started_at,
                    "now": params.now,
                },
                prepare=True,
            )

    def workers_remove(self, params: WorkersRemoveParams) -> bool:
        """Delete one worker's row; False if there was none."""
        with self._connection("workers_remove") as conn:
            return conn.execute(self._q["workers_remove"], {"id": params.id}).rowcount > 0

    def workers_list(self, params: WorkersListParams) -> list[WorkerInfo]:
        """Workers seen since ``seen_after``, each with its in-flight job ids."""
        rows = self._fetchall("workers_list", {"seen_after": params.seen_after})
        return [
            WorkerInfo(id_, host, pid, tuple(queues), concurrency, started_at, last_seen, tuple(in_flight))
            for id_, host, pid, queues, concurrency, started_at, last_seen, in_flight in rows
        ]

    def jobs_vacuum(self) -> None:
        """``VACUUM`` the jobs table (see :meth:`Backend.jobs_vacuum`) for 10 s at most (raises
        BackendUnavailable past that); a role that does not own the table gets PostgreSQL's warning
        and nothing is done."""
        with self._connection("jobs_vacuum", deadline=False) as conn:
            conn.execute(self._q["jobs_vacuum_bound"], prepare=False)
            try:
                conn.execute(self._q["jobs_vacuum"], prepare=False)
            finally:
                conn.execute(self._q["jobs_vacuum_unbound"], prepare=False)

    def workers_prune(self, params: WorkersPruneParams) -> int:
        """Delete workers not seen since ``before``."""
        with self._connection("workers_prune") as conn:
            return conn.execute(self._q["workers_prune"], {"before": params.before}).rowcount

    def alerts_list(self) -> list[AlertState]:
        """Every stored alert, by rule and queue."""
        return [
            AlertState(rule, queue or None, state, since, value, threshold, message)
            for rule, queue, state, since, value, threshold, message in self._fetchall("alerts_list", {})
        ]

    def alerts_set(self, params: AlertsSetParams) -> list[AlertState]:
        """Write an evaluation in one transaction; return the alerts whose state it changed."""
        changed: list[AlertState] = []
        with self._connection("alerts_set") as conn:
            for item in params.items:
                args = {
                    "rule": item.rule,
                    "queue": item.queue or "",
                    "state": item.state,
                    "since": item.since,
                    "value": item.value,
                    "threshold": item.threshold,
                    "message": item.message,
                    "now": params.now,
                }
                if conn.execute(self._q["alerts_change"], args).fetchone() is not None or (
                    item.state == "firing" and conn.execute(self._q["alerts_fire_new"], args).fetchone() is not None
                ):
                    changed.append(item)
                else:
                    conn.execute(self._q["alerts_refresh"], args)
        return changed


def _token(row: TupleRow) -> Token:
    id_, name, role, queues, secret_hash, created_at, expires_at, revoked_at = row
    return Token(
        id_, name, role, None if queues is None else tuple(queues), secret_hash, created_at, expires_at, revoked_at
    )


def _kind(value: object) -> str:
    """A value's type with its module: a sqlite3.Connection is not just "Connection"."""
    return f"{type(value).__module__}.{type(value).__qualname__}"
