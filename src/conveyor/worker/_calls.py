"""Backend calls from the worker's event loop: on a small thread pool, retried while the database is away."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from conveyor._errors import BackendRefused, BackendUnavailable, StatementCancelled
from conveyor.backends.base import Backend
from conveyor.worker._state import Counters
from conveyor.worker._threads import leave_forked_child, process_id

log = logging.getLogger("conveyor.worker")

#: How long a batch size that fit a statement_timeout is kept (see BackendCalls.call_batch).
BATCH_CAP_SECONDS = 60.0

T = TypeVar("T")
P_ = TypeVar("P_")
I = TypeVar("I")  # noqa: E741 - an item of a batch
R = TypeVar("R", list[Any], int)  # what a batch statement returns: rows (joined) or a count (added)


def _state(exc: Exception) -> str:
    """What a retried call's warning says of the database: an operator's ``KILL QUERY`` or
    ``pg_cancel_backend``, or a statement timeout, is not an outage (it was logged as one)."""
    if isinstance(exc, BackendRefused):
        return "database refuses a privilege"
    if isinstance(exc, StatementCancelled):
        return "database cancelled the statement"
    return "database unavailable"


class BackendCalls:
    """Runs blocking Backend calls on a small dedicated thread pool.

    ``call`` retries ``BackendUnavailable`` with capped, jittered backoff until it succeeds or the
    ``stopping`` check says to give up, so that a database restart pauses the worker instead of
    killing it or losing outcomes it still has to write."""

    def __init__(self, backend: Backend, counters: Counters, threads: int = 4) -> None:
        self.backend = backend
        self.counters = counters
        self._pid = process_id()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="conveyor-db")
        # The largest batch of each kind (``what``) known to end within the database's statement_timeout,
        # once one was cancelled, and since when: later batches of that kind go in parts of that size
        # from the start, for BATCH_CAP_SECONDS (what slowed them, a lock, a load, may be gone by then).
        self._batch_caps: dict[str, tuple[int, float]] = {}
        # Acquire and finish run on the event loop itself where the backend can (LoopStatements):
        # on a thread, each wake-up took the GIL from the handlers. Only the backend's own methods
        # are: one replaced or wrapped (a test's fault injection, a proxy) is called as it is.
        self._statements = backend.loop_statements()
        self._on_loop: dict[Callable[[Any], Any], Callable[[Any], Awaitable[Any]]] = {}
        if self._statements is not None:
            owner = getattr(backend.loop_statements, "__self__", None)
            for name in ("jobs_acquire", "jobs_finish_many"):
                method = getattr(backend, name)
                if getattr(method, "__self__", None) is owner and getattr(method, "__func__", None) is getattr(
                    type(owner), name, None
                ):
                    self._on_loop[method] = getattr(self._statements, name)

    async def once(self, fn: Callable[[P_], T], params: P_) -> T:
        """One call, errors propagate."""
        if process_id() != self._pid:
            # A process a handler forked, whose handler awaited in it: the worker's loops ran on there
            # and reached the database, where they would ack, fetch and run the parent's jobs again.
            leave_forked_child("a handler (its loop ran the worker's)", 1)
        on_loop = self._on_loop.get(fn)
        if on_loop is not None:
            result: T = await on_loop(params)
            return result
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, params)

    async def call(
        self,
        fn: Callable[[P_], T],
        params: P_,
        *,
        give_up: Callable[[], bool] = lambda: False,
        what: str = "backend call",
        splits: bool = False,
        refused: bool = False,
    ) -> T:
        """Call, retrying while the database is unavailable; raises the last error if ``give_up()``.

        ``splits``: the caller splits a batch whose statement the database cancelled (a
        ``statement_timeout`` it runs past), so :class:`StatementCancelled` is raised at once instead
        of retried: the same batch would be cancelled again, forever. ``refused``: a privilege the
        database refuses (:class:`BackendRefused`) is retried too (a worker's outcomes: kept until
        the grant is back, rather than dropped)."""
        delay = 0.05
        waited = (BackendUnavailable, BackendRefused) if refused else BackendUnavailable
        while True:
            try:
                return await self.once(fn, params)
            except waited as exc:
                self.counters.backend_errors += 1
                if give_up() or (splits and isinstance(exc, StatementCancelled)):
                    raise
                state = _state(exc)
                log.warning("%s: %s (%s); retrying in %.2fs", what, state, exc, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 5.0)

    async def call_batch(
        self,
        fn: Callable[[P_], R],
        items: Sequence[I],
        params: Callable[[Sequence[I]], P_],
        *,
        give_up: Callable[[], bool] = lambda: False,
        what: str = "backend call",
    ) -> R:
        """:meth:`call` for a statement over a batch of ``items`` whose result is a list (joined) or
        a count (added): a batch the database cancelled (past its ``statement_timeout``) is split in
        halves, each called on its own; one item alone so cancelled is retried like an unavailable
        database. Before, the same batch was retried whole, forever (a heartbeat that never extended
        its leases: every job rescued and run again). The size that fits is kept for later batches
        of the same ``what`` (one warning when it shrinks, not a split and a warning every call)."""
        cap, since = self._batch_caps.get(what, (len(items), 0.0))
        if since and time.monotonic() - since > BATCH_CAP_SECONDS:
            del self._batch_caps[what]
            cap = len(items)
        return await self._in_parts(fn, items, max(cap, 1), params, give_up, what)

    async def _in_parts(
        self,
        fn: Callable[[P_], R],
        items: Sequence[I],
        size: int,
        params: Callable[[Sequence[I]], P_],
        give_up: Callable[[], bool],
        what: str,
    ) -> R:
        result: R | None = None
        for start in range(0, max(len(items), 1), size):
            done = await self._call_part(fn, items[start : start + size], params, give_up, what)
            result = done if result is None else result + done
        assert result is not None
        return result

    async def _call_part(
        self,
        fn: Callable[[P_], R],
        items: Sequence[I],
        params: Callable[[Sequence[I]], P_],
        give_up: Callable[[], bool],
        what: str,
    ) -> R:
        try:
            return await self.call(fn, params(items), give_up=give_up, what=what, splits=len(items) > 1)
        except StatementCancelled as exc:
            if len(items) <= 1:  # the caller gave up on it (give_up): nothing left to split
                raise
            cap = len(items) // 2
            if cap < self._batch_caps.get(what, (len(items), 0.0))[0]:
                self._batch_caps[what] = (cap, time.monotonic())
                log.warning(
                    "%s: the database cancelled a batch of %d (%s); batches of at most %d from now on",
                    what,
                    len(items),
                    exc,
                    cap,
                )
            return await self._in_parts(fn, items, cap, params, give_up, what)

    async def call_limited(
        self,
        fn: Callable[[P_], T],
        limit: int,
        params: Callable[[int], P_],
        *,
        give_up: Callable[[], bool] = lambda: False,
        what: str = "backend call",
    ) -> tuple[T, int]:
        """:meth:`call` for a statement over up to ``limit`` rows (an acquire, a rescue): one the
        database cancelled (past its ``statement_timeout``; it rolled back) is called again for half as
        many rows, down to one, which is retried like an unavailable database. Returns the result and
        the limit it was called with. Before, the same statement was retried forever."""
        while True:
            try:
                return await self.call(fn, params(limit), give_up=give_up, what=what, splits=limit > 1), limit
            except StatementCancelled as exc:
                if limit <= 1:  # the caller gave up on it (give_up)
                    raise
                one = f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"
                log.warning("%s: the database cancelled %s of %d (%s); trying %d", what, one, limit, exc, limit // 2)
                limit //= 2

    def shutdown(self, wait: bool = True) -> None:
        """Close the loop's connections, then (``wait``) wait for the database threads' calls to end."""
        if self._statements is not None:
            self._statements.close()
        self._pool.shutdown(wait=wait)
