"""The worker's acquire and finish as coroutines on its event loop (psycopg's async mode).

Run on database threads, every statement wakes a thread that then takes the GIL from the handlers
on the loop; on the loop itself, a statement is a socket the loop already waits on. Measured on a
drain with an I/O-bound async body: +23-26 % jobs/s and -22 % worker CPU per job (docs/benchmarks.md).
Everything else the worker does (heartbeats, retries, rescue, the listener's acquire) stays on the
pooled connections."""

from __future__ import annotations

import asyncio
import select
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from conveyor.backends import _deadline
from conveyor.backends._promotion import Promotions
from conveyor.backends.base import Delivery, JobsAcquireParams, JobsFinishParams
from conveyor.backends.postgres._args import acquire_args, finish_args, promote_args
from conveyor.backends.postgres._rows import record_row

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
        setup: Sequence[str],
        queries: Mapping[str, str],
        errors: Callable[[str], AbstractContextManager[None]],
        promotions: Promotions,
        deadline: float | None,
    ) -> None:
        self._url = url
        self._promotions = promotions
        self._connect_kwargs = dict(connect_kwargs)
        self._setup = list(setup)
        self._q = queries
        self._errors = errors
        # A statement with no answer within ``deadline`` seconds has its connection cut (see
        # conveyor.backends._deadline).
        self._deadline = deadline
        self._conns: dict[str, _AsyncConn] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def jobs_acquire(self, params: JobsAcquireParams) -> list[Delivery]:
        """As :meth:`PostgresBackend.jobs_acquire`."""
        if params.limit <= 0:
            return []
        async with self._using("jobs_acquire") as conn:
            if params.promote and self._promotions.due(params.queue, params.now):
                promote = await conn.execute(self._q["jobs_promote"], promote_args(params), prepare=True)
                self._promotions.promoted(params.queue, params.now, await promote.fetchone())
            cur = conn.cursor(row_factory=record_row(Delivery))
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

    @asynccontextmanager
    async def _using(self, action: str) -> AsyncIterator[_AsyncConn]:
        """One statement's connection, under its lock, with the backend's errors; a connection left
        in an unknown state (a lost server, a statement cancelled or interrupted) is dropped."""
        async with self._locks[action]:
            conn = await self._connection(action)
            with self._errors(action):
                watch = _deadline.watch(conn.fileno(), self._deadline)
                try:
                    yield conn
                except BaseException as exc:
                    # Not watched any more before the socket can close: its number may be another's next.
                    cut = _deadline.done(watch)
                    idle = not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE
                    # An error of the server's, or text the connection's encoding cannot hold (found
                    # before anything was sent), leaves the connection usable; one that is read-only
                    # (a standby) never writes, and is replaced.
                    usable = isinstance(exc, psycopg.Error | UnicodeEncodeError) and not isinstance(
                        exc, psycopg.errors.ReadOnlySqlTransaction
                    )
                    if cut or not (idle and usable):
                        self._drop(action)
                    if cut and isinstance(exc, psycopg.OperationalError):
                        raise _deadline.no_answer("PostgreSQL", action, self._deadline) from exc
                    raise
                finally:
                    _deadline.done(watch)

    async def _connection(self, action: str) -> _AsyncConn:
        conn = self._conns.get(action)
        if conn is not None and (conn.closed or has_input(conn)):
            self._drop(action)
            conn = None
        if conn is None:
            with self._errors(action):
                conn = await psycopg.AsyncConnection.connect(self._url, **self._connect_kwargs)
                watch = _deadline.watch(conn.fileno(), self._deadline)
                try:
                    for statement in self._setup:
                        await conn.execute(statement)
                except BaseException as exc:
                    cut = _deadline.done(watch)
                    conn.pgconn.finish()
                    if cut and isinstance(exc, psycopg.OperationalError):
                        raise _deadline.no_answer("PostgreSQL", action, self._deadline) from exc
                    raise
                finally:
                    _deadline.done(watch)
            self._conns[action] = conn
        return conn

    def _drop(self, action: str) -> None:
        conn = self._conns.pop(action, None)
        if conn is not None and not conn.closed:
            # libpq's close (a Terminate message, then the socket), which is all the async close()
            # does too, without needing the loop: this may run in a task being cancelled, or after
            # the loop that opened the connection has ended.
            conn.pgconn.finish()


def has_input(conn: psycopg.Connection[Any] | _AsyncConn) -> bool:
    """Whether an idle connection's socket has something to read (a FATAL message, EOF): how a
    server restart or ``pg_terminate_backend`` shows on a connection nobody is using."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)
