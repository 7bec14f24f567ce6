"""The producer: turns messages into rows (validated, defaulted, encoded once) and inserts them.

Every field is checked here, above the seam, so that no engine ever sees a value another engine would
refuse (``conveyor._limits``); a task's declared options fill what a message leaves out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from conveyor._catalogue import Catalogue
from conveyor._clock import DatabaseClock
from conveyor._errors import PayloadError, PayloadTooLarge
from conveyor._ids import MintedId, uuid7
from conveyor._lazy import Lazy
from conveyor._limits import GOOD_NAMES, INT32_MAX, INT32_MIN, MAX_ATTEMPTS, check_int, check_key, check_name
from conveyor._load import LoadGauge
from conveyor._message import Message, encode_headers, encode_json_object, new_traceparent, resolve_times
from conveyor._otel import available as tracing_available
from conveyor._otel import configured as tracing_configured
from conveyor._task import DEFAULT_MAX_ATTEMPTS, deliveries_limit
from conveyor.backends.base import Backend, JobsInsertParams, NewJob


class Producer:
    """Builds and inserts the rows of sends for one App's catalogue, timed by the app's ``clock``
    (the database's time where this host's is off it: a row's ``run_at`` is compared with the
    workers' clocks)."""

    def __init__(
        self, catalogue: Catalogue, backend: Callable[[], Backend], max_payload_bytes: int, clock: DatabaseClock
    ) -> None:
        self.catalogue = catalogue
        self.max_payload_bytes = max_payload_bytes
        self._backend = backend
        self.clock = clock
        self.load = LoadGauge(catalogue, backend)
        #: Whether sends run in an OpenTelemetry producer span (the API is importable).
        self.tracing = tracing_available()

    def insert(self, messages: Sequence[Message], conn: Any = None) -> list[UUID]:
        """Insert ``messages`` in one round trip (on ``conn``, the caller's connection, if given);
        return the stored id of each, in order (a duplicate key's holder).

        Raises PayloadError (nothing written) for a message that does not validate, and QueueFull
        when backpressure refuses it."""
        if not messages:
            return []
        # The span's attributes read every message: only when a tracer provider records the span
        # (with the API importable but no SDK, a 1,000-job send would read them all for nothing).
        if self.tracing and tracing_configured():
            from conveyor._otel import first_task, send_span

            # Only messages for the span's attributes: anything else is refused by new_job (PayloadError).
            sent = [m for m in messages if isinstance(m, Message)]
            queues = {m.queue if m.queue is not None else self._queue_of(m.task) for m in sent}
            queue = next(iter(queues)) if len(queues) == 1 else None
            with send_span(first_task([m.task for m in sent]), queue, len(messages)) as traceparent:
                return self._insert(messages, conn, traceparent)
        return self._insert(messages, conn, None)

    def _queue_of(self, task: str) -> str:
        options = self.catalogue.task_options(task) if isinstance(task, str) else None
        return options.queue if options else "default"

    def insert_payloads(self, task: str, payloads: Sequence[Mapping[str, Any]], conn: Any = None) -> list[UUID]:
        """Insert one job of ``task`` per payload (``Task.delay_many``): what :meth:`insert` does with a
        ``Message(task, payload)`` each, with the rows' shared fields worked out once for the batch.
        Raises as :meth:`insert` does."""
        if not payloads:
            return []
        if self.tracing and tracing_configured():
            from conveyor._otel import send_span

            with send_span(task, self._queue_of(task), len(payloads)) as traceparent:
                return self._insert_payloads(task, payloads, conn, traceparent)
        return self._insert_payloads(task, payloads, conn, None)

    def _insert(self, messages: Sequence[Message], conn: Any, traceparent: str | None) -> list[UUID]:
        now = self.clock.now()
        # One send is one trace: without a tracer, the jobs of a batch share one fresh traceparent,
        # as they share the send span's with one.
        parent = traceparent or new_traceparent()
        new_job = self.new_job
        return self._insert_rows(Lazy(lambda message: new_job(message, now, parent), messages), now, conn)

    def _insert_payloads(
        self, task: str, payloads: Sequence[Mapping[str, Any]], conn: Any, traceparent: str | None
    ) -> list[UUID]:
        now = self.clock.now()
        parent = traceparent or new_traceparent()
        # Every row is the row of Message(task) (checked, defaulted once) with its own id and payload.
        shared = self.new_job(Message(task), now, parent)
        queue, priority, max_attempts, max_deliveries = (
            shared.queue, shared.priority, shared.max_attempts, shared.max_deliveries
        )  # fmt: skip
        limit = self.max_payload_bytes

        def row(payload: Mapping[str, Any]) -> NewJob:
            job_id = uuid7()
            return NewJob(
                job_id, queue, task, encode_json_object(payload, "payload", limit),
                encode_headers(None, job_id, limit, parent), priority, now, max_attempts, max_deliveries,
                fresh=job_id.first_use(),
            )  # fmt: skip

        return self._insert_rows(Lazy(row, payloads), now, conn)

    def _insert_rows(self, rows: Lazy[Any, NewJob], now: datetime, conn: Any) -> list[UUID]:
        # Each row is built (validated, encoded) when the backend reads it: PostgreSQL's COPY thus
        # encodes one job while the server still inserts the ones before. A message that does not
        # validate raises PayloadError as its row is read, and the backend's transaction rolls back.
        try:
            if self.catalogue.queues:
                self.load.check(rows, now)
            return self._backend().jobs_insert_many(JobsInsertParams(rows, now, conn))
        except PayloadError as exc:
            # The error names the job of a batch it is about ("payload is not JSON-serialisable" alone
            # left the producer of 1,000 jobs to find the one at fault). Only a row's own refusal: a
            # backend's (UnstorableText, TooLargeForDatabase) is another class and names its job itself.
            if rows.failed_at is None or len(rows) == 1 or type(exc) not in (PayloadError, PayloadTooLarge):
                raise
            raise type(exc)(f"{exc} (job {rows.failed_at} of the send)") from None

    def prepare(self, message: Message, now: datetime | None = None, traceparent: str | None = None) -> NewJob:
        """Validate and encode one message as :meth:`insert` would, without sending it (the HTTP
        group commit checks each request on its own before grouping them); ``traceparent`` is the
        send's trace context (:func:`conveyor._otel.send_span`) for a message whose headers give none.

        Raises PayloadError (PayloadTooLarge past the size limit) with nothing written."""
        # self.clock(), not .now(): the HTTP service prepares on its event loop, which must not wait
        # for the database's clock; its inserts (insert_prepared, on a thread) read it.
        return self.new_job(message, now if now is not None else self.clock(), traceparent)

    def admit(self, jobs: Sequence[NewJob], now: datetime | None = None) -> None:
        """The backpressure verdict for prepared jobs, as one send of them all: raise QueueFull if a
        queue of theirs is past its high-water mark for a job's priority class, else count them as
        sent. May read a queue's depth from the database (at most every 100 ms per queue), so it can
        block."""
        self.load.check(jobs, now if now is not None else self.clock.now())

    def insert_prepared(
        self, jobs: Sequence[NewJob], strict_keys: bool = False, lock_wait: float | None = None
    ) -> list[UUID]:
        """Insert prepared jobs (:meth:`prepare`, :meth:`admit`) in one transaction; return the
        stored id of each, in order (a duplicate idempotency key answers the holder's id). With
        ``strict_keys``, a key held by another task or payload raises IdempotencyConflict, nothing written.
        ``lock_wait``: see ``JobsInsertParams`` (LockWaitTimeout past it)."""
        if not jobs:
            return []
        params = JobsInsertParams(jobs, self.clock.now(), strict_keys=strict_keys, lock_wait=lock_wait)
        return self._backend().jobs_insert_many(params)

    def new_job(self, message: Message, now: datetime, traceparent: str | None = None) -> NewJob:
        """The row of one message (``traceparent``: the send's trace span, for the headers). Raises
        PayloadError for any field out of range."""
        # The hot path of send_many: kept to plain lookups (a 20,000-job batch calls it 20,000 times).
        if type(message) is not Message and not isinstance(message, Message):
            raise PayloadError(f"send_many takes Message objects, got {type(message).__name__}")
        job_id = message.id
        if type(job_id) is not MintedId:
            job_id = _checked_id(job_id)
        task = message.task
        if type(task) is not str or task not in GOOD_NAMES:
            task = check_name(task, "task")
        options = self.catalogue.task_options(task)
        queue = message.queue
        if queue is None:
            queue = options.queue if options else "default"
        elif type(queue) is not str or queue not in GOOD_NAMES:
            queue = check_name(queue, "queue")
        max_attempts = message.max_attempts
        if max_attempts is None:
            max_attempts = options.max_attempts if options else DEFAULT_MAX_ATTEMPTS
        elif type(max_attempts) is not int or not 1 <= max_attempts <= MAX_ATTEMPTS:
            max_attempts = check_int(max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        max_deliveries = options.deliveries_limit if options else deliveries_limit(max_attempts)
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
            idempotency_key = check_key(idempotency_key, "idempotency_key")
            dedup_until: datetime | None = now + self.catalogue.dedup_window_of(queue)
        else:
            dedup_until = None
        ordering_key = message.ordering_key
        if ordering_key is not None:
            ordering_key = check_key(ordering_key, "ordering_key")
        return NewJob(
            job_id,
            queue,
            task,
            encode_json_object(message.payload, "payload", self.max_payload_bytes),
            encode_headers(message.headers, job_id, self.max_payload_bytes, traceparent),
            priority,
            run_at,
            max_attempts,
            max(max_deliveries, max_attempts),
            expires_at,
            idempotency_key,
            ordering_key,
            None,
            dedup_until,
            type(job_id) is MintedId and job_id.first_use(),
        )


def _checked_id(value: object) -> UUID:
    """A job id a producer gave: a ``uuid.UUID`` (a subclass's value as a plain UUID), else PayloadError.
    An id is compared as the database stores it, so text (any case, hex without dashes) is refused
    rather than stored as written: an id no ack could match would leave its job running forever."""
    if not isinstance(value, UUID):
        raise PayloadError(f"id must be a uuid.UUID (or None to mint one), got {type(value).__name__}")
    return value if type(value) is UUID else UUID(int=value.int)
