"""Outcome policy: what happens to a job before and after its handler runs.

These are the only places that decide retry versus dead letter, so every engine and the testing
kit share them (the Backend only stores what is decided here)."""

from __future__ import annotations

import json
import math
import numbers
import traceback as tb_module
from datetime import datetime, timedelta
from typing import Any

from conveyor._context import JobContext
from conveyor._errors import PayloadError, Reject, Retry
from conveyor._limits import MAX_NAME_CHARS, MAX_SECONDS, is_utf8
from conveyor._message import SCHEMA_VERSION, keys_collide
from conveyor._task import TaskOptions
from conveyor.backends.base import Delivery, ErrorInfo, Finish, RetryItem

Outcome = Finish | RetryItem

#: Reasons recorded on dead letters.
MAX_DELIVERIES_EXCEEDED = "max_deliveries_exceeded"
MAX_ATTEMPTS_EXCEEDED = "max_attempts_exceeded"
PERMANENT_ERROR = "permanent_error"
REJECTED = "rejected"
UNKNOWN_TASK = "unknown_task"
UNSUPPORTED_VERSION = "unsupported_version"
EXPIRED = "expired"
OUTCOME_REFUSED = "outcome_refused"


def before_run(
    delivery: Delivery, options: TaskOptions | None, now: datetime, on_expire: str = "expired"
) -> Finish | None:
    """The outcome that ends a job without running it, or None when it should run.

    Poison protection comes first: a job whose start would pass its delivery limit has repeatedly
    killed or hung its workers, so it must not run again whatever else is true. (``deliveries``
    counts the earlier starts; this one would be one more.)"""
    limit = options.deliveries_limit if options else delivery.max_deliveries
    if delivery.deliveries >= limit:
        error = ErrorInfo("PoisonJob", f"started {delivery.deliveries} times without finishing, limit {limit}")
        return Finish(delivery.id, delivery.receipt, "dead", reason=MAX_DELIVERIES_EXCEEDED, error=error, ran=False)
    if delivery.expires_at is not None and now >= delivery.expires_at:
        if on_expire == "dead":
            error = ErrorInfo("Expired", f"not started before expires_at {delivery.expires_at.isoformat()}")
            return Finish(delivery.id, delivery.receipt, "dead", reason=EXPIRED, error=error, ran=False)
        return Finish(delivery.id, delivery.receipt, "expired", reason=EXPIRED, ran=False)
    if options is None:
        error = ErrorInfo("UnknownTaskError", f"no task registered as {delivery.task!r}")
        return Finish(delivery.id, delivery.receipt, "dead", reason=UNKNOWN_TASK, error=error, ran=False)
    if delivery.attempts >= delivery.max_attempts:
        # A retry always leaves an attempt and a replay starts again at 0: only raw SQL (or an older
        # writer) stores such a row. Running it would be an attempt past its budget, and at the integer
        # limit the database refused to count it (the job ran again at each lease's end).
        error = ErrorInfo(
            "AttemptsExhausted",
            f"attempts {delivery.attempts} already reach max_attempts {delivery.max_attempts}: not run",
        )
        return Finish(delivery.id, delivery.receipt, "dead", reason=MAX_ATTEMPTS_EXCEEDED, error=error, ran=False)
    version = _schema_version(delivery.headers)
    if isinstance(version, str) or version > options.version:
        why = version if isinstance(version, str) else f"job schema_version {version} is not supported"
        error = ErrorInfo("UnsupportedVersion", f"{why} by task {delivery.task!r} (handles up to {options.version})")
        return Finish(delivery.id, delivery.receipt, "dead", reason=UNSUPPORTED_VERSION, error=error, ran=False)
    return None


# The version key, as JSON text spells it without escapes, and what follows it for the first version
# (as the producer's encoder and PostgreSQL's jsonb write it; other spacing is decoded).
_VERSION_KEY = f'"{SCHEMA_VERSION}"'
_FIRST_VERSION = (":1,", ":1}", ": 1,", ": 1}")


