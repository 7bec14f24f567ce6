"""When scheduled jobs come due: when an acquire must first make them ready, and when an idle worker wakes.

A job written with its ``run_at`` still ahead is ``scheduled``: it waits outside the ready index, so
that acquires never walk over it, and ``jobs_promote`` makes it ``pending`` once it is due. The Backend
contract is unchanged: ``jobs_acquire`` hands out the jobs that are due. SQLite promotes in every
acquire. PostgreSQL, so that it does not pay a second statement each time, promotes only when a scheduled
job may have come due since the queue's last promotion: when the next one that promotion reported is
due, when this process wrote a scheduled job (an insert, a retry's backoff) that is due, or at least
every :data:`PROMOTE_EVERY` (scheduled jobs that other processes wrote, which this one cannot know of).
Between those, a job another process scheduled may therefore wait up to that long past its ``run_at``:
the same bound as an idle worker's poll.

On both engines, what the last promotion saw and what this process wrote since also tell an idle worker
when to wake (:meth:`Promotions.next_due`, ``Backend.jobs_next_due``): a job known to be scheduled, a
retry's backoff among them, starts at its ``run_at`` rather than at the next poll."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from conveyor.backends.base import NewJob

#: The longest a queue goes without a promotion while it is being acquired from.
PROMOTE_EVERY = timedelta(seconds=1)
#: Scheduled jobs made ready per statement; a full batch has the next acquire promote again.
PROMOTE_BATCH = 1_000
#: Queues whose scheduled jobs this process remembers writing, at most (see Promotions.scheduled_many).
MAX_QUEUES = 10_000


def earliest_by_queue(pairs: Iterable[tuple[str, datetime]]) -> dict[str, datetime]:
    """Per queue, the earliest of the ``(queue, run_at)`` pairs."""
    earliest: dict[str, datetime] = {}
    for queue, run_at in pairs:
        if queue not in earliest or run_at < earliest[queue]:
            earliest[queue] = run_at
    return earliest


def scheduled_earliest(jobs: Iterable[NewJob], now: datetime) -> dict[str, datetime]:
    """Per queue, the earliest ``run_at`` among ``jobs`` that are written as scheduled at ``now``."""
    return earliest_by_queue((j.queue, j.run_at) for j in jobs if j.run_at > now)


class Promotions:
    """Per queue, the earliest time an acquire must promote again (PostgreSQL) and the next ``run_at``
    known to come due. Thread-safe: every connection of one backend (its pools' threads, the worker's
    event loop) shares one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # From the last promotion: the next scheduled job it saw, or PROMOTE_EVERY after it, whichever
        # is first. A queue not here was never promoted by this process: its first acquire promotes.
        self._next: dict[str, datetime] = {}
        # The earliest run_at of the scheduled jobs this process wrote since.
        self._written: dict[str, datetime] = {}
        # From the last promotion: when the queue's next scheduled job is due (absent: none).
        self._upcoming: dict[str, datetime] = {}

    def due(self, queue: str, now: datetime) -> bool:
        """Whether an acquire of ``queue`` at ``now`` must promote first."""
        at = self._next.get(queue)
        if at is None or now >= at:
            return True
        written = self._written.get(queue)
        return written is not None and now >= written

    def next_due(self, queues: Sequence[str]) -> datetime | None:
        """The earliest ``run_at`` this process knows of among the scheduled jobs of ``queues``: the
        next one each queue's last promotion saw, and those it wrote since (None: none known)."""
        with self._lock:
            times = [t for q in queues for t in (self._upcoming.get(q), self._written.get(q)) if t is not None]
        return min(times, default=None)

    def promoted(self, queue: str, now: datetime, row: tuple[Any, ...] | None) -> None:
        """Record a promotion of ``queue`` at ``now``: ``row`` is what ``jobs_promote`` returned (how
        many jobs it moved, how many queues it notified, when the queue's next scheduled job is due)."""
        moved, _, next_run_at = row if row is not None else (0, 0, None)
        if moved >= PROMOTE_BATCH:
            at = now  # a backlog: the next acquire promotes the rest
        else:
            at = now + PROMOTE_EVERY
            if next_run_at is not None and next_run_at < at:
                at = next_run_at
        with self._lock:
            self._next[queue] = at
            if next_run_at is None:
                self._upcoming.pop(queue, None)
            else:
                self._upcoming[queue] = next_run_at
            written = self._written.get(queue)
            if written is not None and written <= now:
                del self._written[queue]

    def scheduled_many(self, earliest: dict[str, datetime]) -> None:
        """This process wrote scheduled jobs: per queue, the earliest ``run_at`` among them."""
        if not earliest:
            return
        with self._lock:
            for queue, run_at in earliest.items():
                written = self._written.get(queue)
                if written is None and len(self._written) >= MAX_QUEUES:
                    # A producer that schedules into ever new queues (one per tenant, say) and acquires
                    # from none would keep an entry for each: forget them all instead, and have every
                    # queue promote at its next acquire, which is always correct.
                    self._written.clear()
                    self._next.clear()
                    self._upcoming.clear()
                if written is None or run_at < written:
                    self._written[queue] = run_at
