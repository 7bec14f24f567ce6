"""The shape of every worker loop: ``run_once()`` does one round and returns what it did, ``run()``
repeats it until ``stop()``.

A test calls ``run_once()`` instead of sleeping. A loop that ticks on an interval inherits ``run()``:
it waits ``next_interval()`` seconds (or until stopped), runs a round, and logs a round that fails;
after ``max_failures`` failed rounds in a row the loop ends with the error, and the worker stops
non-zero so that a supervisor restarts it; a damaged database ends it at the first failure. (A
database that is away is not a failure: backend calls retry it themselves.) Event-driven loops
(fetch, complete, execute) override ``run()``."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from conveyor._errors import BackendCorrupt, BackendError

log = logging.getLogger("conveyor.worker")


class Service:
    """A worker loop. Subclasses set ``name`` and ``interval`` and implement ``run_once()``.

    ``run_first``: run a round at once when started, then wait (else wait first)."""

    name = "loop"
    interval = 1.0
    run_first = False
    max_failures = 5
    #: End at the first failure that says the database is damaged (a worker's loops: the worker then
    #: stops, exit EXIT_DAMAGED); a loop that must outlive it (the HTTP service's alerts) says False.
    ends_on_damage = True

    def __init__(self) -> None:
        self._stopped = asyncio.Event()
        self.failures = 0

    async def run_once(self) -> int:
        """One round; return how much it did (jobs, rows, ticks)."""
        raise NotImplementedError

    def next_interval(self) -> float:
        """Seconds to wait before the next round."""
        return self.interval

    def due(self) -> bool:
        """Whether the round after this wait should run (a loop that wakes often to re-read what it
        holds says no until its own interval has passed)."""
        return True

    @property
    def stopping(self) -> bool:
        return self._stopped.is_set()

    def stop(self) -> None:
        """Ask the loop to end; ``run()`` returns after the round under way."""
        self._stopped.set()

    async def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until stopped; True if stopped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), timeout=max(0.0, seconds))
        return self._stopped.is_set()

    async def run(self) -> None:
        """Run rounds every ``next_interval()`` seconds until stopped."""
        first = self.run_first
        while not self.stopping:
            if not first:
                if await self.sleep(self.next_interval()):
                    return
                if not self.due():
                    continue
            first = False
            try:
                await self.run_once()
            except Exception as exc:
                if self.ends_on_damage and isinstance(exc, BackendCorrupt):
                    raise  # whoever runs the loop says so, once
                self.failures += 1
                if isinstance(exc, BackendError):  # the database's message says what; no traceback
                    log.error("%s failed (%d in a row): %s", self.name, self.failures, exc)
                else:
                    log.exception("%s failed (%d in a row)", self.name, self.failures)
                if self.failures >= self.max_failures:
                    raise
            else:
                self.failures = 0
