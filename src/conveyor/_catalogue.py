"""The catalogue: what an App declares (tasks, queues, schedules) and the lookups the worker needs.

Declaring is the App's job (``@app.task``, ``app.queue``, ``@app.periodic``); the catalogue holds the
declarations and answers the questions asked of them many times a second (the options of a job's
task, a queue's options, how long to lease a queue's jobs), so that the loops take it, not the App."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from conveyor import _clock
from conveyor._cron import Cron
from conveyor._errors import ConfigurationError
from conveyor._limits import INT32_MAX, INT32_MIN, check_duration, check_int, check_name
from conveyor._message import encode_json_object
from conveyor._queue import DEFAULT_DEDUP_WINDOW, QueueOptions
from conveyor._task import DEFAULT_VISIBILITY_TIMEOUT, Task, TaskOptions
from conveyor.backends.base import Schedule

#: Undeclared queues whose default options are kept built (a worker asks once per job).
_DEFAULTS_KEPT = 10_000


class Catalogue:
    """The tasks, queues and schedules of one App.

    ``dedup_window`` is the App-wide default of undeclared queues; ``max_payload_bytes`` bounds
    schedule payloads as it bounds job payloads."""

    def __init__(self, dedup_window: timedelta = DEFAULT_DEDUP_WINDOW, max_payload_bytes: int | None = None) -> None:
        self.dedup_window = check_duration(dedup_window, "dedup_window", ConfigurationError)
        self.max_payload_bytes = max_payload_bytes
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.queues: dict[str, QueueOptions] = {}
        self.schedules: dict[str, Schedule] = {}
        self._defaults: dict[str, QueueOptions] = {}

    # -- tasks -------------------------------------------------------------------------------------

    def add_task(self, task: Task[Any, Any]) -> None:
        """Register ``task``. Raises ConfigurationError if its name is taken."""
        if task.name in self.tasks:
            raise ConfigurationError(f"a task named {task.name!r} is already registered")
        self.tasks[task.name] = task

    def task_options(self, name: str) -> TaskOptions | None:
        """The options of the task registered as ``name`` (None if unknown)."""
        task = self.tasks.get(name)
        return task.options if task else None

    def lease_for(self, queue: str, default: float = DEFAULT_VISIBILITY_TIMEOUT) -> float:
        """The lease taken when a job of ``queue`` is acquired: the longest visibility timeout among
        the queue's tasks (a job's task is only known once it is acquired), else ``default``."""
        leases = [t.options.visibility_timeout for t in self.tasks.values() if t.options.queue == queue]
        return max(leases, default=default)

    def declared_queues(self) -> list[str]:
        """Every queue a registered task declares, by name (``["default"]`` without tasks)."""
        return sorted({t.options.queue for t in self.tasks.values()}) or ["default"]

    # -- queues ------------------------------------------------------------------------------------

    def add_queue(self, options: QueueOptions) -> QueueOptions:
        """Declare a queue's options (replacing earlier ones). The name is checked here."""
        check_name(options.name, "queue", ConfigurationError)
        self.queues[options.name] = options
        return options

    def queue_options(self, name: str) -> QueueOptions:
        """The declared options of a queue, or the defaults for an undeclared one."""
        options = self.queues.get(name)
        if options is None:
            # Workers ask once per job: the defaults of an undeclared queue are built (and checked) once.
            options = self._defaults.get(name)
            if options is None:
                options = QueueOptions(name, dedup_window=self.dedup_window)
                if len(self._defaults) < _DEFAULTS_KEPT:
                    self._defaults[name] = options
        return options

    def dedup_window_of(self, queue: str) -> timedelta:
        """How long an idempotency key of ``queue`` holds its job."""
        options = self.queues.get(queue)
        return options.dedup_window if options is not None else self.dedup_window

    # -- schedules ---------------------------------------------------------------------------------

    def new_schedule(
        self,
        name: str,
        cron: str,
        task: str,
        queue: str | None,
        payload: Mapping[str, Any] | None,
        priority: int,
        now: datetime | None = None,
    ) -> Schedule:
        """A schedule, every field checked as a job of it will be (so that its ticks can fire), its
        first tick the first after ``now`` (default: this host's clock, for a declaration at import).

        ``queue`` None: the task's queue (``default`` for a task not registered here)."""
        parsed = Cron.parse(cron)
        task = check_name(task, "schedule task", ConfigurationError)
        if queue is None:
            options = self.task_options(task)
            queue = options.queue if options else "default"
        return Schedule(
            name=check_name(name, "schedule name", ConfigurationError),
            cron=parsed.expression,
            task=task,
            queue=check_name(queue, "schedule queue", ConfigurationError),
            payload=encode_json_object(payload if payload is not None else {}, "payload", self.max_payload_bytes),
            next_run_at=parsed.next_after(now if now is not None else _clock.host_now()),
            priority=check_int(priority, "priority", INT32_MIN, INT32_MAX, ConfigurationError),
        )

    def add_schedule(self, schedule: Schedule) -> None:
        """Declare a schedule (stored by every worker when it starts)."""
        self.schedules[schedule.name] = schedule
