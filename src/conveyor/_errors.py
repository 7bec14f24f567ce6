"""Conveyor's exceptions.

::

    ConveyorError                 base of everything Conveyor raises
    ├── ConfigurationError        a bad database URL, an unknown engine, a bad option (also a ValueError)
    ├── PayloadError              a job that cannot be enqueued: payload or headers not JSON, over a
    │   │                         limit (size, nesting, name or key length), a bad number (also a ValueError)
    │   └── PayloadTooLarge       its payload or headers are over the size limit (HTTP 413)
    ├── UnknownTaskError          no task registered under that name
    ├── NotFoundError             no schedule, subscription or token of that name (also a LookupError)
    │   └── JobNotFoundError      no job with that id
    ├── JobTimeoutError           ``Job.wait`` gave up before the job ended
    ├── UnreadableResult          a job's stored result is not JSON Python can read (also a ValueError)
    ├── AuthError                 the HTTP service refused a caller
    │   ├── Unauthenticated       no bearer token, or one that is unknown, revoked or expired (HTTP 401)
    │   └── Forbidden             the token's role or queues do not allow the action (HTTP 403)
    ├── QueueFull                 backpressure: the queue is past its high-water mark (retry later)
    ├── IdempotencyConflict       a strict send's idempotency key is held by another task or payload (HTTP 409)
    ├── BackendError              the database refused or failed a statement
    │   ├── BackendUnavailable    the database cannot be reached (retry later; nothing is lost)
    │   │   └── StatementCancelled the statement was cancelled (a statement_timeout): a batch is halved
    │   │       └── LockWaitTimeout    it waited past its bound for a row another transaction holds
    │   ├── BackendRefused        the database refuses this role a privilege (a GRANT missing or revoked)
    │   ├── BackendCorrupt        the database's storage is damaged: a worker stops, exit ``EXIT_DAMAGED``
    │   ├── UnstorableText        a character the database's encoding cannot hold (also a PayloadError)
    │   └── TooLargeForDatabase   a job too large for one statement of the database (also a PayloadTooLarge)
    ├── HandlerTimeout            recorded as a job's error: its handler ran past the task's timeout
    └── HandlerSignal             raised *by handlers* to steer the outcome
        ├── Retry                 run again after ``delay`` seconds (counts as an attempt)
        └── Reject                dead-letter at once, no retry
"""

from __future__ import annotations

import unicodedata
from typing import Any


class ConveyorError(Exception):
    """Base class of every exception Conveyor raises.

    Each can be pickled and copied with its message and attributes (a process pool hands a handler's
    exception back pickled), however its class is made: ``Exception``'s own way calls the class with
    the message alone, which those taking other arguments refused or misread."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_remade, (type(self), self.args), self.__dict__ or None)


def _remade(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An exception of ``cls`` with ``args``, its ``__init__`` not called (its attributes follow as state)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    return exc


class ConfigurationError(ConveyorError, ValueError):
    """Conveyor was configured wrongly (bad URL, unknown engine, invalid option).

    Also a ValueError, which options refused by the plain ValueError of earlier versions were."""


class PayloadError(ConveyorError, ValueError):
    """A job cannot be enqueued: its payload or headers are not JSON or are over a limit, or one of
    its fields is out of range (see ``conveyor._limits``). Nothing was written."""


class PayloadTooLarge(PayloadError):
    """A payload or headers are over the size limit: enqueue a reference to the data instead."""


class UnknownTaskError(ConveyorError, KeyError):
    """No task is registered under the given name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown task"


class NotFoundError(ConveyorError, LookupError):
    """What an operator action names does not exist (a schedule, a subscription, a token, a job)."""


class JobNotFoundError(NotFoundError):
    """No job with the given id exists (live or archived)."""


class JobTimeoutError(ConveyorError, TimeoutError):
    """``Job.wait`` timed out before the job reached a terminal state."""


class UnreadableResult(ConveyorError, ValueError):
    """A job's stored result is not JSON Python can read (another writer's or a hand edit's: text that is not
    JSON, an integer of 4,300+ digits, JSON nested past the recursion limit). Raised by reading
    ``JobStatus.result``, so that it cannot pass for a value the handler returned; ``why`` (also
    ``JobStatus.unreadable["result"]``) says why and how the stored text begins; ``job_id`` names the job."""

    def __init__(self, job_id: object, why: str) -> None:
        super().__init__(f"job {job_id}: {why}")
        self.job_id = job_id
        self.why = why


class AuthError(ConveyorError):
    """The HTTP service refused a caller (see :class:`Unauthenticated` and :class:`Forbidden`).

    Messages name the token by its public id or name, never by its secret."""


class Unauthenticated(AuthError):
    """No bearer token, a malformed one, or one that is unknown, revoked or expired.

    ``kind`` says which, as a fixed word a page may show a fixed text for: ``missing``, ``invalid``
    (malformed, unknown, or a wrong secret), ``revoked`` or ``expired``."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


class Forbidden(AuthError):
    """The token is valid but its role or its queues do not allow the action."""


class QueueFull(ConveyorError):
    """The queue is past its high-water mark for this send's priority class; nothing was enqueued.

    ``retry_after`` (seconds) is estimated from the queue's measured drain rate."""

    def __init__(self, queue: str, depth: int, limit: int, retry_after: float) -> None:
        super().__init__(
            f"queue {queue!r} is full for this priority ({depth} live jobs, limit {limit}); "
            f"retry after {retry_after:.1f}s"
        )
        self.queue = queue
        self.depth = depth
        self.limit = limit
        self.retry_after = retry_after


