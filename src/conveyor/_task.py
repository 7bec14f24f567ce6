"""Tasks: a handler function plus the policy its jobs run under."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar

from conveyor._retry import Backoff, ExponentialBackoff

if TYPE_CHECKING:
    from conveyor._app import App
    from conveyor._job import Job

P = ParamSpec("P")
R = TypeVar("R")

AckPolicy = Literal["auto", "manual"]

#: Exceptions that no retry can fix: the payload or the code is wrong. They dead-letter at once.
DEFAULT_DEAD_ON: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """The policy of one task's jobs (see DESIGN §2)."""

    queue: str = "default"
    max_attempts: int = 5
    #: Deliveries allowed before a job counts as poison (None: ``max_attempts + 5``).
    max_deliveries: int | None = None
    backoff: Backoff = field(default_factory=ExponentialBackoff)
    dead_on: tuple[type[BaseException], ...] = DEFAULT_DEAD_ON
    #: Seconds a handler may run before it is treated as a transient failure (None: no limit).
    timeout: float | None = None
    visibility_timeout: float = 30.0
    keep_result: bool = True
    ack_policy: AckPolicy = "auto"
    priority: int = 0
    #: The newest ``schema_version`` header this handler understands; newer jobs dead-letter.
    version: int = 1

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.visibility_timeout <= 0:
            raise ValueError(f"visibility_timeout must be > 0, got {self.visibility_timeout}")
        if self.max_deliveries is not None and self.max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, got {self.max_deliveries}")

    @property
    def deliveries_limit(self) -> int:
        """The delivery count past which a job is dead-lettered without running."""
        return self.max_deliveries if self.max_deliveries is not None else self.max_attempts + 5


class Task(Generic[P, R]):
    """A registered handler. Call it to run it inline; ``delay``/``send`` enqueue a job for it."""

    def __init__(self, app: App, name: str, fn: Callable[P, R], options: TaskOptions) -> None:
        self.app = app
        self.name = name
        self.fn = fn
        self.options = options
        self.is_async = inspect.iscoroutinefunction(fn)
        # A handler that declares a ``ctx`` parameter receives the JobContext as that keyword.
        self.wants_context = "ctx" in inspect.signature(fn).parameters

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.options.queue}>"

    def delay(self, **payload: Any) -> Job:
        """Enqueue a job with ``payload`` as the handler's keyword arguments; return its handle."""
        return self.app.send(self.name, payload)

    async def delay_async(self, **payload: Any) -> Job:
        """Like :meth:`delay`, without blocking the event loop."""
        return await self.app.send_async(self.name, payload)

    def send(self, payload: Mapping[str, Any] | None = None, **options: Any) -> Job:
        """Enqueue with envelope options (``delay``, ``priority``, ``idempotency_key``, ``conn``...)."""
        return self.app.send(self.name, payload, **options)