def _schema_version(headers: str) -> int | str:
    """The job's schema version; else why it has none a handler could take, as the producer would
    have refused it (raw SQL, another writer): headers that are not a JSON object, or a version that
    is not an integer of at least 1."""
    if "\\" not in headers and headers[:1] == "{" and headers[-1:] == "}":
        # The common case, a job of the first version (every producer names it): no need to decode
        # its headers, which the producer's encoder or the database wrote as a JSON object. With no
        # escape in them a quote only ever delimits a string and no key can be spelled another way:
        # a key named once with the value 1, or not at all, is the first version.
        at = headers.find(_VERSION_KEY)
        if at < 0:
            return 1
        at += len(_VERSION_KEY)
        if headers.startswith(_FIRST_VERSION, at) and headers.find(_VERSION_KEY, at) < 0:
            return 1
    try:
        decoded = json.loads(headers)
    except (ValueError, RecursionError):
        decoded = None
    if not isinstance(decoded, dict):
        return "the job's headers are not a JSON object Python can read, not supported"
    value = decoded.get(SCHEMA_VERSION, 1)
    if type(value) is not int or value < 1:
        text = json.dumps(value)
        shown = text if len(text) <= 40 else text[:40] + "..."
        return f"the job's schema_version {shown} is not an integer of at least 1, not supported"
    return value


def on_success(delivery: Delivery, options: TaskOptions, result: Any) -> Finish:
    """The handler returned: the job completed (result kept if the task keeps results).

    The completion is never lost to its result: a result that JSON cannot hold faithfully (not JSON,
    or a dict two of whose keys JSON writes as the same text, ``{1: "a", "1": "b"}``) is kept as its
    repr, one over :data:`MAX_RESULT_BYTES` as a note saying so, and text no database can store (NUL,
    lone surrogates) as its escape (see :func:`storable`)."""
    encoded: str | None = None
    if options.keep_result and result is not None:
        try:
            encoded = _json(result)
            if keys_collide(result):
                raise ValueError("two keys of one dict are the same JSON text")
            if "\\u0000" in encoded or not is_utf8(encoded):
                encoded = _storable_json(encoded)
        except (TypeError, ValueError, RecursionError):
            encoded = _json({"repr": storable(_safe_repr(result))[:MAX_RESULT_BYTES]})
        size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
        if size > MAX_RESULT_BYTES:
            note = f"the result was {size} bytes of JSON, over the {MAX_RESULT_BYTES}-byte limit: not kept"
            encoded = _json({"note": note})
    return Finish(delivery.id, delivery.receipt, "completed", result=encoded)


def on_failure(delivery: Delivery, options: TaskOptions, exc: BaseException, now: datetime) -> Outcome:
    """The handler raised: retry with backoff, or dead-letter (permanent error, Reject, no attempts left)."""
    error = error_info(exc)
    if isinstance(exc, Reject):
        return Finish(delivery.id, delivery.receipt, "dead", reason=REJECTED, error=error)
    if not isinstance(exc, Retry) and isinstance(exc, (*options.dead_on, PayloadError)):
        return Finish(delivery.id, delivery.receipt, "dead", reason=PERMANENT_ERROR, error=error)
    delay = _delay(getattr(exc, "delay", None)) if isinstance(exc, Retry) else None
    return _retry_or_dead(delivery, options, error, delay, now)


def on_manual(delivery: Delivery, options: TaskOptions, ctx: JobContext, now: datetime) -> Outcome:
    """A manual-ack handler returned: its ``ctx`` decision is the outcome (no decision: retry)."""
    if ctx.decision == "ack":
        return on_success(delivery, options, ctx.result)
    if ctx.decision == "reject":
        error = ErrorInfo("Reject", _said(ctx.reason))
        return Finish(delivery.id, delivery.receipt, "dead", reason=REJECTED, error=error)
    reason = _said(ctx.reason) if ctx.decision == "nack" else "handler returned without ack, nack or reject"
    return _retry_or_dead(delivery, options, ErrorInfo("Nack", reason), _delay(ctx.retry_delay), now)


def _said(reason: object) -> str:
    """A reason a handler gave (``ctx.reject``, ``ctx.nack``, or set on ``ctx``), as text every engine
    stores: anything else by its ``str`` (bytes and objects killed SQLite's completer, and the
    worker with it)."""
    text = reason if type(reason) is str else _safe_str(reason)
    return storable(text[:MAX_ERROR_CHARS])


def _delay(asked: object) -> float | None:
    """A retry delay a handler asked for, in seconds within 0..MAX_SECONDS; None (the task's backoff)
    for anything that is not a number. ``Retry`` and ``ctx.nack`` check theirs; an attribute set
    afterwards (``exc.delay = 1e300``), or a ``Retry`` subclass that skipped ``__init__``, is not
    checked, and failed here as an internal error (the job ran again at every lease's end)."""
    if asked is None or isinstance(asked, bool) or not isinstance(asked, numbers.Real):
        return None
    try:
        seconds = float(asked)
    except (OverflowError, ValueError):
        return MAX_SECONDS
    if math.isnan(seconds):
        return None
    return min(max(0.0, seconds), MAX_SECONDS)