class IdempotencyConflict(ConveyorError):
    """An idempotency key is held by a job of another task or payload, and the send asked to be
    refused then (the HTTP API's sends): nothing of the send was written."""


class BackendError(ConveyorError):
    """The database refused or failed a statement."""


class BackendUnavailable(BackendError):
    """The database cannot be reached right now; callers retry with backoff."""


class BackendRefused(BackendError):
    """The database refuses this role a privilege (PostgreSQL's "permission denied": a GRANT missing or
    revoked). Every row of a statement is refused alike, so a batch is never split over it; a producer
    or a worker's fetch fails at once (a role never granted stays an error, not a wait), while a
    worker keeps its unwritten outcomes and retries them until the grant is back: dropped, each of
    those jobs would run again."""


class StatementCancelled(BackendUnavailable):
    """The database cancelled a statement: a ``statement_timeout`` it ran past, or an operator's
    ``pg_cancel_backend``. Retried like an unavailable database, except that a batch (a worker's
    finish, a group commit) is split in halves first: a smaller one may end in time, and the same
    batch retried whole would be cancelled again, forever. One item alone is retried as it is."""


class LockWaitTimeout(StatementCancelled):
    """A statement waited longer than it was allowed to for a row another transaction holds (an
    idempotency key an application's open transaction has claimed and not committed yet; PostgreSQL's
    ``lock_timeout``, InnoDB's ``innodb_lock_wait_timeout``): nothing of it was written. Split and
    retried as a cancelled statement is; it passes once that transaction ends."""


class BackendCorrupt(BackendError):
    """The database's storage is damaged (a corrupt SQLite file, a corrupt PostgreSQL page or index):
    no retry can fix it and no job is at fault, so a worker stops (exit ``EXIT_DAMAGED``) instead of
    re-running jobs whose outcomes it cannot store or dead-lettering them; an operator restores or
    repairs it (HTTP 500, ``database_damaged``)."""


#: The exit code of a process that stopped on :class:`BackendCorrupt` (sysexits' EX_IOERR): a restart
#: cannot help and would lease and run more jobs it cannot finish, so the prefork supervisor restarts
#: none (under systemd: ``RestartPreventExitStatus=74``); every CLI command exits with it too.
EXIT_DAMAGED = 74

#: What a statement can fail with that is the whole database's doing, not one of its rows': a batch
#: that fails so is raised (or answered) as a whole, never split to find the row at fault.
DATABASE_WIDE = (BackendUnavailable, BackendCorrupt, BackendRefused)


def exit_code(exc: BaseException) -> int:
    """The exit code of a process that stops on ``exc``: ``EXIT_DAMAGED`` for a damaged database, else 1."""
    return EXIT_DAMAGED if isinstance(exc, BackendCorrupt) else 1


def printable(value: object, multiline: bool = False) -> str:
    """``value`` as text safe to print on a terminal: every character a terminal would act on or could
    not show as a backslash escape (controls ``\\x1b``, format and bidi controls ``\\u202e``, a byte
    that was not UTF-8 ``\\udcff``, private and unassigned code points, line and paragraph
    separators); with ``multiline`` newlines and tabs are kept (error messages, tracebacks)."""
    text = str(value)
    if text.isprintable():
        return text
    out = []
    for char in text:
        if multiline and char in "\n\t":
            out.append(char)
        elif unicodedata.category(char) in _UNPRINTABLE:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def first_line(exc: BaseException) -> str:
    """An error's message as one line (a database's message without its ``LINE n:``, caret and HINT
    lines), or its class's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class UnstorableText(BackendError, PayloadError):
    """A value holds a character the database's encoding cannot store (``'€'`` in a LATIN1
    PostgreSQL database): refused before anything was sent. A value the database refuses, and, where
    a caller sent it (a job, a filter), a bad request (HTTP 400) rather than a database failure."""

    def __init__(self, action: str, exc: UnicodeEncodeError) -> None:
        characters = exc.object[exc.start : exc.end]
        # ASCII only, so that the message itself can be stored (a dead-lettered job's error).
        named = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, '')}".rstrip() for c in characters[:3])
        super().__init__(f"the database's encoding ({exc.encoding}) cannot store {named} ({action})")
        #: Python's name for the database's encoding (``latin-1``).
        self.encoding = exc.encoding


class TooLargeForDatabase(BackendError, PayloadTooLarge):
    """A job is too large for the database to take in one statement (MySQL's ``max_allowed_packet``):
    refused before it was sent, and nothing of the call was written. A value the database refuses, and,
    where a caller sent it, a request too large (HTTP 413) rather than a database failure that a retry
    would get past."""


class HandlerTimeout(ConveyorError):
    """A handler ran past its task's ``timeout``: a transient failure, so the job is retried (or
    dead-lettered when no attempts remain). The worker gives the handler up and frees its slot."""


class HandlerSignal(ConveyorError):
    """Base of the exceptions a handler raises to steer its job's outcome."""


class Retry(HandlerSignal):
    """Raised by a handler: run the job again after ``delay`` seconds (None: the task's backoff).

    It counts as an attempt; when no attempts remain the job is dead-lettered. A ``delay`` that is
    not a finite number of seconds in [0, 100 years] raises ConfigurationError instead."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None:
            from conveyor._limits import check_seconds

            delay = check_seconds(delay, "Retry delay", ConfigurationError)
        super().__init__(reason or "retry requested")
        self.delay = delay
        self.reason = reason


class Reject(HandlerSignal):
    """Raised by a handler: dead-letter the job at once, whatever attempts remain."""

    def __init__(self, reason: str = "rejected") -> None:
        super().__init__(reason)
        self.reason = reason
