"""What Conveyor accepts: the limits on names, keys, numbers and JSON, checked once above the seam.

Every way in (the Python API, the CLI, the HTTP API) builds a :class:`~conveyor.Message`, a task, a
queue policy, a schedule or a worker, and those check their values here, before anything is written,
the same way for every engine. A value past a limit raises :class:`PayloadError` (a field of a job)
or :class:`ConfigurationError` (an option) naming the field and the limit; the database never sees it.

Why each limit:

- **Names** (queue, task, schedule, topic): 1 to 200 characters. **Keys** (idempotency, ordering,
  ``ctx.once``): 1 to 512 bytes of UTF-8. They are index entries, and a PostgreSQL btree entry holds
  at most about 2.7 kB: past that every insert fails, which used to look like an outage.
- Names and keys are **valid Unicode without NUL**: PostgreSQL's ``text`` cannot hold NUL, and a
  lone surrogate cannot be encoded as UTF-8 at all.
- **Integers stored in a column** (priority, version, max_depth) are 32-bit signed: PostgreSQL's
  ``integer``. ``max_attempts`` and ``max_deliveries`` are 1 to 1,000,000.
- **Seconds** (delay, ttl, visibility timeout, timeout, backoff) are finite and at most 100 years.
  NaN compares false with everything, so it slips past every range check, and SQLite stores it as
  NULL: a lease of NaN seconds never expires, and its job is never rescued.
"""

from __future__ import annotations

import math
import numbers
import operator
from datetime import timedelta
from typing import NoReturn

from conveyor._errors import ConfigurationError, PayloadError

#: Longest queue, task, schedule or topic name, in characters.
MAX_NAME_CHARS = 200
#: Longest idempotency, ordering or processed key, in bytes of UTF-8.
MAX_KEY_BYTES = 512
#: Deepest nesting of a payload or headers (the top-level object is level 1).
MAX_JSON_DEPTH = 100
#: The range of a PostgreSQL ``integer`` column (priority, version, max_depth).
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
#: Most attempts (or deliveries) a job may be given.
MAX_ATTEMPTS = 1_000_000
#: Longest delay, ttl, lease, timeout or backoff, in seconds (100 years).
MAX_SECONDS = 100 * 365 * 24 * 3600.0
#: Shortest lease (a task's or a worker's visibility_timeout), in seconds. The heartbeat extends leases every
#: 0.2 s at the most often (worker/heartbeat.py): a lease of 0.1 s ran out between two extensions, and a job of
#: a few seconds was rescued and run again until it was dead-lettered as poison.
MIN_VISIBILITY_TIMEOUT = 0.5

ErrorClass = type[PayloadError] | type[ConfigurationError]

#: Names already found good: a producer uses few queues and tasks, so a 20,000-job send_many checks
# each name once instead of 20,000 times. Bounded, so that a producer minting names cannot grow it.
GOOD_NAMES: set[str] = set()
GOOD_NAMES_MAX = 10_000


def preview(value: str, width: int = 40) -> str:
    """A short, printable quotation of ``value`` for an error message (repr escapes control characters)."""
    return repr(value) if len(value) <= width else repr(value[:width]) + "..."


def _raise(error: ErrorClass, message: str) -> NoReturn:
    raise error(message)


