"""Hand-offs from the worker's threads (the thread slots of ``def`` handlers) to its event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable


class LoopRef:
    """The worker's event loop, as seen from any thread. Unbound (a loop driven round by round, as
    the testing kit does), callbacks run at once in the caller."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def bind(self) -> None:
        """Bind to the running loop (call from a coroutine on it)."""
        self.loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def call(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop: at once on the loop's own thread, else at its next turn."""
        if self.loop is None or threading.get_ident() == self._thread:
            callback()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(callback)
