"""Connections to one SQLite database: opening with the right pragmas, pooling, transactions, errors.

A file is shared through a pool of connections (:class:`ConnectionPool`); a private in-memory
database lives on exactly one connection (:class:`MemoryConnection`), since each connection to
``:memory:`` is a database of its own. Both hand out connections through ``write()`` and ``read()``.

SQLite serialises writers per database file. Every write transaction here starts with
``BEGIN IMMEDIATE``, which takes the file's write lock before the first read, so a read-then-write
(acquire's select-and-update, migrate's check-and-apply) is atomic across threads *and* processes.
Readers never block writers or each other in WAL mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from conveyor._errors import BackendCorrupt, BackendError, BackendUnavailable, UnstorableText

#: How long a statement waits for another connection's write lock before giving up.
BUSY_TIMEOUT_S = 30.0

#: What the write-ahead log is cut back to once it has been checkpointed. Without a limit it keeps
#: the size of its largest run of writes between two checkpoints for good (SQLite reuses the file
#: rather than truncate it): gigabytes after a burst under a long-reading process or a full disk.
WAL_SIZE_LIMIT = 64 * 1024 * 1024

# Messages of sqlite3.OperationalError that mean "the database cannot be used right now" rather
# than "this statement is wrong": the caller should back off and retry, nothing is lost.
_UNAVAILABLE = (
    "database is locked",
    "database is busy",
    "database table is locked",
    "unable to open database file",
    "disk i/o error",
    "database or disk is full",
)


def translate(exc: sqlite3.Error, path: str | None = None) -> BackendError:
    """Map a sqlite3 error to Conveyor's exception tree (raise the result ``from exc``); ``path``, the
    database file, is named in the message (SQLite's own never says which file it could not open)."""
    message = str(exc)
    where = f" ({path})" if path else ""
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB":
        # Not a moment's trouble: every statement touching the damaged pages fails alike.
        if name == "SQLITE_NOTADB":
            return BackendCorrupt(
                f"{path or 'the file'} is not an SQLite database, or is damaged: {message}; check that the URL "
                "names the right file, else restore it from a backup"
            )
        recover = f" (`sqlite3 {path} .recover` saves what it can)" if path else ""
        return BackendCorrupt(f"the SQLite database{where} is damaged: {message}; restore it from a backup{recover}")
    if isinstance(exc, sqlite3.OperationalError) and message.lower().startswith(_UNAVAILABLE):
        return BackendUnavailable(f"SQLite database unavailable{where}: {message}")
    if isinstance(exc, sqlite3.OperationalError) and message.startswith("no such table: "):
        # As on PostgreSQL and MySQL: a file never migrated (the pipeline reads one without an App).
        return BackendError(
            f"the Conveyor schema is missing in this database{where} ({message}): run `conveyor migrate` with the "
            "same URL"
        )
    return BackendError(f"SQLite statement failed{where}: {message}")


@contextmanager
def translated(path: str | None = None) -> Iterator[None]:
    """Re-raise any sqlite3 error inside the block as BackendError / BackendUnavailable, and text
    sqlite3 cannot encode (a lone surrogate: a name read from non-UTF-8 bytes) as UnstorableText."""
    try:
        yield
    except sqlite3.Error as exc:
        raise translate(exc, path) from exc
    except UnicodeEncodeError as exc:
        raise UnstorableText(f"SQLite{f' ({path})' if path else ''}", exc) from None


def _open(path: str) -> sqlite3.Connection:
    # isolation_level=None turns off the sqlite3 module's implicit transactions: this module
    # issues BEGIN IMMEDIATE / BEGIN / COMMIT itself, so it knows exactly which lock it holds.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if path == ":memory:":
            return conn
        _enable_wal(conn)
        conn.execute(f"PRAGMA journal_size_limit = {int(WAL_SIZE_LIMIT)}")
        # NORMAL is durable against application crashes in WAL mode and skips an fsync per commit;
        # only an OS crash or power loss can lose the last few transactions.
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


def _enable_wal(conn: sqlite3.Connection) -> None:
    # Switching a fresh file to WAL needs a brief exclusive lock and does not always go through
    # the busy handler, so several processes opening a new file at once retry here. WAL is a
    # property of the file: once set it stays set, and later calls are no-ops.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


# Every open pool and in-memory connection, for the fork hooks below.
_open_sets: weakref.WeakSet[ConnectionPool | MemoryConnection] = weakref.WeakSet()
_held_at_fork: list[ConnectionPool | MemoryConnection] = []


def _before_fork() -> None:
    """Wait for the writes under way in this process and hold them off until the fork is done: SQLite
    keeps a process's file locks in bookkeeping the child copies, so a child forked in the middle of a
    write found the file locked for ever (and one forked while a thread held a private in-memory
    database's lock waited for that thread, which does not exist in the child)."""
    for connections in list(_open_sets):
        connections.fork_lock().acquire()
        _held_at_fork.append(connections)


def _after_fork() -> None:
    while _held_at_fork:
        _held_at_fork.pop().fork_lock().release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


class ConnectionPool:
    """Connections to one SQLite file, shared by threads: each call borrows one and returns it.

    A process-wide writer lock queues this process's write transactions in Python, where waiting
    is cheap, instead of letting them spin in SQLite's busy handler against each other; other
    processes still meet at the file lock, which the busy timeout waits for."""

    def __init__(self, path: str, max_idle: int = 8) -> None:
        self.path = path
        self._max_idle = max_idle
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._writer = threading.Lock()
        self._closed = False
        _open_sets.add(self)

    def fork_lock(self) -> threading.Lock:
        """The lock a fork takes: no write of this process is under way while it is held."""
        return self._writer

    def _borrow(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise BackendError("the SQLite backend is closed")
            if self._idle:
                return self._idle.pop()
        with translated(self.path):
            return _open(self.path)

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle and not conn.in_transaction:
                self._idle.append(conn)
                return
        conn.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A connection inside ``BEGIN IMMEDIATE``: committed on success, rolled back on error."""
        with self._writer:
            conn = self._borrow()
            try:
                with translated(self.path):
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield conn
                        conn.execute("COMMIT")
                    except BaseException:
                        if conn.in_transaction:
                            conn.rollback()
                        raise
            finally:
                self._give_back(conn)

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A connection inside a deferred ``BEGIN``: every statement sees one snapshot."""
        conn = self._borrow()
        try:
            with translated(self.path):
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.rollback()
        finally:
            self._give_back(conn)

    def close(self) -> None:
        """Close idle connections now and borrowed ones when they are given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class MemoryConnection:
    """A private in-memory database on one connection, shared by threads under one lock.

    The same ``write()`` / ``read()`` as :class:`ConnectionPool`. ``on_commit`` runs after every
    committed write (the backend wakes its listeners there: nothing outside this process can write)."""

    def __init__(self, on_commit: Callable[[], None] = lambda: None) -> None:
        self._conn = _open(":memory:")
        self._lock = threading.RLock()
        self._on_commit = on_commit
        self._closed = False
        _open_sets.add(self)

    def fork_lock(self) -> threading.RLock:
        """The lock a fork takes: no statement is under way while it is held."""
        return self._lock

    @contextmanager
    def _held(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise BackendError("the in-memory backend is closed")
            yield self._conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """The connection inside ``BEGIN IMMEDIATE``: committed on success, rolled back on error."""
        with self._held() as conn, translated():
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
        self._on_commit()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection inside a deferred ``BEGIN`` (one snapshot; no other thread writes meanwhile)."""
        with self._held() as conn, translated():
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.rollback()

    def copy_to(self, target: MemoryConnection) -> None:
        """Replace ``target``'s database with a copy of this one (SQLite's online backup)."""
        with self._held() as source, target._held() as conn, translated():
            source.backup(conn)

    def close(self) -> None:
        """Drop the database; calls made afterwards raise BackendError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


#: What the backend talks to: a pool of connections to a file, or the one connection of a private
#: in-memory database.
Connections = ConnectionPool | MemoryConnection