def _text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text by every engine, or None."""
    if "\x00" in value:
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    if not is_utf8(value):
        return "is not valid Unicode (it contains a lone surrogate), so it cannot be stored as UTF-8"
    return None


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_name(value: object, what: str, error: ErrorClass = PayloadError) -> str:
    """``value`` as a plain ``str`` if it is a usable queue/task/schedule/topic name; else raise
    ``error``. (A ``str`` subclass, such as a member of a ``(str, Enum)``, becomes its value: its own
    ``str()`` and ``format()`` may spell it otherwise, as ``'Queue.EMAILS'``.)"""
    if type(value) is str and value in GOOD_NAMES:
        return value
    if not isinstance(value, str):
        _raise(error, f"{what} must be a string, got {type(value).__name__}")
    value = str.__str__(value)
    if not value:
        _raise(error, f"{what} must not be empty")
    if len(value) > MAX_NAME_CHARS:
        _raise(
            error,
            f"{what} is {len(value)} characters long, over the {MAX_NAME_CHARS}-character limit: {preview(value)}",
        )
    problem = _text_problem(value)
    if problem is not None:
        _raise(error, f"{what} {problem}: {preview(value)}")
    if len(GOOD_NAMES) < GOOD_NAMES_MAX:
        GOOD_NAMES.add(value)
    return value


def check_key(value: object, what: str, error: ErrorClass = PayloadError) -> str | None:
    """``value`` (a plain ``str``, as :func:`check_name` gives it) if it is None or a usable
    idempotency/ordering/processed key; else raise ``error``."""
    if value is None:
        return None
    if not isinstance(value, str):
        _raise(error, f"{what} must be a string, got {type(value).__name__}")
    value = str.__str__(value)
    if not value:
        _raise(error, f"{what} must not be empty (give None for no key)")
    problem = _text_problem(value)
    if problem is not None:
        _raise(error, f"{what} {problem}: {preview(value)}")
    # A character is at most 4 bytes in UTF-8, so short keys need no encoding to be measured.
    if 4 * len(value) > MAX_KEY_BYTES:
        size = len(value.encode("utf-8"))
        if size > MAX_KEY_BYTES:
            _raise(error, f"{what} is {size} bytes, over the {MAX_KEY_BYTES}-byte limit: {preview(value)}")
    return value


def check_int(value: object, what: str, low: int, high: int, error: ErrorClass = PayloadError) -> int:
    """``value`` as an int if it is an integer (not a bool, not a float) in ``low..high``."""
    if isinstance(value, bool):
        _raise(error, f"{what} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        _raise(error, f"{what} must be an integer, got {type(value).__name__} {_short(value)}")
    if not low <= number <= high:
        shown = f"{number:,}" if number.bit_length() < 4000 else f"an integer of {number.bit_length():,} bits"
        _raise(error, f"{what} must be between {low:,} and {high:,}, got {shown}")
    return number


def check_seconds(
    value: object,
    what: str,
    error: ErrorClass = PayloadError,
    *,
    minimum: float = 0.0,
    strict: bool = False,
) -> float:
    """``value`` as float seconds if it is a finite number in ``minimum..MAX_SECONDS`` (above
    ``minimum`` when ``strict``). NaN and infinity are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _raise(error, f"{what} must be a number of seconds, got {type(value).__name__} {_short(value)}")
    try:
        seconds = float(value)
    except (OverflowError, ValueError):
        seconds = math.inf
    if not math.isfinite(seconds):
        _raise(error, f"{what} must be a finite number of seconds, got {_seconds_text(value)}")
    if seconds < minimum or (strict and seconds == minimum) or seconds > MAX_SECONDS:
        bound = ">" if strict else ">="
        shown = _seconds_text(value)
        _raise(error, f"{what} must be {bound} {minimum:g} and at most {MAX_SECONDS:.0f} s (100 years), got {shown}")
    return seconds


def check_duration(value: object, what: str, error: ErrorClass = ConfigurationError) -> timedelta:
    """``value`` if it is a positive ``timedelta`` of at most 100 years."""
    if not isinstance(value, timedelta):
        _raise(error, f"{what} must be a datetime.timedelta, got {type(value).__name__} {_short(value)}")
    if not timedelta(0) < value <= timedelta(seconds=MAX_SECONDS):
        _raise(error, f"{what} must be positive and at most 100 years, got {value}")
    return value


def check_worker_options(
    *, concurrency: object, prefetch: object, visibility_timeout: object, graceful_timeout: object
) -> None:
    """Raise ConfigurationError for worker options no worker can run with (the CLI checks them
    before it forks, so that a bad option is one error, not a child restarted forever)."""
    check_int(concurrency, "concurrency", 1, 10_000, ConfigurationError)
    if prefetch is not None:
        check_int(prefetch, "prefetch", 0, 1_000_000, ConfigurationError)
    check_seconds(visibility_timeout, "visibility_timeout", ConfigurationError, minimum=MIN_VISIBILITY_TIMEOUT)
    check_seconds(graceful_timeout, "graceful_timeout", ConfigurationError)


def _seconds_text(value: object) -> str:
    """A number of seconds as a message quotes it: as ``str`` writes it, cut at 40 characters (an int of
    thousands of digits, which ``str`` refuses past 4,300, by its size)."""
    try:
        text = str(value)
    except ValueError:
        return f"an integer of {value.bit_length():,} bits" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= 40 else text[:40] + "..."


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."
