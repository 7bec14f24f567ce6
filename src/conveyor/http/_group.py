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

A group waits at most ``lock_wait`` for a row another transaction holds: an idempotency key that an
application's open transaction has claimed (a transactional enqueue) and not committed. Past it the
group is split like a cancelled one, so the others commit; the job left alone with the held key then
waits for that transaction on its own, beside the groups (at most ``max_held`` such waits at once, each
at most ``held_wait`` seconds), and its request is answered once the holder has ended: the holder's id
if it committed, its own job if it rolled back. A key still held after that, or with ``max_held`` waits
already under way, is answered with :class:`KeyHeld`, nothing written. So one producer's open
transaction delays only the sends of its own key, never the others'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar
from uuid import UUID

from conveyor._errors import (
    DATABASE_WIDE,
    BackendUnavailable,
    ConveyorError,
    LockWaitTimeout,
    StatementCancelled,
)

#: A prepared job (``App.prepare``); the committer only passes it on.
J = TypeVar("J")


#: Seconds a group's insert waits for a row another transaction holds before the group is split.
LOCK_WAIT = 0.1
#: Seconds a job whose key another transaction holds waits for it, on its own, before KeyHeld.
HELD_WAIT = 5.0
#: Most such waits at once (each holds a database connection and a thread).
MAX_HELD = 4


class KeyHeld(LockWaitTimeout):
    """A job's idempotency key (or its id) is held by another transaction that has not committed
    yet, longer than the service waits: nothing was written; retry once that transaction has ended."""


@dataclass(slots=True)
class GroupStats:
    """What a group committer did since it started."""

    jobs: int = 0
    groups: int = 0
    largest: int = 0
    #: Jobs that waited for another transaction on their own (see the module docs).
    held: int = 0


class GroupCommit(Generic[J]):
    """Coalesces concurrent inserts of single jobs into group transactions (see the module docs).

    ``insert(jobs, lock_wait)`` is a blocking call that inserts jobs in one transaction, waiting at most
    ``lock_wait`` seconds for a row lock (``Producer.insert_prepared``); it runs in a worker thread. At most
    ``max_group`` jobs go in one transaction and at most ``concurrency`` transactions run at once, besides
    at most ``max_held`` single jobs waiting for a held key. Must be used from one event loop."""

    def __init__(
        self,
        insert: Callable[[Sequence[J], float], list[UUID]],
        *,
        max_group: int = 1000,
        concurrency: int = 1,
        lock_wait: float = LOCK_WAIT,
        held_wait: float = HELD_WAIT,
        max_held: int = MAX_HELD,
    ) -> None:
        self._insert = insert
        self._max_group = max_group
        self._concurrency = concurrency
        self._lock_wait = lock_wait
        self._held_wait = held_wait
        self._max_held = max_held
        self._waiting: list[tuple[J, asyncio.Future[UUID]]] = []
        self._running = 0
        self._held = 0
        # The held waits' own threads: on the loop's default executor (min(32, CPUs + 4) threads, 6 on two
        # cores) they would leave the requests' other calls (token reads, admission, the groups) two.
        self._held_threads: ThreadPoolExecutor | None = None
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
            for (job, future), outcome in zip(group, outcomes, strict=True):
                if future.done():  # its request was cancelled (the client went away)
                    continue
                if isinstance(outcome, LockWaitTimeout):
                    self._hold(job, future, outcome)
                elif isinstance(outcome, BaseException):
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

    def _hold(self, job: J, future: asyncio.Future[UUID], timeout: LockWaitTimeout) -> None:
        """Let ``job``, alone past the group's lock wait, wait for the transaction holding its row on
        its own (see the module docs); KeyHeld at once if ``max_held`` such waits are under way."""
        if self._held >= self._max_held:
            future.set_exception(KeyHeld(f"{timeout}; {self._held} other sends are waiting for held keys"))
            return
        self._held += 1
        self.stats.held += 1
        task = asyncio.get_running_loop().create_task(self._wait_held(job, future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wait_held(self, job: J, future: asyncio.Future[UUID]) -> None:
        try:
            if self._held_threads is None:
                self._held_threads = ThreadPoolExecutor(self._max_held, thread_name_prefix="conveyor-held-key")
            outcome = await asyncio.get_running_loop().run_in_executor(self._held_threads, self._insert_held, job)
        except BaseException as exc:  # the thread could not run (shutdown): no request may hang
            outcome = exc if isinstance(exc, ConveyorError) else BackendUnavailable("shutting down")
            raise
        finally:
            self._held -= 1
            if not future.done():
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    def _insert_held(self, job: J) -> UUID | ConveyorError:
        try:
            return self._insert([job], self._held_wait)[0]
        except LockWaitTimeout as exc:
            return KeyHeld(f"still held after {self._held_wait:g}s: {exc}")
        except ConveyorError as exc:
            return exc

    def _isolating(self, jobs: Sequence[J]) -> list[UUID | ConveyorError]:
        """Insert ``jobs`` in one transaction; if the database refuses it (other than by being
        unreachable or damaged), cancels it (too long for its ``statement_timeout``) or it waits
        past ``lock_wait`` for a row lock, insert each half on its own, down to the single job it
        refuses."""
        try:
            return list(self._insert(jobs, self._lock_wait))
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
        if self._held_threads is not None:
            self._held_threads.shutdown(wait=False)
            self._held_threads = None
