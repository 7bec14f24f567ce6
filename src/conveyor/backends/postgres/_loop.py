"""The worker's acquire and finish as coroutines on its event loop (psycopg's async mode).

Run on database threads, every statement wakes a thread that then takes the GIL from the handlers
on the loop; on the loop itself, a statement is a socket the loop already waits on. Measured on a
drain with an I/O-bound async body: +23-26 % jobs/s and -22 % worker CPU per job (docs/benchmarks.md).
Everything else the worker does (heartbeats, retries, rescue, the listener's acquire) stays on the
pooled connections."""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import class_row

from conveyor.backends.base import Delivery, JobsAcquireParams, JobsFinishParams
from conveyor.backends.postgres._args import acquire_args, finish_args

_AsyncConn = psycopg.AsyncConnection[Any]


class PostgresLoopStatements:
    """:class:`~conveyor.backends.base.LoopStatements` for PostgreSQL: acquire and finish, each on an
    async connection of its own, opened on first use and again after a failure.

    A connection whose server went away (a restart, ``pg_terminate_backend``) is noticed before use,
    as the pools do, by its readable socket; one that fails mid-statement, or whose statement was
    cancelled, is dropped: the next call connects anew. Errors are the backend's
    (BackendUnavailable for a lost server, which the worker retries). Belongs to one event loop."""

    def __init__(
        self,
        url: str,
        connect_kwargs: Mapping[str, Any],
        queries: Mapping[str, str],
        errors: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self._url = url
        self._connect_kwargs = dict(connect_kwargs)
        self._q = queries
        self._errors = errors
        self._conns: dict[str, _AsyncConn] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def jobs_acquire(self, params: JobsAcquireParams) -> list[Delivery]:
        """As :meth:`PostgresBackend.jobs_acquire`."""
        if params.limit <= 0:
            return []
        async with self._using("jobs_acquire") as conn:
            cur = conn.cursor(row_factory=class_row(Delivery))
            await cur.execute(self._q["jobs_acquire"], acquire_args(params), prepare=True)
            return await cur.fetchall()

    async def jobs_finish_many(self, params: JobsFinishParams) -> int:
        """As :meth:`PostgresBackend.jobs_finish_many`."""
        args = finish_args(params)
        if args is None:
            return 0
        async with self._using("jobs_finish_many") as conn:
            cur = await conn.execute(self._q["jobs_finish_many"], args, prepare=True)
            return cur.rowcount

    def close(self) -> None:
        """Close the connections (calls made afterwards open new ones, on any loop)."""
        for action in list(self._conns):
            self._drop(action)
        self._locks.clear()

    def _using(self, action: str) -> _Using:
        lock = self._locks.get(action)
        if lock is None:
            lock = self._locks[action] = asyncio.Lock()
        return _Using(self, action, lock)

    async def _connection(self, action: str) -> _AsyncConn:
        conn = self._conns.get(action)
        if conn is not None and (conn.closed or has_input(conn)):
            self._drop(action)
            conn = None
        if conn is None:
            with self._errors(action):
                conn = await psycopg.AsyncConnection.connect(self._url, **self._connect_kwargs)
                try:
                    await conn.execute(self._q["session_setup"])
                except BaseException:
                    conn.pgconn.finish()
                    raise
            self._conns[action] = conn
        return conn

    def _drop(self, action: str) -> None:
        conn = self._conns.pop(action, None)
        if conn is not None and not conn.closed:
            # libpq's close (a Terminate message, then the socket), which is all the async close()
            # does too, without needing the loop: this may run in a task being cancelled, or after
            # the loop that opened the connection has ended.
            conn.pgconn.finish()


class _Using:
    """``async with``: one statement's connection, under its lock; dropped after a failure."""

    def __init__(self, owner: PostgresLoopStatements, action: str, lock: asyncio.Lock) -> None:
        self._owner = owner
        self._action = action
        self._lock = lock
        self._errors: AbstractContextManager[None] | None = None

    async def __aenter__(self) -> _AsyncConn:
        await self._lock.acquire()
        try:
            conn = await self._owner._connection(self._action)
        except BaseException:
            self._lock.release()
            raise
        self._errors = self._owner._errors(self._action)
        self._errors.__enter__()
        return conn

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if kind is not None:
                conn = self._owner._conns.get(self._action)
                if conn is None or conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
                    self._owner._drop(self._action)
                elif not isinstance(exc, psycopg.Error):
                    self._owner._drop(self._action)  # cancelled or interrupted mid-statement
            assert self._errors is not None
            self._errors.__exit__(kind, exc, tb)  # raises the backend's error for a psycopg one
        finally:
            self._lock.release()


def has_input(conn: psycopg.Connection[Any] | _AsyncConn) -> bool:
    """Whether an idle connection's socket has something to read (a FATAL message, EOF): how a
    server restart or ``pg_terminate_backend`` shows on a connection nobody is using."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)
