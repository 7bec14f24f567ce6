"""Insert notifications inside one process: listeners woken through the backend's condition."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class MemoryListener:
    """Wakes an idle fetcher when jobs are inserted into one of its queues.

    An insert that happens while nobody waits is remembered, so the next ``wait`` returns at once:
    a fetcher that found nothing, then waits, cannot miss a job inserted in between."""

    def __init__(self, condition: threading.Condition, queues: Iterable[str], registry: set[MemoryListener]) -> None:
        self._condition = condition
        self.queues = frozenset(queues)
        self._registry = registry
        self._woken = False
        self._closed = False

    def notify(self) -> None:
        """Mark this listener woken; the caller holds the condition and calls ``notify_all``."""
        self._woken = True

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if an insert into one of the queues woke it."""
        with self._condition:
            if not self._closed:
                self._condition.wait_for(lambda: self._woken or self._closed, max(0.0, timeout))
            woken = self._woken
            self._woken = False
            return woken

    def close(self) -> None:
        """Stop listening; a ``wait`` in progress returns (False unless it was woken first)."""
        with self._condition:
            self._closed = True
            self._registry.discard(self)
            self._condition.notify_all()
