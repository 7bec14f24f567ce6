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
waits for that transaction on its own, beside the groups (:mod:`conveyor.http._held`), and its request
is answered once the holder has ended, or with :class:`KeyHeld`, nothing written. So one producer's
open transaction delays only the sends of its own key, never the others'. A key found held is not waited
for again by the rest of its group, nor by the groups while a send of it waits on its own: its other sends
join that wait (or get KeyHeld), so many sends of one held key (clients retrying it) cost the groups one
lock wait, not one per send.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
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
from conveyor.http._held import LOCK_WAIT, HeldWaits, KeyHeld

#: A prepared job (``App.prepare``); the committer only passes it on.
J = TypeVar("J")


#: Why a send is not sent with a group: its key was found held already.
_ALREADY_HELD = "another send of its key found it held by another transaction that has not committed yet"


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
    at most ``max_held`` single jobs waiting for a held key. ``key_of(job)``: what another transaction may hold
    of it (its queue and idempotency key), None if nothing. Must be used from one event loop."""

    def __init__(
        self,
        insert: Callable[[Sequence[J], float], list[UUID]],
        *,
        max_group: int = 1000,
        concurrency: int = 1,
        lock_wait: float = LOCK_WAIT,
        held: HeldWaits | None = None,
        key_of: Callable[[J], Hashable | None] = lambda _: None,
    ) -> None:
        self._insert = insert
        self._max_group = max_group
        self._concurrency = concurrency
        self._lock_wait = lock_wait
        self._held = held if held is not None else HeldWaits()
        self._key_of = key_of
        #: The keys some send waits for on its own, and how many sends wait for each.
        self._held_keys: dict[Hashable, int] = {}
        self._waiting: list[tuple[J, asyncio.Future[UUID]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = GroupStats()

    async def submit(self, job: J) -> UUID:
        """Insert ``job`` with whatever other jobs are waiting; return its stored id (the holder's
        id for a duplicate idempotency key) once its transaction has committed. Raises what the
        insert raised for this job (BackendUnavailable for the whole group)."""
        future: asyncio.Future[UUID] = asyncio.get_running_loop().create_future()
        if self._key_of(job) in self._held_keys:  # held: no group waits for it again
            self._hold(job, future, LockWaitTimeout(_ALREADY_HELD))
            return await future
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
            outcomes = await asyncio.to_thread(self._isolating, jobs, set(self._held_keys))
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
        its own (see the module docs); KeyHeld at once if the held waits are all under way."""
        if self._held.full():
            future.set_exception(KeyHeld(f"{timeout}; other sends are waiting for held keys"))
            return
        self.stats.held += 1
        key = self._key_of(job)
        if key is not None:
            self._held_keys[key] = self._held_keys.get(key, 0) + 1
        task = asyncio.get_running_loop().create_task(self._wait_held(job, future, timeout))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wait_held(self, job: J, future: asyncio.Future[UUID], timeout: LockWaitTimeout) -> None:
        outcome: UUID | BaseException = BackendUnavailable("shutting down")
        try:
            outcome = await self._held.run(lambda wait: self._insert([job], wait)[0], timeout)
        except ConveyorError as exc:
            outcome = exc
        finally:  # the thread could not run (shutdown): no request may hang
            key = self._key_of(job)
            if key is not None:
                self._held_keys[key] -= 1
                if not self._held_keys[key]:
                    del self._held_keys[key]
            if not future.done():
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    def _isolating(self, jobs: Sequence[J], held: set[Hashable]) -> list[UUID | ConveyorError]:
        """Insert ``jobs`` in one transaction; if the database refuses it (other than by being
        unreachable or damaged), cancels it (too long for its ``statement_timeout``) or it waits
        past ``lock_wait`` for a row lock, insert each half on its own, down to the single job it
        refuses. A job whose key is ``held`` (found held, here or by a send waiting for it) is not
        sent: LockWaitTimeout at once."""
        skipped = [(key := self._key_of(job)) is not None and key in held for job in jobs]
        if any(skipped):
            rest = iter(self._isolating([j for j, s in zip(jobs, skipped, strict=True) if not s], held))
            return [LockWaitTimeout(_ALREADY_HELD) if s else next(rest) for s in skipped]
        if not jobs:
            return []
        try:
            return list(self._insert(jobs, self._lock_wait))
        except StatementCancelled as exc:
            if len(jobs) == 1:
                key = self._key_of(jobs[0])
                if isinstance(exc, LockWaitTimeout) and key is not None:
                    held.add(key)
                return [exc]
        except DATABASE_WIDE as exc:  # no one job's fault
            return [exc] * len(jobs)
        except ConveyorError as exc:
            if len(jobs) == 1:
                return [exc]
        middle = len(jobs) // 2
        return self._isolating(jobs[:middle], held) + self._isolating(jobs[middle:], held)

    async def drain(self) -> None:
        """Wait for the transactions under way (the service is stopping)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._held.close()
