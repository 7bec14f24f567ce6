"""Connections to one MySQL or MariaDB database: opening with the right session, pooling,
transactions that retry a deadlock, errors mapped to Conveyor's, and the migrations.

Every session runs at READ COMMITTED in strict mode: a locking read sees the latest committed row
(what ``SELECT ... FOR UPDATE SKIP LOCKED`` needs to hand a row out once), InnoDB takes no gap locks
that would make producers wait for each other, and a value a column cannot hold is an error rather
than a warning and a truncated row. ``CLIENT.FOUND_ROWS`` makes an update's row count the rows it
matched, not those it changed: a compare-and-set that writes the value already stored still counts.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT

from conveyor._errors import (
    BackendError,
    BackendRefused,
    BackendUnavailable,
    ConveyorError,
    LockWaitTimeout,
    StatementCancelled,
    UnstorableText,
    first_line,
)
from conveyor.backends import _deadline
from conveyor.backends._sql import load_migrations, pending
from conveyor.backends.mysql._url import ConnectArgs

_T = TypeVar("_T")

_TOO_LARGE = 1153  # ER_NET_PACKET_TOO_LARGE

#: The server's ``max_allowed_packet`` as each connection read it (a caller's own connection: on first use).
_PACKET_LIMITS: weakref.WeakKeyDictionary[pymysql.connections.Connection[Any], int] = weakref.WeakKeyDictionary()


class StatementTooLong(pymysql.err.OperationalError):
    """A statement :class:`Cursor` refused before sending it: longer than the server's ``max_allowed_packet``
    (``limit``, in bytes)."""

    def __init__(self, code: int, message: str, limit: int) -> None:
        super().__init__(code, message)
        self.limit = limit


class Cursor(pymysql.cursors.DictCursor):
    """Rows as dicts; a statement longer than the server's ``max_allowed_packet`` is refused before it is
    sent. The server would read part of it and close the connection, which looks like a server that went
    away (BackendUnavailable), and the same statement would be retried, forever: a worker's batch of
    large outcomes, never written. Refused here, it is the statement that fails (error 1153, as the
    server names it; BackendError), and a batch is split until its parts fit."""

    def execute(self, query: str, args: Any = None) -> int:
        if args is not None:
            query = self.mogrify(query, args)
        limit = _packet_limit(self.connection)
        # The statement goes as one command byte and the text; a character is at most 4 bytes of UTF-8.
        if 1 + 4 * len(query) > limit:
            size = 1 + len(query.encode("utf-8", "surrogateescape") if isinstance(query, str) else query)
            if size > limit:
                raise StatementTooLong(
                    _TOO_LARGE,
                    f"a statement of {size} bytes is over the server's max_allowed_packet ({limit} bytes): "
                    "a value is too large for this server",
                    limit=limit,
                )
        return super().execute(query)

    def executemany(self, query: str, args: Any) -> int | None:
        # PyMySQL folds an INSERT's rows into statements of up to ``max_stmt_length`` bytes (1,024,000):
        # under a server whose max_allowed_packet is smaller, a batch of small jobs made one statement
        # too long for it, and the whole batch was refused as holding a value too large for the server.
        # An instance attribute shadowing PyMySQL's class default, which its stubs declare a ClassVar.
        self.max_stmt_length = min(  # type: ignore[misc]
            pymysql.cursors.Cursor.max_stmt_length, _packet_limit(self.connection) - 1
        )
        return super().executemany(query, args)


def _packet_limit(conn: pymysql.connections.Connection[Any]) -> int:
    limit = _PACKET_LIMITS.get(conn)
    if limit is None:
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute("SELECT @@max_allowed_packet")
            row = cur.fetchone()
        limit = _PACKET_LIMITS[conn] = int(row[0]) if row else 1 << 30  # the protocol's own maximum
    return limit


if TYPE_CHECKING:
    Connection = pymysql.connections.Connection[Cursor]
else:
    Connection = pymysql.connections.Connection

#: How long opening a connection may take before the database counts as unreachable.
CONNECT_TIMEOUT_S = 10
#: How long a statement waits for a row another transaction holds (InnoDB's default is 50 s).
LOCK_WAIT_TIMEOUT_S = 30
#: How often a transaction InnoDB chose as a deadlock's victim is run again before the caller hears of it.
DEADLOCK_RETRIES = 5
#: How long a pooled connection may have been idle before it is pinged when borrowed (seconds). The server
#: may have closed it meanwhile (a restart, ``wait_timeout``, ``KILL``), and the first statement on it would
#: fail: a producer's send, after an idle night, told that the database was unavailable.
CHECK_IDLE_AFTER_S = 1.0

_SESSION = (
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'",
    f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_S}",
    "SET SESSION time_zone = '+00:00'",
)

# Server error codes. Deadlock and lock wait: the transaction was rolled back (or its statement), and
# the same work run again will pass. The rest: the server or the connection is gone for now.
_DEADLOCK = 1213
_LOCK_WAIT = 1205
_GONE = {1040, 1053, 1927, 2002, 2003, 2006, 2013, 2055, 1290, 1836}
# Refused at login (a wrong password or user, an unknown database): as on PostgreSQL, where the same
# failures are a connection that cannot be made, waited out by workers (a password being rotated, a
# database being restored) and one line from the CLI.
_LOGIN = {1044, 1045, 1049, 1698}
_DENIED = {1044, 1142, 1143, 1227, 1370}
_DUPLICATE = 1062
# The server out of a resource: a full disk or tablespace (1114 "The table is full", 1021, 3 "Error writing file",
# 1030 a storage engine's error such as errno 28), memory (1037, 1038, 1041), threads (1135). As PostgreSQL's class 53
# and SQLite's "database or disk is full": waited out, never the items' fault. Read as a refusal of the statement's
# items, a worker split its batch of outcomes and dead-lettered jobs whose results were refused while a small
# dead-letter row still fitted.
_RESOURCES = {3, 1021, 1030, 1037, 1038, 1041, 1114, 1135}
# A statement the server interrupted: an operator's KILL QUERY, MariaDB's max_statement_time, MySQL's
# max_execution_time. Nothing is wrong with the statement's items nor with the server.
_CANCELLED = {1317, 1969, 3024}


def is_duplicate(exc: BaseException) -> bool:
    """Whether ``exc`` is a duplicate-key error (a row with that unique key exists)."""
    return isinstance(exc, pymysql.err.IntegrityError) and bool(exc.args) and exc.args[0] == _DUPLICATE


def _code(exc: BaseException) -> int | None:
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


def translate(exc: BaseException, action: str, callers: bool = False) -> BackendError:
    """Map a PyMySQL error to Conveyor's exception tree (raise the result ``from exc``). ``callers``: the
    statement ran on a caller's own connection (``conn=``), whose session settings are the caller's."""
    code = _code(exc)
    line = first_line(exc)
    if code in _CANCELLED:
        # Raised as BackendError it was the items' fault: a worker whose acquire was killed stopped, and
        # a finish batch past max_statement_time was split down to outcomes dead-lettered as refused.
        return StatementCancelled(f"MySQL cancelled {action}: {line}")
    if code == _LOCK_WAIT:
        # Another transaction (an operator's session, an application's open transaction) held a row this
        # call must change: InnoDB rolled the statement back and the pool the transaction, so nothing of
        # the call was written, and it passes once that transaction ends.
        # A caller's connection waits as long as its own innodb_lock_wait_timeout says, not Conveyor's.
        waited = (
            "its connection's innodb_lock_wait_timeout"
            if callers
            else f"its lock wait (at most {LOCK_WAIT_TIMEOUT_S} s)"
        )
        return LockWaitTimeout(
            f"MySQL unavailable ({action}): another transaction held a row it needs for more than "
            f"{waited}; nothing was written, retry once it ends ({line})"
        )
    if code == _DEADLOCK or code in _GONE or code in _LOGIN or isinstance(exc, pymysql.err.InterfaceError):
        return BackendUnavailable(f"MySQL unavailable ({action}): {line}")
    if code in _RESOURCES:
        return BackendUnavailable(f"MySQL unavailable ({action}): out of a resource (disk, memory): {line}")
    if code in _DENIED:
        return BackendRefused(f"MySQL refused a privilege ({action}): {line} (a GRANT missing or revoked)")
    if code == 1146:
        return BackendError(
            f"the Conveyor schema is missing in this database ({line}): run `conveyor migrate` with the same URL"
        )
    if isinstance(exc, pymysql.err.OperationalError) and code is not None and code >= 2000:
        return BackendUnavailable(f"MySQL unavailable ({action}): {line}")
    return BackendError(f"MySQL failed {action}: {line}")


@contextmanager
def translated(action: str, callers: bool = False) -> Iterator[None]:
    """Re-raise PyMySQL's errors inside the block as Conveyor's, and text that cannot be encoded as
    UTF-8 (a lone surrogate: a name read from non-UTF-8 bytes) as UnstorableText. ``callers``: as for
    :func:`translate`."""
    try:
        yield
    except pymysql.err.MySQLError as exc:
        raise translate(exc, action, callers) from exc
    except UnicodeEncodeError as exc:
        raise UnstorableText(f"MySQL ({action})", exc) from None


def _fd(conn: Connection) -> int:
    """The socket of ``conn`` (-1: none, closed)."""
    sock = getattr(conn, "_sock", None)
    return sock.fileno() if sock is not None else -1


def _answers(conn: Connection, deadline: float | None) -> bool:
    """Whether the server still answers on ``conn`` (a ping, no reconnect: a new session would lack the
    session settings), within ``deadline`` seconds."""
    watch = _deadline.watch(_fd(conn), deadline)
    try:
        conn.ping(reconnect=False)
    except Exception:
        _deadline.done(watch)
        return False
    # A ping answered just before its deadline may still have its connection cut before this stops watching.
    return not _deadline.done(watch)


def _reusable(exc: BaseException) -> bool:
    """Whether a connection whose transaction failed with ``exc`` can be rolled back and used again: the
    server refused a statement (or a value could not be encoded before it was sent). After a lost
    connection, a client-side error or an interrupt in the middle of a statement, its protocol state is
    unknown, and it is closed."""
    cause = exc.__cause__ if isinstance(exc, ConveyorError) else exc
    if isinstance(exc, ConveyorError) and not isinstance(cause, pymysql.err.MySQLError):
        return True  # raised by Conveyor between statements, or a value refused before it was sent
    if not isinstance(cause, pymysql.err.MySQLError) or isinstance(cause, pymysql.err.InterfaceError):
        return False
    code = _code(cause)
    return code is not None and code < 2000 and code not in _GONE


class Pool:
    """Connections to one database, shared by threads: each transaction borrows one and gives it back."""

    def __init__(self, kwargs: ConnectArgs, max_idle: int = 8, statement_deadline: float | None = None) -> None:
        self._kwargs = kwargs
        self._max_idle = max_idle
        #: How long a transaction may wait for the server's answers before its connection is cut (see
        #: conveyor.backends._deadline; None: for ever).
        self.statement_deadline = statement_deadline
        # Idle connections with the time each was given back (time.monotonic()).
        self._idle: list[tuple[Connection, float]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.flavour: str | None = None

    def open(self) -> Connection:
        """A new connection with Conveyor's session settings (autocommit off)."""
        kwargs = ConnectArgs(**self._kwargs)
        kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        conn: Connection = pymysql.connect(
            **kwargs, charset="utf8mb4", autocommit=False, client_flag=CLIENT.FOUND_ROWS, cursorclass=Cursor
        )
        watch = _deadline.watch(_fd(conn), self.statement_deadline)
        try:
            with conn.cursor(Cursor) as cur:
                for statement in _SESSION:
                    cur.execute(statement)
                if self.flavour is None:
                    cur.execute("SELECT version() AS v")
                    row = cur.fetchone()
                    self.flavour = "mariadb" if row and "mariadb" in str(row["v"]).lower() else "mysql"
                if self.flavour == "mariadb":
                    # MariaDB rewrites an IN list of 1,000 values or more into a subquery over a VALUES table,
                    # and the batch statements that name their rows by primary key then scanned the table
                    # whole, locking every row (a held row stalled a prune of 1,000). MySQL has no such rewrite.
                    cur.execute("SET SESSION in_predicate_conversion_threshold = 0")
            conn.commit()
        except BaseException as exc:
            cut = _deadline.done(watch)
            conn.close()
            if cut:
                raise self.no_answer("connect") from exc
            raise
        if _deadline.done(watch):
            # Answered, but cut before this stopped watching: the connection is dead.
            conn.close()
            raise self.no_answer("connect")
        return conn

    def no_answer(self, action: str) -> BackendUnavailable:
        """What a call whose connection the deadline cut raises."""
        return _deadline.no_answer("MySQL", action, self.statement_deadline)

    def _borrow(self, action: str) -> Connection:
        while True:
            with self._lock:
                if self._closed:
                    raise BackendError(f"the MySQL backend is closed ({action})")
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if time.monotonic() - since <= CHECK_IDLE_AFTER_S or _answers(conn, self.statement_deadline):
                return conn
            with suppress(Exception):
                conn.close()
        with translated(action):
            return self.open()

    def _give_back(self, conn: Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle and conn.open:
                self._idle.append((conn, time.monotonic()))
                return
        with suppress(Exception):
            conn.close()

    def write(self, action: str, work: Callable[[Cursor], _T], lock_wait: int | None = None) -> _T:
        """Run ``work`` in one transaction and commit it; a deadlock's victim is run again from the
        start (its transaction was rolled back whole), so ``work`` must have no effect outside it.
        ``lock_wait``: the transaction's innodb_lock_wait_timeout (whole seconds; MariaDB takes 0, no
        wait, MySQL makes it 1) instead of the session's LOCK_WAIT_TIMEOUT_S."""
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                return self._transaction(action, work, read_only=False, lock_wait=lock_wait)
            except BackendUnavailable as exc:
                if _code(exc.__cause__ or exc) != _DEADLOCK or attempt == DEADLOCK_RETRIES:
                    raise
                time.sleep(0.005 * (attempt + 1))
        raise AssertionError("unreachable")

    def read(self, action: str, work: Callable[[Cursor], _T]) -> _T:
        """Run ``work`` in a read-only transaction on one snapshot (REPEATABLE READ for this one)."""
        return self._transaction(action, work, read_only=True)

    def _transaction(
        self, action: str, work: Callable[[Cursor], _T], read_only: bool, lock_wait: int | None = None
    ) -> _T:
        conn = self._borrow(action)
        watch = _deadline.watch(_fd(conn), self.statement_deadline)
        try:
            with translated(action), conn.cursor(Cursor) as cur:
                if lock_wait is not None:
                    cur.execute("SET SESSION innodb_lock_wait_timeout = %s", (lock_wait,))
                if read_only:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                else:
                    cur.execute("START TRANSACTION")
                result = work(cur)
                conn.commit()
        except BaseException as exc:
            if _deadline.done(watch):
                with suppress(Exception):
                    conn.close()
                raise self.no_answer(action) from exc
            if lock_wait is None:
                self._after_failure(conn, exc)
            elif not _reusable(exc):
                with suppress(Exception):
                    conn.close()
            elif self._restore_lock_wait(conn, rollback=True):  # a refused key (409) keeps its connection
                self._give_back(conn)
            raise
        # The write committed: a failure to restore the session's lock wait only costs the connection.
        restored = lock_wait is None or self._restore_lock_wait(conn, rollback=False)
        if _deadline.done(watch):
            # The deadline fell between the last answer and here: the call has its result, but its connection
            # was cut, and given back it would fail the next call (one given back within CHECK_IDLE_AFTER_S is
            # not pinged).
            with suppress(Exception):
                conn.close()
        elif restored:
            self._give_back(conn)
        return result

    def _restore_lock_wait(self, conn: Connection, rollback: bool) -> bool:
        """Give ``conn``'s session the pool's lock wait again (after rolling its transaction back); on failure
        close it (a session whose lock wait is not the pool's is never given back) and say False."""
        try:
            if rollback:
                conn.rollback()
            with conn.cursor(Cursor) as cur:
                cur.execute(f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_S}")
        except Exception:
            with suppress(Exception):
                conn.close()
            return False
        return True

    def _after_failure(self, conn: Connection, exc: BaseException) -> None:
        """Roll a failed transaction back and keep its connection, or close it (see :func:`_reusable`)."""
        if _reusable(exc):
            try:
                conn.rollback()
            except Exception:
                pass
            else:
                self._give_back(conn)
                return
        with suppress(Exception):
            conn.close()

    def close(self) -> None:
        """Close idle connections now and borrowed ones when they are given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            with suppress(Exception):
                conn.close()


def statements(script: str) -> list[str]:
    """A migration script's statements: whole-line comments dropped, split at a ';' ending a line."""
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in code.split(";\n") if s.strip().rstrip(";").strip()]


