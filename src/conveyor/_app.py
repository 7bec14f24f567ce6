"""The App: what a user declares (tasks, queues, schedules, topics) and sends, in one facade.

The App holds no rule of its own: the catalogue (``_catalogue``) keeps the declarations, the producer
(``_producer``) validates and inserts jobs, the load gauge (``_load``) applies backpressure, and the
operator API (``_admin``) acts on the database; the App wires them to one lazily opened backend."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, ParamSpec, Protocol, TypeVar, overload
from uuid import UUID

from conveyor._admin import Admin
from conveyor._backoff import Backoff, ExponentialBackoff, FixedSchedule
from conveyor._catalogue import Catalogue
from conveyor._clock import DatabaseClock
from conveyor._cron import Cron
from conveyor._errors import ConfigurationError, JobNotFoundError, PayloadError
from conveyor._job import Job, JobStatus
from conveyor._limits import INT32_MAX, INT32_MIN, check_int, check_name, preview
from conveyor._message import DEFAULT_MAX_PAYLOAD_BYTES, Message, encode_json_object
from conveyor._producer import Producer
from conveyor._queue import DEFAULT_DEDUP_WINDOW, ExpireAction, QueueOptions
from conveyor._task import (
    DEFAULT_DEAD_ON,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_VISIBILITY_TIMEOUT,
    AckPolicy,
    Task,
    TaskOptions,
)
from conveyor._topics import parse_filter, published
from conveyor.backends import DEFAULT_DATABASE_URL, in_memory_url, open_backend, same_database
from conveyor.backends._redact import redact_url
from conveyor.backends.base import (
    Backend,
    Schedule,
    Subscription,
    SubscriptionsDeleteParams,
    SubscriptionsUpsertParams,
)

P = ParamSpec("P")
R = TypeVar("R")


class _TaskDecorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


# Every App, so that a forked child can leave its parent's connections alone (see _after_fork).
_apps: weakref.WeakSet[App] = weakref.WeakSet()
# The backends a forked child inherited: kept, never closed. Closing a PostgreSQL connection says goodbye
# to the server on the socket the parent still uses (freeing one does not: psycopg skips that in a child),
# and a pool collected here would wait for worker threads that did not survive the fork.
_inherited: list[Backend] = []


def _after_fork() -> None:
    """In a forked child (multiprocessing, a preloading server): each App opens connections of its own
    at its next call. Parent and child used the same ones before: a child hung, and both got "prepared
    statement already exists" from a session the other was using."""
    for app in list(_apps):
        app._forked()


os.register_at_fork(after_in_child=_after_fork)


def _new_memory() -> Backend:
    """A new private in-memory database: what an App given one opens after close(), as memory:// does."""
    return open_backend("memory://")


def _check_same(url: str, backend_url: str) -> None:
    if url != backend_url and not same_database(url, backend_url):
        raise ConfigurationError(
            f"this App was given its backend (App(backend=...)) on {redact_url(backend_url)}, which a database "
            f"URL naming another database cannot replace ({redact_url(url)}): give the URL or the backend, not both"
        )


def _sequence(items: Iterable[Message], what: str) -> Sequence[Message]:
    """``items`` as a sequence (a generator's items listed, as every engine needs their count);
    PayloadError for one message or text, which iterate as something else."""
    if isinstance(items, (str, bytes, Mapping, Message)) or not isinstance(items, Iterable):
        raise PayloadError(f"{what} must be a list of Message objects, not one {type(items).__name__}")
    return items if isinstance(items, Sequence) else list(items)


