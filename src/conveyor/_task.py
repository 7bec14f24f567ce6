"""Tasks: a handler function plus the policy its jobs run under."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, Protocol, TypeVar

from conveyor._backoff import Backoff, ExponentialBackoff
from conveyor._errors import ConfigurationError, PayloadError
from conveyor._limits import (
    INT32_MAX,
    INT32_MIN,
    MAX_ATTEMPTS,
    MIN_VISIBILITY_TIMEOUT,
    check_int,
    check_name,
    check_seconds,
)

if TYPE_CHECKING:
    from conveyor._job import Job

P = ParamSpec("P")
R = TypeVar("R")

AckPolicy = Literal["auto", "manual"]

#: Exceptions that no retry can fix: the payload or the code is wrong. They dead-letter at once.
DEFAULT_DEAD_ON: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError)
#: Attempts before a job that keeps failing is dead-lettered (``max_attempts_exceeded``).
DEFAULT_MAX_ATTEMPTS = 5
#: Starts beyond ``max_attempts`` that a job may take without an outcome (its worker died or hung)
#: before poison protection dead-letters it (``max_deliveries = max_attempts + DELIVERY_MARGIN``).
DELIVERY_MARGIN = 5
#: Seconds a job is leased to a worker before it counts as lost (heartbeats extend it while it runs).
DEFAULT_VISIBILITY_TIMEOUT = 30.0


def deliveries_limit(max_attempts: int, max_deliveries: int | None = None) -> int:
    """The number of counted starts after which a job is dead-lettered without running."""
    return max_deliveries if max_deliveries is not None else max_attempts + DELIVERY_MARGIN


class Sender(Protocol):
    """What a task enqueues through (the App)."""

    def send(self, task: str, payload: Mapping[str, Any] | None = None, **envelope: Any) -> Job: ...

    async def send_async(self, task: str, payload: Mapping[str, Any] | None = None, **envelope: Any) -> Job: ...

    def _send_payloads(self, task: str, payloads: Sequence[Mapping[str, Any]], conn: Any) -> list[Job]: ...


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """The policy of one task's jobs (see DESIGN §2). Raises ConfigurationError for a value out of
    range: a bad queue name, max_attempts or max_deliveries outside 1..1,000,000, a timeout that is
    not a finite positive number of seconds (NaN, infinity), a priority outside 32 bits."""

    queue: str = "default"
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: Counted starts allowed before a job counts as poison (None: ``max_attempts + DELIVERY_MARGIN``).
    max_deliveries: int | None = None
    backoff: Backoff = field(default_factory=ExponentialBackoff)
    dead_on: tuple[type[BaseException], ...] = DEFAULT_DEAD_ON
    #: Seconds a handler may run before it is treated as a transient failure (None: no limit).
    timeout: float | None = None
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT
    keep_result: bool = True
    ack_policy: AckPolicy = "auto"
    priority: int = 0
    #: The newest ``schema_version`` header this handler understands; newer jobs dead-letter.
    version: int = 1

    def __post_init__(self) -> None:
        """Raise ConfigurationError for an option no job could run under (conveyor._limits)."""
        error = ConfigurationError
        # The checked values are kept, as plain str and int (an Enum member becomes its value).
        setattr_ = object.__setattr__
        setattr_(self, "queue", check_name(self.queue, "queue", error))
        setattr_(self, "max_attempts", check_int(self.max_attempts, "max_attempts", 1, MAX_ATTEMPTS, error))
        if self.max_deliveries is not None:
            setattr_(self, "max_deliveries", check_int(self.max_deliveries, "max_deliveries", 1, MAX_ATTEMPTS, error))
        if isinstance(self.backoff, type) or not callable(getattr(self.backoff, "delay", None)):
            raise error(
                f"backoff must be an ExponentialBackoff, a FixedSchedule or a list of seconds, got {self.backoff!r}"
            )
        if not isinstance(self.dead_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.dead_on
        ):
            raise error(f"dead_on must list exception classes, got {self.dead_on!r}")
        if self.timeout is not None:
            check_seconds(self.timeout, "timeout", error, strict=True)
        check_seconds(self.visibility_timeout, "visibility_timeout", error, minimum=MIN_VISIBILITY_TIMEOUT)
        if self.ack_policy not in ("auto", "manual"):
            raise error(f"ack_policy must be 'auto' or 'manual', got {self.ack_policy!r}")
        setattr_(self, "priority", check_int(self.priority, "priority", INT32_MIN, INT32_MAX, error))
        setattr_(self, "version", check_int(self.version, "version", 1, INT32_MAX, error))

    @property
    def deliveries_limit(self) -> int:
        """The number of counted starts after which a job is dead-lettered without running."""
        return deliveries_limit(self.max_attempts, self.max_deliveries)


class Task(Generic[P, R]):
    """A registered handler. Call it to run it inline; ``delay``/``send`` enqueue a job for it."""

    def __init__(self, sender: Sender, name: str, fn: Callable[P, R], options: TaskOptions) -> None:
        self._sender = sender
        self.name = name
        self.fn = fn
        self.options = options
        # Through decorators that keep functools.wraps: a plain function wrapping an ``async def``
        # returns its coroutine, which must be awaited (run in a thread, it was never awaited: the
        # job completed without running).
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn))
        # A handler that declares a ``ctx`` parameter receives the JobContext as that keyword.
        self.wants_context = "ctx" in inspect.signature(fn).parameters

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.options.queue}>"

    def delay(self, **payload: Any) -> Job:
        """Enqueue a job with ``payload`` as the handler's keyword arguments; return its handle."""
        return self._sender.send(self.name, payload)

    async def delay_async(self, **payload: Any) -> Job:
        """Like :meth:`delay`, without blocking the event loop."""
        return await self._sender.send_async(self.name, payload)

    def send(self, payload: Mapping[str, Any] | None = None, **options: Any) -> Job:
        """Enqueue with envelope options (``delay``, ``priority``, ``idempotency_key``, ``conn``...)."""
        return self._sender.send(self.name, payload, **options)

    def delay_many(self, payloads: Iterable[Mapping[str, Any]], *, conn: Any = None) -> list[Job]:
        """Enqueue one job per payload (each the handler's keyword arguments) in one round trip,
        as ``App.send_many`` does with a ``Message(task, payload)`` each; return their handles in
        order. The fields the jobs share are worked out once, so this is the fastest way to send
        many jobs of one task. ``conn`` as in :meth:`send`.

        Raises PayloadError, with nothing written, if any payload is not a JSON object or is past a
        limit."""
        if isinstance(payloads, (str, bytes, Mapping)) or not isinstance(payloads, Iterable):
            raise PayloadError(f"delay_many takes a list of payloads (dicts), not one {type(payloads).__name__}")
        return self._sender._send_payloads(self.name, list(payloads), conn)

    async def delay_many_async(self, payloads: Iterable[Mapping[str, Any]]) -> list[Job]:
        """Like :meth:`delay_many`, without blocking the event loop."""
        return await asyncio.to_thread(self.delay_many, payloads)
