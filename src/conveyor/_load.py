"""Backpressure: a queue past its high-water mark refuses sends (QueueFull), by priority class."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime

from conveyor._catalogue import Catalogue
from conveyor._errors import QueueFull
from conveyor._queue import QueueOptions
from conveyor.backends.base import Backend, NewJob, QueueLoadParams

#: The drain rate behind ``retry_after`` is measured over this many seconds.
DRAIN_WINDOW = 60.0
#: A cached depth is read again after this many seconds.
_FRESH_FOR = 0.1
#: The share of the room below its mark that a reading of a queue's depth lets this process fill
#: before it reads again: N processes at once take the queue past its mark only when N > 1 / share.
TRUSTED_SHARE = 0.1


class LoadGauge:
    """Decides whether a queue with a ``max_depth`` takes more jobs.

    It reads a queue's depth at most every 100 ms and counts its own sends in between, so that a hot
    producer does not add a COUNT per send; it refuses only on a fresh reading (the cached depth may
    count jobs that have drained since). Between readings it sends at most a tenth of the room the last
    reading left below the mark (:data:`TRUSTED_SHARE`): other processes send meanwhile, unseen, so that
    up to ten producer processes together stay under the mark but for the send each has in flight."""

    def __init__(self, catalogue: Catalogue, backend: Callable[[], Backend]) -> None:
        self._catalogue = catalogue
        self._backend = backend
        # Per queue: (when read, depth as read plus this process's sends since, drained, depth as read).
        self._loads: dict[str, tuple[float, int, int, int]] = {}

    def check(self, rows: Sequence[NewJob], now: datetime) -> None:
        """Raise QueueFull if a queue of ``rows`` is past the mark of a row's priority class."""
        by_queue: dict[str, list[NewJob]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(row)
        for queue, queued in by_queue.items():
            options = self._catalogue.queues.get(queue)
            if options is None or options.max_depth is None:
                continue
            refusal = self.refusal(options, queued, self._load(options, queued, now))
            if refusal is not None:
                # Refused on a fresh reading only, and counting only the rows that add a job: a
                # resend under a held idempotency key (or a key repeated in the batch) is answered
                # with its holder, so a full queue still gives the producer its job's id.
                keys = tuple({row.idempotency_key for row in queued if row.idempotency_key is not None})
                depth, drained, held = self._read(queue, now, keys)
                queued = _adding(queued, held)
                refusal = self.refusal(options, queued, (depth, drained))
            if refusal is not None:
                raise refusal
            tick, depth, drained, read = self._loads[queue]
            self._loads[queue] = (tick, depth + len(queued), drained, read)

    @staticmethod
    def refusal(options: QueueOptions, queued: Sequence[NewJob], load: tuple[int, int]) -> QueueFull | None:
        """The QueueFull that sending ``queued`` into a queue at ``load`` (depth, drained) meets, if any."""
        depth, drained = load
        for row in queued:
            limit = options.limit_for(row.priority)
            assert limit is not None
            if depth + 1 > limit:
                rate = drained / DRAIN_WINDOW
                excess = depth + 1 - limit
                retry_after = excess / rate if rate > 0 else DRAIN_WINDOW
                return QueueFull(options.name, depth, limit, max(0.1, min(retry_after, 3600.0)))
            depth += 1
        return None

    def _load(self, options: QueueOptions, queued: Sequence[NewJob], now: datetime) -> tuple[int, int]:
        """(live depth, jobs drained in the last minute) for sending ``queued``: the last reading
        while it is at most 100 ms old and this process's sends since it, ``queued`` included, stay
        within a tenth of the room it left below the lowest mark of ``queued``; else read now."""
        cached = self._loads.get(options.name)
        if cached is not None and time.monotonic() - cached[0] <= _FRESH_FOR:
            _, depth, drained, read = cached
            # Four producer processes trusting a reading for 100 ms took a queue of max_depth 200 to 769
            # jobs (SQLite): each sent up to the mark on the depth it had read, unaware of the others.
            marks = [options.limit_for(priority) for priority in {row.priority for row in queued}]
            limit = min(mark for mark in marks if mark is not None)
            if depth + len(queued) - read <= (limit - read) * TRUSTED_SHARE:
                return depth, drained
        return self._read(options.name, now, ())[:2]

    def _read(self, queue: str, now: datetime, keys: tuple[str, ...]) -> tuple[int, int, frozenset[str]]:
        """(live depth, jobs drained in the last minute, which of ``keys`` are held), read now and cached."""
        tick = time.monotonic()
        load = self._backend().queue_load(QueueLoadParams(queue, now, window=DRAIN_WINDOW, keys=keys))
        self._loads[queue] = (tick, load.depth, load.drained, load.depth)
        return load.depth, load.drained, load.held


def _adding(queued: Sequence[NewJob], held: frozenset[str]) -> list[NewJob]:
    """The rows of ``queued`` that add a job: unkeyed rows, and the first row of each key not held."""
    adding: list[NewJob] = []
    seen = set(held)
    for row in queued:
        key = row.idempotency_key
        if key is None:
            adding.append(row)
        elif key not in seen:
            seen.add(key)
            adding.append(row)
    return adding