def _retry_or_dead(
    delivery: Delivery, options: TaskOptions, error: ErrorInfo, delay: float | None, now: datetime
) -> Outcome:
    attempts = delivery.attempts + 1
    if attempts >= delivery.max_attempts:
        return Finish(delivery.id, delivery.receipt, "dead", reason=MAX_ATTEMPTS_EXCEEDED, error=error)
    seconds = options.backoff.delay(attempts) if delay is None else max(0.0, delay)
    return RetryItem(delivery.id, delivery.receipt, now + timedelta(seconds=seconds), error)


#: Results are stored up to this size of JSON (larger ones are replaced by a note).
MAX_RESULT_BYTES = 1024 * 1024
#: Error messages and tracebacks are stored up to this many characters (the traceback's end, where the
#: error is, is kept).
MAX_ERROR_CHARS = 64 * 1024


def error_info(exc: BaseException) -> ErrorInfo:
    """The type, message and traceback of an exception, as stored on the job.

    Never raises: an exception whose ``__str__`` raises is described by its type. The text is made
    storable (:func:`storable`) and bounded (:data:`MAX_ERROR_CHARS`)."""
    message = _safe_str(exc)
    try:
        text = "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        text = f"{type(exc).__qualname__}: {message}"
    return ErrorInfo(type_name(type(exc).__qualname__), storable(_bounded(message)), storable(text[-MAX_ERROR_CHARS:]))


#: The error type an exception class without a name is stored as (its type was "", and its error did not show).
UNNAMED = "(unnamed exception class)"


def type_name(name: str) -> str:
    """An exception class's name as its error type is stored: storable, never empty, and at most
    MAX_NAME_CHARS, so that a dead-letter filter (a name, at most as long) names every stored type exactly.
    A longer one (a class made at run time may have any name: a 5-million-character one was stored whole, 20 MB,
    and refused by MySQL's packet limit) is cut saying its length; the traceback's last line keeps its end."""
    if not name:
        return UNNAMED
    text = storable(name[:MAX_NAME_CHARS])
    if len(name) <= MAX_NAME_CHARS and len(text) <= MAX_NAME_CHARS:
        return text
    said = f"... (a name of {len(name)} characters)"
    return text[: MAX_NAME_CHARS - len(said)] + said


def _bounded(text: str) -> str:
    """``text`` cut at :data:`MAX_ERROR_CHARS`, saying how much was left out."""
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[:MAX_ERROR_CHARS] + f"... ({len(text) - MAX_ERROR_CHARS} more characters)"


def storable(text: str) -> str:
    """``text`` as every engine can store it, the same way on each: NUL (which PostgreSQL refuses
    and SQLite's functions cut at) becomes the six characters ``\\u0000``, and a lone surrogate
    (not UTF-8 at all) becomes its ``\\udXXX`` escape. Other text is returned as it is."""
    if "\x00" in text:
        text = text.replace("\x00", "\\u0000")
    if not is_utf8(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _json(value: Any) -> str:
    """``value`` as JSON text, other than ASCII kept as it is (as payloads are): a ``\\u20ac`` escape
    reaches jsonb only in a UTF-8 database (a SQL_ASCII one refuses every escape above ``\\u007f``)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _storable_json(encoded: str) -> str:
    # The JSON text escapes NUL as \u0000, which jsonb refuses, and keeps a lone surrogate, which is
    # not UTF-8. Re-encode from the value with every string made storable.
    return _json(_map_strings(json.loads(encoded)))


def _map_strings(value: Any) -> Any:
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, list):
        return [_map_strings(v) for v in value]
    if isinstance(value, dict):
        mapped = {storable(k): _map_strings(v) for k, v in value.items()}
        if len(mapped) != len(value):
            # Two keys became one ("\x00" and the six characters "\\u0000"): one value would be lost.
            raise ValueError("two keys of one dict are the same text once made storable")
        return mapped
    return value


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except BaseException:
        return f"<unprintable {type(value).__qualname__}>"


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except BaseException:
        return f"<unprintable {type(value).__qualname__}>"