def migrate(pool: Pool, queries: dict[str, str], package: str) -> list[str]:
    """Apply every migration not yet recorded in ``schema_migrations``; return their names.

    MySQL commits each DDL statement on its own, so the migrations cannot share one transaction with
    their check: a named server lock (``GET_LOCK``) makes concurrent callers apply them one at a time,
    a second finding the versions already recorded."""
    migrations = load_migrations(package)
    applied: list[str] = []
    conn = pool._borrow("migrate")
    try:
        with translated("migrate"), conn.cursor(Cursor) as cur:
            cur.execute("SELECT GET_LOCK(CONCAT('conveyor_migrate:', DATABASE()), %s) AS got", (LOCK_WAIT_TIMEOUT_S,))
            got = cur.fetchone()
            if not got or got["got"] != 1:
                raise BackendUnavailable("MySQL: another process held the migration lock too long")
            try:
                cur.execute(queries["migrations_table"])
                cur.execute(queries["migrations_applied"])
                done = [row["version"] for row in cur.fetchall()]
                for migration in pending(done, migrations):
                    sql = migration.sql
                    if pool.flavour == "mysql":
                        sql = sql.replace("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
                    for statement in statements(sql):
                        cur.execute(statement)
                    cur.execute(
                        queries["migrations_record"],
                        {"version": migration.version, "name": migration.name, "now": time.time()},
                    )
                    conn.commit()
                    applied.append(migration.name)
            finally:
                cur.execute("SELECT RELEASE_LOCK(CONCAT('conveyor_migrate:', DATABASE()))")
                conn.commit()
    finally:
        pool._give_back(conn)
    return applied
