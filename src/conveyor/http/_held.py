"""Held keys: a send whose idempotency key (or job id) another transaction holds and has not committed.

An application that enqueues a job in its own transaction (``app.send(..., conn=...)``) holds the job's key
until it commits or rolls back; an insert of the same key waits for it. Every insert of ``conveyor serve``
that can meet such a row (a key, a resent id) first waits at most ``LOCK_WAIT``; past it, the insert that
timed out waits again on its own, on :class:`HeldWaits`' threads (at most ``MAX_HELD`` at once, each at most
``HELD_WAIT`` seconds), and is answered once the holder has ended: the holder's id if it committed, its
own job if it rolled back. A key still held after that, or with ``MAX_HELD`` waits already under way, is
:class:`KeyHeld` (409 ``key_in_use``), nothing written. So one producer's open transaction holds up no
thread, connection or request of any other send: the group commit's sends, the batch endpoint's and
``--no-group-commit``'s alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from conveyor._errors import LockWaitTimeout

#: Seconds an insert waits for a row another transaction holds before it waits on its own (a group is split).
LOCK_WAIT = 0.1
#: Seconds an insert whose key another transaction holds waits for it, on its own, before KeyHeld.
HELD_WAIT = 5.0
#: Most such waits at once (each holds a database connection and a thread).
MAX_HELD = 4

R = TypeVar("R")


class KeyHeld(LockWaitTimeout):
    """A job's idempotency key (or its id) is held by another transaction that has not committed
    yet, longer than the service waits: nothing was written; retry once that transaction has ended."""


class HeldWaits:
    """The inserts that wait for a held key on their own: at most ``most`` at once, each at most ``wait``
    seconds, on threads of their own (on the loop's default executor, min(32, CPUs + 4) threads, 6 on two
    cores, they would leave the requests' other calls, token reads, admission, the groups, two). Must be
    used from one event loop."""

    def __init__(self, most: int = MAX_HELD, wait: float = HELD_WAIT) -> None:
        self._most = most
        self._wait = wait
        self._under_way = 0
        self._threads: ThreadPoolExecutor | None = None

    def full(self) -> bool:
        return self._under_way >= self._most

    async def run(self, insert: Callable[[float], R], timeout: LockWaitTimeout) -> R:
        """``insert(lock_wait)``, which ``timeout`` ended after the first, short, wait, again with this
        wait. Raises KeyHeld if the key is still held after it, or at once if ``most`` waits are under way."""
        if self.full():
            raise KeyHeld(f"{timeout}; {self._under_way} other sends are waiting for held keys")
        self._under_way += 1
        try:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self._most, thread_name_prefix="conveyor-held-key")
            return await asyncio.get_running_loop().run_in_executor(self._threads, self._bounded, insert)
        finally:
            self._under_way -= 1

    def _bounded(self, insert: Callable[[float], R]) -> R:
        try:
            return insert(self._wait)
        except LockWaitTimeout as exc:
            raise KeyHeld(f"still held after {self._wait:g}s: {exc}") from exc

    def close(self) -> None:
        """Let the threads go (the service is stopping; the waits under way were awaited)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None
