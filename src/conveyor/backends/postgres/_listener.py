"""Wakes idle fetchers on PostgreSQL NOTIFY."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import psycopg

from conveyor.backends import _deadline

# A listener that lost its server retries the connection at most this often, so that a fetcher
# looping on ``wait`` while PostgreSQL is down neither spins nor raises.
_RECONNECT_PAUSE = 0.5
#: After this long with nothing from the server, a wait first asks it one trivial statement, under the
#: deadline (seconds): a connection whose server stopped answering without closing it (see
#: conveyor.backends._deadline) delivers no notification again, and the worker was left to its polls.
CHECK_AFTER = 30.0


class PostgresListener:
    """A dedicated connection doing ``LISTEN``; ``wait`` returns True on an insert into one of its queues.

    Survives the server going away: a failed wait closes the connection and returns False (after
    a short pause); the next wait reconnects and returns True at once, because notifications sent
    while it was disconnected are lost and the fetcher should look for work. Not thread-safe
    beyond ``close()`` being callable from another thread; use one listener per fetcher."""

    def __init__(
        self,
        url: str,
        queues: Sequence[str],
        listen_sql: str,
        connect_timeout: int,
        statement_deadline: float | None = None,
    ) -> None:
        self._url = url
        self._deadline = statement_deadline
        #: time.monotonic() when the server was last heard from on this connection.
        self._heard = 0.0
        self._queues = frozenset(queues)
        self._listen_sql = listen_sql
        self._connect_timeout = connect_timeout
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._ever_connected = False
        # Connect now when we can, so that notifications sent right after ``listen()`` returns
        # are not missed; a server that is down is not an error here (wait() retries).
        self._connect()

    def _connect(self) -> bool:
        try:
            conn = psycopg.connect(self._url, autocommit=True, connect_timeout=self._connect_timeout)
        except (psycopg.Error, OSError):
            # OSError: no file descriptor left in this process (EMFILE, a handler leaking sockets or files)
            # for the socket or psycopg's selector. It ended the fetcher with a traceback and the worker
            # with it, its prefetched jobs left to their leases, while the pools waited it out as an
            # unreachable server, as this does now.
            return False
        if not self._answered(conn, self._listen_sql):
            conn.close()
            return False
        with self._lock:
            if self._closed:
                conn.close()
                return False
            self._conn = conn
        self._ever_connected = True
        return True

    def _answered(self, conn: psycopg.Connection[tuple[object, ...]], statement: str) -> bool:
        """Run ``statement`` on ``conn`` under the deadline; whether the server answered (without an error)."""
        with _deadline.watching(conn.fileno(), self._deadline):
            try:
                conn.execute(statement)
            except psycopg.Error:
                return False
        self._heard = time.monotonic()
        return True

    def _drop(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if woken by a notification for one of the queues.

        Also True right after reconnecting (notifications may have been missed meanwhile).
        Never raises for a lost or unreachable server: it returns False instead."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self._closed:
            return False
        conn = self._conn
        if conn is None or conn.closed:
            was_connected = self._ever_connected
            if self._conn is not None:
                self._drop()
            if not self._connect():
                time.sleep(max(0.0, min(_RECONNECT_PAUSE, deadline - time.monotonic())))
                return False
            if was_connected:
                return True
            conn = self._conn
            if conn is None:
                return False
        quiet = self._deadline is not None and time.monotonic() - self._heard > CHECK_AFTER
        if quiet and not self._answered(conn, "SELECT 1"):
            self._drop()
            return False
        try:
            woken = False
            for notify in conn.notifies(timeout=max(0.0, deadline - time.monotonic())):
                self._heard = time.monotonic()
                if notify.payload in self._queues:
                    woken = True
                    break
            if woken:
                # Fold a burst of notifications into one wake-up: the fetcher drains the queue
                # after waking anyway. (A second notifies() inside the first would deadlock on
                # the connection's lock, hence after the loop.)
                for _ in conn.notifies(timeout=0.0):
                    pass
                return True
        except psycopg.Error:
            self._drop()
            if not self._closed:
                time.sleep(max(0.0, min(_RECONNECT_PAUSE, deadline - time.monotonic())))
        return False

    def close(self) -> None:
        """Close the connection; later waits return False at once."""
        self._closed = True
        self._drop()
