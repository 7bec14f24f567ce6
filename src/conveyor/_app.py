"""The App: the task registry and the producer API."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, TypeVar, overload
from uuid import UUID

from conveyor._admin import Admin
from conveyor._cron import Cron
from conveyor._errors import ConfigurationError, JobNotFoundError, PayloadError, QueueFull
from conveyor._ids import MintedId
from conveyor._job import Job, JobStatus
from conveyor._limits import (
    GOOD_NAMES,
    INT32_MAX,
    INT32_MIN,
    MAX_ATTEMPTS,
    check_duration,
    check_int,
    check_key,
    check_name,
)
from conveyor._message import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Message,
    encode_headers,
    encode_json_object,
    resolve_times,
    utcnow,
)
from conveyor._queue import ExpirePolicy, QueuePolicy
from conveyor._retry import Backoff, ExponentialBackoff, FixedSchedule
from conveyor._task import DEFAULT_DEAD_ON, AckPolicy, Task, TaskOptions
from conveyor._topics import matches, parse_filter
from conveyor.backends import DEFAULT_DATABASE_URL, open_backend
from conveyor.backends.base import (
    Backend,
    JobsInsertParams,
    NewJob,
    QueueLoadParams,
    Schedule,
    SchedulesUpsertParams,
    Subscription,
    SubscriptionsDeleteParams,
    SubscriptionsListParams,
    SubscriptionsUpsertParams,
)

P = ParamSpec("P")
R = TypeVar("R")

#: How long an idempotency key holds its job by default (per queue; SQS FIFO uses 5 minutes,
#: we keep a day because producers retry across deploys and outages).
DEFAULT_DEDUP_WINDOW = timedelta(hours=24)


class _TaskDecorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class App:
    """A Conveyor application: where tasks are registered and jobs are sent.

    ``database_url`` defaults to ``$CONVEYOR_DATABASE_URL``, else the embedded SQLite file
    ``sqlite:///conveyor.db``. The schema is migrated on first use of the embedded default
    (SQLite); PostgreSQL schemas are migrated by ``conveyor migrate`` (or ``migrate=True``)."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        backend: Backend | None = None,
        migrate: bool | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: timedelta = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        self.database_url = database_url or os.environ.get("CONVEYOR_DATABASE_URL") or DEFAULT_DATABASE_URL
        self._backend = backend
        self._admin: Admin | None = None
        self._migrate = migrate
        self._lock = threading.Lock()
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 1, 2**30, ConfigurationError)
        self.dedup_window = check_duration(dedup_window, "dedup_window", ConfigurationError)
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.queues: dict[str, QueuePolicy] = {}
        self._default_policies: dict[str, QueuePolicy] = {}
        self.schedules: dict[str, Schedule] = {}
        # Backpressure reads the queue's depth at most every 100 ms and counts its own sends in
        # between, so that a hot producer does not add a COUNT per send.
        self._loads: dict[str, tuple[float, int, int]] = {}

    # -- storage -------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The storage backend, opened (and, for SQLite, migrated) on first use."""
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    backend = open_backend(self.database_url)
                    migrate = self._migrate if self._migrate is not None else backend.engine in ("sqlite", "memory")
                    if migrate:
                        backend.migrate()
                    self._backend = backend
        return self._backend

    @property
    def admin(self) -> Admin:
        """The operator API: queue stats, dead letters (replay, purge), audit, schedules, topics."""
        if self._admin is None:
            self._admin = Admin(self)
        return self._admin

    def close(self) -> None:
        """Close the backend's connections."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tasks ---------------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 5,
        max_deliveries: int | None = None,
        backoff: Backoff | Sequence[float] | None = None,
        dead_on: Iterable[type[BaseException]] | None = None,
        timeout: float | None = None,
        visibility_timeout: float = 30.0,
        keep_result: bool = True,
        ack_policy: AckPolicy = "auto",
        priority: int = 0,
        version: int = 1,
    ) -> _TaskDecorator: ...

    def task(  # type: ignore[misc]
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 5,
        max_deliveries: int | None = None,
        backoff: Backoff | Sequence[float] | None = None,
        dead_on: Iterable[type[BaseException]] | None = None,
        timeout: float | None = None,
        visibility_timeout: float = 30.0,
        keep_result: bool = True,
        ack_policy: AckPolicy = "auto",
        priority: int = 0,
        version: int = 1,
    ) -> Task[P, R] | _TaskDecorator:
        """Register a handler as a task (usable bare, ``@app.task``, or with options).

        ``backoff`` is an :class:`ExponentialBackoff` (default base 1 s, cap 1 h, full jitter), a
        :class:`FixedSchedule`, or a list of delays in seconds. ``dead_on`` lists exception types
        that dead-letter at once (default ValueError, KeyError, TypeError)."""
        if isinstance(backoff, Sequence):
            backoff = FixedSchedule(list(backoff))
        options = TaskOptions(
            queue=queue,
            max_attempts=max_attempts,
            max_deliveries=max_deliveries,
            backoff=backoff or ExponentialBackoff(),
            dead_on=tuple(dead_on) if dead_on is not None else DEFAULT_DEAD_ON,
            timeout=timeout,
            visibility_timeout=visibility_timeout,
            keep_result=keep_result,
            ack_policy=ack_policy,
            priority=priority,
            version=version,
        )

        def register(f: Callable[P, R]) -> Task[P, R]:
            task_name = check_name(
                name if name is not None else f"{_module_name(f)}.{f.__qualname__}", "task name", ConfigurationError
            )
            if task_name in self.tasks:
                raise ConfigurationError(f"a task named {task_name!r} is already registered")
            registered = Task(self, task_name, f, options)
            self.tasks[task_name] = registered
            return registered

        return register(fn) if fn is not None else register  # type: ignore[return-value]

    def task_options(self, name: str) -> TaskOptions | None:
        """The options of the task registered as ``name`` (None if unknown)."""
        task = self.tasks.get(name)
        return task.options if task else None

    # -- queues ----------------------------------------------------------------------------------

    def queue(
        self,
        name: str,
        *,
        dedup_window: timedelta | None = None,
        max_depth: int | None = None,
        shedding: Mapping[str, float] | None = None,
        sla: timedelta | None = None,
        retention: timedelta | None = None,
        dead_retention: timedelta | None = None,
        on_expire: ExpirePolicy = "expired",
        concurrency: int | None = None,
        ordered: bool = False,
    ) -> QueuePolicy:
        """Declare a queue's policy (its part of the queue contract); returns it.

        ``max_depth`` turns on backpressure: past ``shedding[class] * max_depth`` live jobs, sends of
        that priority class (low < 0, normal 0, high > 0) raise QueueFull. Defaults: dedup window
        from the App, retention 7 days, dead letters 14 days, expired jobs end ``expired``. Raises
        ConfigurationError for a bad name or a value out of range."""
        check_name(name, "queue", ConfigurationError)
        defaults = QueuePolicy(name)
        policy = QueuePolicy(
            name=name,
            dedup_window=dedup_window if dedup_window is not None else self.dedup_window,
            max_depth=max_depth,
            shedding=dict(shedding) if shedding is not None else dict(defaults.shedding),
            sla=sla,
            retention=retention if retention is not None else defaults.retention,
            dead_retention=dead_retention if dead_retention is not None else defaults.dead_retention,
            on_expire=on_expire,
            concurrency=concurrency,
            ordered=ordered,
        )
        self.queues[name] = policy
        return policy

    def queue_policy(self, name: str) -> QueuePolicy:
        """The declared policy of a queue, or the defaults for an undeclared one."""
        policy = self.queues.get(name)
        if policy is None:
            # Workers ask once per job: the defaults of an undeclared queue are built (and checked) once.
            policy = self._default_policies.get(name)
            if policy is None:
                policy = QueuePolicy(name, dedup_window=self.dedup_window)
                if len(self._default_policies) < 10_000:
                    self._default_policies[name] = policy
        return policy

    def _check_backpressure(self, rows: Sequence[NewJob], now: datetime) -> None:
        by_queue: dict[str, list[NewJob]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(row)
        for queue, queued in by_queue.items():
            policy = self.queues.get(queue)
            if policy is None or policy.max_depth is None:
                continue
            refusal = self._refusal(policy, queued, self._load(queue, now, fresh=False))
            if refusal is not None:
                # The cached depth may count jobs that have drained since: refuse only on a fresh reading.
                refusal = self._refusal(policy, queued, self._load(queue, now, fresh=True))
            if refusal is not None:
                raise refusal
            tick, depth, drained = self._loads[queue]
            self._loads[queue] = (tick, depth + len(queued), drained)

    @staticmethod
    def _refusal(policy: QueuePolicy, queued: Sequence[NewJob], load: tuple[int, int]) -> QueueFull | None:
        depth, drained = load
        window = 60.0
        for row in queued:
            limit = policy.limit_for(row.priority)
            assert limit is not None
            if depth + 1 > limit:
                rate = drained / window
                excess = depth + 1 - limit
                retry_after = excess / rate if rate > 0 else window
                return QueueFull(policy.name, depth, limit, max(0.1, min(retry_after, 3600.0)))
            depth += 1
        return None

    def _load(self, queue: str, now: datetime, fresh: bool) -> tuple[int, int]:
        """(live depth, jobs drained in the last minute), read at most every 100 ms unless ``fresh``."""
        cached = self._loads.get(queue)
        tick = time.monotonic()
        if fresh or cached is None or tick - cached[0] > 0.1:
            load = self.backend.queue_load(QueueLoadParams(queue, now, window=60.0))
            cached = (tick, load.depth, load.drained)
            self._loads[queue] = cached
        return cached[1], cached[2]

    # -- topics ----------------------------------------------------------------------------------

    def subscribe(
        self, topic: str, queue: str, task: str | Task[Any, Any], filter: Mapping[str, Any] | None = None
    ) -> Subscription:
        """Bind ``queue`` to ``topic``: messages published there whose headers match ``filter``
        (``{"header": value}`` or ``{"header": {"in": [...]}}``) become jobs for ``task`` on ``queue``.
        Stored in the database, so it applies to every producer at once."""
        name = task.name if isinstance(task, Task) else task
        check_name(topic, "topic", ConfigurationError)
        check_name(queue, "queue", ConfigurationError)
        check_name(name, "task", ConfigurationError)
        parsed = parse_filter(filter)
        encode_json_object(parsed, "filter")  # what a payload must be: no NUL, valid Unicode, not too deep
        subscription = Subscription(topic, queue, name, json.dumps(parsed, separators=(",", ":"), sort_keys=True))
        self.backend.subscriptions_upsert(SubscriptionsUpsertParams([subscription]))
        return subscription

    def unsubscribe(self, topic: str, queue: str) -> bool:
        """Remove the subscription of ``queue`` to ``topic``; False if there was none."""
        return self.backend.subscriptions_delete(SubscriptionsDeleteParams(topic, queue))

    def publish(
        self,
        topic: str,
        payload: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, Any] | None = None,
        conn: Any = None,
        **envelope: Any,
    ) -> list[Job]:
        """Copy a message to every queue subscribed to ``topic`` whose filter matches ``headers``,
        in one transaction; return one job per matching subscription (each retries and
        dead-letters on its own). No matching subscription: nothing is enqueued, ``[]``."""
        check_name(topic, "topic")
        subscriptions = self.backend.subscriptions_list(SubscriptionsListParams(topic))
        merged = {**(headers or {}), "topic": topic}
        messages = []
        for sub in subscriptions:
            if matches(json.loads(sub.filter), merged):
                try:
                    messages.append(
                        Message(task=sub.task, payload=payload or {}, queue=sub.queue, headers=merged, **envelope)
                    )
                except TypeError as exc:
                    raise PayloadError(f"bad publish option: {exc}") from None
        return self.send_many(messages, conn=conn)

    # -- schedules -------------------------------------------------------------------------------

    def periodic(
        self,
        cron: str,
        *,
        name: str | None = None,
        payload: Mapping[str, Any] | None = None,
        priority: int = 0,
        **task_options: Any,
    ) -> _TaskDecorator:
        """Register a task and a schedule that enqueues it on every tick of ``cron`` (UTC).

        Workers store declared schedules in the database when they start and fire each tick once,
        however many of them run; schedules can then be listed, paused, changed or added from the CLI
        (``conveyor schedules``) without a restart."""
        Cron.parse(cron)  # a bad expression fails here, before the task is registered
        if name is not None:
            check_name(name, "schedule name", ConfigurationError)

        def register(fn: Callable[P, R]) -> Task[P, R]:
            task: Task[P, R] = self.task(**task_options)(fn)
            schedule = self._new_schedule(name or task.name, cron, task.name, task.options.queue, payload, priority)
            self.schedules[schedule.name] = schedule
            return task

        return register

    def add_schedule(
        self,
        name: str,
        cron: str,
        task: str | Task[Any, Any],
        *,
        queue: str | None = None,
        payload: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> Schedule:
        """Store (or redefine) a schedule in the database: workers fire it from its next tick, no
        restart needed. ``queue`` defaults to the task's queue (``default`` for a task this App does
        not know). Raises ConfigurationError for a bad name or cron expression and PayloadError for
        a payload that is not a JSON object within the limits; nothing is written then."""
        task_name = task.name if isinstance(task, Task) else task
        if queue is None:
            options = self.task_options(task_name) if isinstance(task_name, str) else None
            queue = options.queue if options else "default"
        schedule = self._new_schedule(name, cron, task_name, queue, payload, priority)
        self.backend.schedules_upsert(SchedulesUpsertParams([schedule]))
        return schedule

    def _new_schedule(
        self, name: str, cron: str, task: str, queue: str, payload: Mapping[str, Any] | None, priority: int
    ) -> Schedule:
        """A schedule, every field checked as a job of it will be (so that its ticks can fire)."""
        parsed = Cron.parse(cron)
        return Schedule(
            name=check_name(name, "schedule name", ConfigurationError),
            cron=parsed.expression,
            task=check_name(task, "schedule task", ConfigurationError),
            queue=check_name(queue, "schedule queue", ConfigurationError),
            payload=encode_json_object(payload if payload is not None else {}, "payload", self.max_payload_bytes),
            next_run_at=parsed.next_after(utcnow()),
            priority=check_int(priority, "priority", INT32_MIN, INT32_MAX, ConfigurationError),
        )

    # -- producing -----------------------------------------------------------------------------

    def send(
        self,
        task: str | Task[Any, Any],
        payload: Mapping[str, Any] | None = None,
        *,
        conn: Any = None,
        **envelope: Any,
    ) -> Job:
        """Enqueue one job and return its handle at once.

        ``envelope`` takes the :class:`Message` fields (``queue``, ``priority``, ``delay``,
        ``run_at``, ``ttl``, ``expires_at``, ``idempotency_key``, ``ordering_key``, ``headers``,
        ``max_attempts``). ``conn`` is your own open connection: the job then commits or rolls back
        with your transaction. A duplicate ``idempotency_key`` inside the dedup window returns the
        existing job. Raises PayloadError, with nothing written, for a payload that is not JSON or is
        past a limit, and for any field out of range: a name or key too long or not valid Unicode, a
        NaN or infinite delay/ttl, a priority outside 32 bits, max_attempts outside 1..1,000,000 (see
        the README's Limits)."""
        name = task.name if isinstance(task, Task) else task
        try:
            message = Message(task=name, payload=payload or {}, **envelope)
        except TypeError as exc:
            raise PayloadError(f"bad send option: {exc}") from None
        return self.send_many([message], conn=conn)[0]

    def send_many(self, messages: Sequence[Message], *, conn: Any = None) -> list[Job]:
        """Enqueue many jobs in one round trip; return their handles in order (duplicates inside
        the dedup window return the existing job's handle)."""
        if not messages:
            return []
        now = utcnow()
        rows = _NewJobs(self._new_job, messages, now)
        if self.queues:
            self._check_backpressure(rows, now)
        ids = self.backend.jobs_insert_many(JobsInsertParams(rows, now, conn))
        return [Job(self, job_id) for job_id in ids]

    async def send_async(
        self, task: str | Task[Any, Any], payload: Mapping[str, Any] | None = None, **envelope: Any
    ) -> Job:
        """Like :meth:`send`, without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.send(task, payload, **envelope))

    async def send_many_async(self, messages: Sequence[Message]) -> list[Job]:
        """Like :meth:`send_many`, without blocking the event loop."""
        return await asyncio.to_thread(self.send_many, messages)

    def _new_job(self, message: Message, now: datetime) -> NewJob:
        # The hot path of send_many: kept to plain lookups (a 20,000-job batch calls it 20,000 times).
        # Every field is checked here, above the seam, so that no engine ever sees a value another
        # engine would refuse (conveyor._limits).
        task = message.task
        if type(task) is not str or task not in GOOD_NAMES:
            check_name(task, "task")
        options = self.task_options(task)
        queue = message.queue
        if queue is None:
            queue = options.queue if options else "default"
        elif type(queue) is not str or queue not in GOOD_NAMES:
            check_name(queue, "queue")
        max_attempts = message.max_attempts
        if max_attempts is None:
            max_attempts = options.max_attempts if options else 5
        elif type(max_attempts) is not int or not 1 <= max_attempts <= MAX_ATTEMPTS:
            max_attempts = check_int(max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        max_deliveries = options.deliveries_limit if options else max_attempts + 5
        priority = message.priority
        if priority is None:
            priority = options.priority if options else 0
        elif type(priority) is not int or not INT32_MIN <= priority <= INT32_MAX:
            priority = check_int(priority, "priority", INT32_MIN, INT32_MAX)
        if message.delay is None and message.run_at is None and message.ttl is None and message.expires_at is None:
            run_at, expires_at = now, None
        else:
            run_at, expires_at = resolve_times(message, now)
        idempotency_key = message.idempotency_key
        if idempotency_key is not None:
            check_key(idempotency_key, "idempotency_key")
            policy = self.queues.get(queue)
            dedup_until: datetime | None = now + (policy.dedup_window if policy else self.dedup_window)
        else:
            dedup_until = None
        if message.ordering_key is not None:
            check_key(message.ordering_key, "ordering_key")
        return NewJob(
            message.id,
            queue,
            task,
            encode_json_object(message.payload, "payload", self.max_payload_bytes),
            encode_headers(message.headers, message.id, self.max_payload_bytes),
            priority,
            run_at,
            max_attempts,
            max(max_deliveries, max_attempts),
            expires_at,
            idempotency_key,
            message.ordering_key,
            None,
            dedup_until,
            type(message.id) is MintedId and message.id.first_use(),
        )

    # -- reading -------------------------------------------------------------------------------

    def job(self, job_id: UUID | str) -> JobStatus:
        """The status of a job (live or archived). Raises JobNotFoundError."""
        try:
            uid = job_id if isinstance(job_id, UUID) else UUID(str(job_id))
        except ValueError:
            raise JobNotFoundError(f"not a job id: {job_id!r}") from None
        return Job(self, uid).status()

    def handle(self, job_id: UUID) -> Job:
        """A handle on a job by id, without reading it."""
        return Job(self, job_id)


class _NewJobs(Sequence[NewJob]):
    """The rows of one send_many, each built (validated and encoded) when it is first read.

    A backend that streams the rows to its database (PostgreSQL's COPY) thus encodes one job while
    the server is still inserting the previous ones, instead of encoding the whole batch first.
    A message that does not validate raises PayloadError when its row is read, and the backend's
    transaction rolls back."""

    __slots__ = ("_build", "_messages", "_now", "_rows")

    def __init__(
        self, build: Callable[[Message, datetime], NewJob], messages: Sequence[Message], now: datetime
    ) -> None:
        self._build = build
        self._messages = messages
        self._now = now
        self._rows: list[NewJob] = []

    def __len__(self) -> int:
        return len(self._messages)

    def _build_to(self, stop: int) -> None:
        rows, build, messages, now = self._rows, self._build, self._messages, self._now
        for i in range(len(rows), min(stop, len(messages))):
            rows.append(build(messages[i], now))

    @overload
    def __getitem__(self, index: int) -> NewJob: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[NewJob]: ...
    def __getitem__(self, index: int | slice) -> NewJob | Sequence[NewJob]:
        if isinstance(index, slice) or index < 0:
            self._build_to(len(self._messages))
        else:
            self._build_to(index + 1)
        return self._rows[index]

    def __iter__(self) -> Iterator[NewJob]:
        rows, build, messages, now = self._rows, self._build, self._messages, self._now
        for i, message in enumerate(messages):
            if i == len(rows):
                rows.append(build(message, now))
            yield rows[i]


def _module_name(fn: Callable[..., Any]) -> str:
    """The importable module name of ``fn``: under ``python -m pkg.mod`` a task defined in
    ``__main__`` gets the name a worker importing ``pkg.mod`` will also see."""
    module = fn.__module__
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if spec is not None and spec.name:
            return str(spec.name)
    return module