class App:
    """A Conveyor application: where tasks are registered and jobs are sent.

    ``database_url`` defaults to ``$CONVEYOR_DATABASE_URL``, else the embedded SQLite file
    ``sqlite:///conveyor.db``; ``backend`` (a backend of your own making, with its options) is used
    instead, and the App's database is then that backend's. The schema is migrated on first use of
    the embedded default (SQLite); a server's schema (PostgreSQL, MySQL) is migrated by ``conveyor migrate`` (or
    ``migrate=True``)."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        backend: Backend | None = None,
        migrate: bool | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: timedelta = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        # Given its backend (``App(backend=...)``), the App's database is that backend's: not
        # $CONVEYOR_DATABASE_URL's, and a database_url given too must name the same (see its setter).
        self._backend_given = backend is not None
        if backend is not None:
            if database_url is not None and database_url != "":
                _check_same(database_url, backend.url)
            database_url = backend.url
        self._database_url = database_url or os.environ.get("CONVEYOR_DATABASE_URL") or DEFAULT_DATABASE_URL
        self._backend = backend
        self._migrate = migrate
        # Whether the backend is to be migrated at its next use: a given one as a URL's would be.
        self._unmigrated = backend is not None and self._migrates(backend)
        # What the next call opens where database_url would be wrong: the parent's backend again after a
        # fork (see _forked), a given backend again after close().
        self._reopen: Callable[[], Backend] | None = None
        self._lock = threading.Lock()
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 1, 2**30, ConfigurationError)
        self.catalogue = Catalogue(dedup_window, self.max_payload_bytes)
        #: The time this app writes and judges rows by (see :class:`conveyor._clock.DatabaseClock`).
        self.clock = DatabaseClock(lambda: self.backend)
        self.producer = Producer(self.catalogue, lambda: self.backend, self.max_payload_bytes, self.clock)
        self.admin = Admin(self)
        _apps.add(self)

    def _forked(self) -> None:
        """This process is a fork of the one that opened the backend: open another at the next call
        (a private in-memory database is this process's copy, and stays)."""
        self._lock = threading.Lock()  # another thread of the parent may have held it
        backend = self._backend
        if backend is not None and backend.engine != "memory":
            _inherited.append(backend)
            self._backend = None
            # The same database and options at the next call: not open_backend(database_url), which
            # for an App given its backend (App(backend=PostgresBackend(url, max_size=...))) would
            # drop the options.
            self._reopen = backend.forked
        self.clock.forked()

    # -- storage -------------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The URL of this App's database (for an App given its backend: that backend's)."""
        return self._database_url

    @database_url.setter
    def database_url(self, url: str) -> None:
        # The CLI's --db (or $CONVEYOR_DATABASE_URL) over an app module's own URL. An App given its
        # backend would go on using that backend while its commands and workers were told of another
        # database: refused, unless the URL names the backend's own database.
        if self._backend_given:
            _check_same(url, self._database_url)
        self._database_url = url

    @property
    def backend(self) -> Backend:
        """The storage backend, opened (and, for SQLite or ``migrate=True``, migrated) on first use."""
        backend = self._backend
        if backend is not None and not self._unmigrated:
            return backend
        with self._lock:
            if self._backend is None:
                if self._reopen is not None:
                    # The same database and options as before the fork or the close(); a private
                    # in-memory one is a new, empty database, as memory:// is after close().
                    self._backend = self._reopen()
                    self._unmigrated = self._unmigrated or self._backend.engine == "memory"
                else:
                    self._backend = open_backend(self.database_url)
                    self._unmigrated = self._migrates(self._backend)
            if self._unmigrated:
                self._backend.migrate()
                self._unmigrated = False
            return self._backend

    def _migrates(self, backend: Backend) -> bool:
        """Whether the first use of ``backend`` migrates it: ``migrate``, else only the embedded engines."""
        return self._migrate if self._migrate is not None else backend.engine in ("sqlite", "memory")

    @property
    def in_memory(self) -> bool:
        """Whether the database is a private in-memory one (``memory://``, ``sqlite:///:memory:``),
        which lives and dies with this process: no other process can send to it or drain it."""
        if self._backend is not None:
            return self._backend.engine == "memory"
        return in_memory_url(self.database_url)

    def close(self) -> None:
        """Close the backend's connections (a later call opens them again)."""
        backend = self._backend
        if backend is not None:
            backend.close()
            self._backend = None
            if self._backend_given:  # not open_backend(database_url), which would drop its options
                self._reopen = backend.forked if backend.engine != "memory" else _new_memory

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- declarations --------------------------------------------------------------------------

    @property
    def tasks(self) -> dict[str, Task[Any, Any]]:
        """The registered tasks, by name."""
        return self.catalogue.tasks

    @property
    def queues(self) -> dict[str, QueueOptions]:
        """The declared queues, by name."""
        return self.catalogue.queues

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The declared schedules, by name (stored by every worker when it starts)."""
        return self.catalogue.schedules

    @property
    def dedup_window(self) -> timedelta:
        """How long an idempotency key holds its job in a queue that does not say otherwise."""
        return self.catalogue.dedup_window

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_deliveries: int | None = None,
        backoff: Backoff | Sequence[float] | None = None,
        dead_on: Iterable[type[BaseException]] | None = None,
        timeout: float | None = None,
        visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
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
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_deliveries: int | None = None,
        backoff: Backoff | Sequence[float] | None = None,
        dead_on: Iterable[type[BaseException]] | None = None,
        timeout: float | None = None,
        visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
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
            registered = Task(self, task_name, f, options)
            self.catalogue.add_task(registered)
            return registered

        return register(fn) if fn is not None else register  # type: ignore[return-value]

    def task_options(self, name: str) -> TaskOptions | None:
        """The options of the task registered as ``name`` (None if unknown)."""
        return self.catalogue.task_options(name)

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
        on_expire: ExpireAction = "expired",
        concurrency: int | None = None,
        ordered: bool = False,
    ) -> QueueOptions:
        """Declare a queue's options (its part of the queue contract); returns them.

        ``max_depth`` turns on backpressure: past ``shedding[class] * max_depth`` live jobs, sends of
        that priority class (low < 0, normal 0, high > 0) raise QueueFull. Defaults: dedup window
        from the App, retention 7 days, dead letters 14 days, expired jobs end ``expired``. Raises
        ConfigurationError for a bad name or a value out of range."""
        check_name(name, "queue", ConfigurationError)
        defaults = QueueOptions(name)
        return self.catalogue.add_queue(
            QueueOptions(
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
        )

    def queue_options(self, name: str) -> QueueOptions:
        """The declared options of a queue, or the defaults for an undeclared one."""
        return self.catalogue.queue_options(name)

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
        # Everything a schedule checks that does not need the task fails here, before the task is
        # registered (a declaration that raises must leave nothing behind).
        Cron.parse(cron)
        if name is not None:
            check_name(name, "schedule name", ConfigurationError)
            self._check_new_schedule(name)
        encode_json_object(payload if payload is not None else {}, "payload", self.max_payload_bytes)
        check_int(priority, "priority", INT32_MIN, INT32_MAX, ConfigurationError)

        def register(fn: Callable[P, R]) -> Task[P, R]:
            if name is None:  # the schedule is named after its task
                self._check_new_schedule(f"{_module_name(fn)}.{fn.__qualname__}")
            task: Task[P, R] = self.task(**task_options)(fn)
            queue = task.options.queue
            schedule = self.catalogue.new_schedule(name or task.name, cron, task.name, queue, payload, priority)
            self.catalogue.add_schedule(schedule)
            return task

        return register

    def _check_new_schedule(self, name: str) -> None:
        if name in self.catalogue.schedules:
            raise ConfigurationError(f"a schedule named {name!r} is declared already: give this one another name=")

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
        subscription = Subscription(topic, queue, name, json.dumps(parsed, separators=(",", ":"), sort_keys=True))
        self.backend.subscriptions_upsert(SubscriptionsUpsertParams([subscription]))
        return subscription

    def unsubscribe(self, topic: str, queue: str) -> bool:
        """Remove the subscription of ``queue`` to ``topic``; False if there was none."""
        check_name(topic, "topic", ConfigurationError)
        check_name(queue, "queue", ConfigurationError)
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
        messages = published(topic, payload, headers, envelope, self.admin.subscriptions, self.producer.prepare)
        return self.send_many(messages, conn=conn)

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
            message = Message(task=name, payload=payload if payload is not None else {}, **envelope)
        except TypeError as exc:
            raise PayloadError(f"bad send option: {exc}") from None
        return self.send_many([message], conn=conn)[0]

    def send_many(self, messages: Iterable[Message], *, conn: Any = None) -> list[Job]:
        """Enqueue many jobs in one round trip; return their handles in order (duplicates inside
        the dedup window return the existing job's handle)."""
        ids = self.producer.insert(_sequence(messages, "send_many's messages"), conn)
        backend = self.backend
        return [Job(backend, job_id) for job_id in ids]

    async def send_async(
        self, task: str | Task[Any, Any], payload: Mapping[str, Any] | None = None, **envelope: Any
    ) -> Job:
        """Like :meth:`send`, without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.send(task, payload, **envelope))

    def _send_payloads(self, task: str, payloads: Sequence[Mapping[str, Any]], conn: Any) -> list[Job]:
        """Task.delay_many: one job of ``task`` per payload, in one round trip."""
        ids = self.producer.insert_payloads(task, payloads, conn)
        backend = self.backend
        return [Job(backend, job_id) for job_id in ids]

    async def send_many_async(self, messages: Iterable[Message]) -> list[Job]:
        """Like :meth:`send_many`, without blocking the event loop."""
        return await asyncio.to_thread(self.send_many, messages)

    # -- producing in steps (the HTTP service's group commit) -----------------------------------
    # send_many validates, checks backpressure and inserts in one call. A service that coalesces
    # many callers' sends into one transaction needs the steps apart, so that one caller's bad
    # message or full queue is that caller's answer alone and never fails the others' insert.

    # -- reading -------------------------------------------------------------------------------

    def job(self, job_id: UUID | str) -> JobStatus:
        """The status of a job (live or archived). Raises JobNotFoundError."""
        try:
            uid = job_id if isinstance(job_id, UUID) else UUID(str(job_id))
        except ValueError:
            raise JobNotFoundError(f"not a job id: {preview(str(job_id))}") from None
        return Job(self.backend, uid).status()

    def handle(self, job_id: UUID) -> Job:
        """A handle on a job by id, without reading it."""
        return Job(self.backend, job_id)


def _module_name(fn: Callable[..., Any]) -> str:
    """The importable module name of ``fn``: under ``python -m pkg.mod`` a task defined in
    ``__main__`` gets the name a worker importing ``pkg.mod`` will also see."""
    module = fn.__module__
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if spec is not None and spec.name:
            return str(spec.name)
    return module
