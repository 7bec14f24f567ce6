"""What a worker tells observers (metrics, tracing) as it works: one small interface, called by the
fetch, execute and complete loops, with a no-op default so that a worker without observers pays one
method call per event.

Observers are a chain, as dramatiq's middleware: :class:`Observers` calls each in order, and
``after_run`` in reverse order, so that a tracer that opened the span around the handler closes it
after the metrics it encloses were recorded."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.backends.base import Delivery, Finish, RetryItem

Outcome = Finish | RetryItem


def outcome_name(outcome: Outcome | None) -> str:
    """``completed``, ``retried``, ``dead``, ``expired``, ``cancelled``; ``lost`` for no outcome."""
    if outcome is None:
        return "lost"
    return "retried" if isinstance(outcome, RetryItem) else outcome.state


class Observer:
    """Hooks a worker calls; every one does nothing by default. They must not block (no I/O): record,
    and let a scrape or an exporter thread do the rest. They run on the worker's event loop, except
    ``before_run``/``after_run`` of a plain ``def`` handler, which run in the handler's own thread
    (so a span opened there is current in the handler): an observer must be thread-safe."""

    def fetched(self, queue: str, deliveries: int) -> None:
        """One acquire leased ``deliveries`` jobs of ``queue`` (0 too: the batch-size histogram needs it)."""

    def before_run(self, delivery: Delivery, now: datetime) -> Any:
        """The handler of ``delivery`` is about to start; returns a token handed to ``after_run``."""
        return None

    def after_run(self, delivery: Delivery, outcome: Outcome | None, seconds: float, token: Any) -> None:
        """The handler returned or raised after ``seconds``; ``outcome`` is what was decided."""

    def flushed(self, kind: str, items: Sequence[Outcome], applied: int, queues: Sequence[tuple[str, str]]) -> None:
        """The completer wrote ``items`` of one ``kind`` (finish, retry) in one statement; ``applied``
        of them matched their delivery (the rest were stale acks). ``queues`` pairs each item with its
        (queue, task)."""


class Observers(Observer):
    """Several observers as one, in order (``after_run`` in reverse)."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = list(observers)

    def fetched(self, queue: str, deliveries: int) -> None:
        for o in self.observers:
            o.fetched(queue, deliveries)

    def before_run(self, delivery: Delivery, now: datetime) -> Any:
        return [o.before_run(delivery, now) for o in self.observers]

    def after_run(self, delivery: Delivery, outcome: Outcome | None, seconds: float, token: Any) -> None:
        for o, t in reversed(list(zip(self.observers, token, strict=True))):
            o.after_run(delivery, outcome, seconds, t)

    def flushed(self, kind: str, items: Sequence[Outcome], applied: int, queues: Sequence[tuple[str, str]]) -> None:
        for o in self.observers:
            o.flushed(kind, items, applied, queues)


#: The observer of a worker that has none.
NO_OBSERVER = Observer()
