"""Group commit: concurrent single-job requests share one database transaction.

A request hands its prepared job (validated, admitted by backpressure) to :class:`GroupCommit` and
waits. While no insert is running, the first job starts one at once; jobs that arrive while it runs
wait for it to commit and then go together, in the next insert. So an idle service adds no delay,
and a busy one pays one transaction (one WAL flush) per group instead of one per request. Each
request is answered only after the transaction holding its job has committed: a 202 is durable.

One bad job never fails the others: every job was checked on its own before it joined a group; if
the database still refuses a group for a reason other than being unreachable, the group is split
in halves and inserted again until the job it refuses is alone, and only that job's request gets
the error. If the database cannot be reached, every request of the group gets that error (503);
whether the commit happened is then unknown, which is why producers send an idempotency key. A group
whose statement the database cancelled (past its ``statement_timeout``) is split in halves as well,
since a smaller one may end in time; a single job so cancelled gets the 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar
from uuid import UUID

from conveyor._errors import DATABASE_WIDE, BackendUnavailable, ConveyorError, StatementCancelled

#: A prepared job (``App.prepare``); the committer only passes it on.
J = TypeVar("J")


@dataclass(slots=True)
class GroupStats:
    """What a group committer did since it started."""

    jobs: int = 0
    groups: int = 0
    largest: int = 0


class GroupCommit(Generic[J]):
    """Coalesces concurrent inserts of single jobs into group transactions (see the module docs).

    ``insert`` is a blocking call that inserts jobs in one transaction (``Producer.insert_prepared``);
    it runs in a worker thread. At most ``max_group`` jobs go in one transaction and at most
    ``concurrency`` transactions run at once. Must be used from one event loop."""

    def __init__(
        self, insert: Callable[[Sequence[J]], list[UUID]], *, max_group: int = 1000, concurrency: int = 1
    ) -> None:
        self._insert = insert
        self._max_group = max_group
        self._concurrency = concurrency
        self._waiting: list[tuple[J, asyncio.Future[UUID]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = GroupStats()

    async def submit(self, job: J) -> UUID:
        """Insert ``job`` with whatever other jobs are waiting; return its stored id (the holder's
        id for a duplicate idempotency key) once its transaction has committed. Raises what the
        insert raised for this job (BackendUnavailable for the whole group)."""
        future: asyncio.Future[UUID] = asyncio.get_running_loop().create_future()
        self._waiting.append((job, future))
        if self._running < self._concurrency:
            self._start()
        return await future

    def _start(self) -> None:
        # A job whose request was cancelled while it waited for a group (the service stopping: the request was
        # answered 503) never reached the database and is not sent to it now, so that a client retrying that
        # answer without an idempotency key does not enqueue the job twice.
        waiting = [entry for entry in self._waiting if not entry[1].done()]
        group, self._waiting = waiting[: self._max_group], waiting[self._max_group :]
        if not group:
            return
        self._running += 1
        task = asyncio.get_running_loop().create_task(self._commit(group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _commit(self, group: list[tuple[J, asyncio.Future[UUID]]]) -> None:
        try:
            jobs = [job for job, _ in group]
            outcomes = await asyncio.to_thread(self._isolating, jobs)
            self.stats.jobs += len(group)
            self.stats.groups += 1
            self.stats.largest = max(self.stats.largest, len(group))
            for (_, future), outcome in zip(group, outcomes, strict=True):
                if future.done():  # its request was cancelled (the client went away)
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        except BaseException as exc:  # the thread could not run (shutdown): no request may hang
            for _, future in group:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else BackendUnavailable("shutting down"))
            raise
        finally:
            self._running -= 1
            if self._waiting and self._running < self._concurrency:
                self._start()

    def _isolating(self, jobs: Sequence[J]) -> list[UUID | ConveyorError]:
        """Insert ``jobs`` in one transaction; if the database refuses it (other than by being
        unreachable or damaged) or cancels it (too long for its ``statement_timeout``), insert each
        half on its own, down to the single job it refuses."""
        try:
            return list(self._insert(jobs))
        except StatementCancelled as exc:
            if len(jobs) == 1:
                return [exc]
        except DATABASE_WIDE as exc:  # no one job's fault
            return [exc] * len(jobs)
        except ConveyorError as exc:
            if len(jobs) == 1:
                return [exc]
        middle = len(jobs) // 2
        return self._isolating(jobs[:middle]) + self._isolating(jobs[middle:])

    async def drain(self) -> None:
        """Wait for the transactions under way (the service is stopping)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
