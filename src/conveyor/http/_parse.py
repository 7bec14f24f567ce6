"""Reading requests: strict JSON, a message's fields by name, query parameters, cursors.

Only the *shape* of a request is checked here (JSON that decodes, known field names, JSON types
that can mean something); every value is checked where the Python API checks it
(``conveyor._limits``, ``Message``, ``App.prepare``), so that a request means what the same call
means in Python. Every failure is a :class:`BadRequest` naming the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import unquote_to_bytes
from uuid import UUID

from conveyor._errors import ConveyorError
from conveyor._limits import MAX_JSON_DEPTH
from conveyor._message import Message

#: The fields of a job in a request body (``Message``'s, without the id: the service mints it).
JOB_FIELDS = (
    "task",
    "payload",
    "headers",
    "priority",
    "delay",
    "run_at",
    "ttl",
    "expires_at",
    "idempotency_key",
    "ordering_key",
    "max_attempts",
)
#: What a published message may carry (the rest of a job comes from each subscription).
PUBLISH_FIELDS = ("payload", "headers", "priority", "delay", "run_at", "ttl", "expires_at", "idempotency_key")
_TIMES = ("run_at", "expires_at")
# RFC 3339's date-time (section 5.6), the one form a time is sent in, with "T" and "Z" in either case as
# the RFC allows. Not the other ISO 8601 forms datetime.fromisoformat also reads (20300101T000000Z,
# 2030-W01-1T00:00Z, an offset with seconds, a space before the Z), and not a space for the "T": the RFC
# leaves that to the application, and JSON Schema's "date-time", which the OpenAPI document states, has none.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)
_INTEGER = re.compile(r"-?[0-9]{1,12}")
#: The form of a time in a request, as the 400 for another form and the OpenAPI document show it.
RFC3339_FORM = "YYYY-MM-DDTHH:MM:SS[.fraction] then Z or +HH:MM or -HH:MM, e.g. 2030-01-01T09:30:00Z"


class BadRequest(ConveyorError):
    """A request that cannot mean anything: answered 400, naming ``field`` where there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _no_constant(name: str) -> Any:
    raise BadRequest(f"the body holds {name}, which is not JSON (numbers must be finite)")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BadRequest(f"the number {text[:40]} is too large (numbers must be finite)")
    return value


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose names are unique; json.loads kept the last value of a name given twice, silently."""
    made = dict(pairs)
    if len(made) != len(pairs):
        names = [name for name, _ in pairs]
        twice = next(name for i, name in enumerate(names) if name in names[:i])
        raise BadRequest(
            f"the body names {twice!r:.60} twice in one object; a name may appear once in an object "
            "(which of its values would count is not defined)"
        )
    return made


def loads(body: bytes) -> Any:
    """Decode a request body as strict JSON (UTF-8; no NaN or Infinity; finite numbers; every name once in
    its object; at most MAX_JSON_DEPTH levels, which the payload's own check repeats exactly); raise
    BadRequest."""
    if not body.strip():
        raise BadRequest("the body is empty: send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique)
    except RecursionError:
        raise BadRequest(f"the body is nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        # An integer of more than 4,300 digits (Python's int limit for text).
        raise BadRequest(f"the body holds a number that cannot be read: {str(exc)[:80]}") from None


def obj(value: Any, what: str = "body") -> dict[str, Any]:
    """``value`` if it is a JSON object, else BadRequest."""
    if not isinstance(value, dict):
        raise BadRequest(f"the {what} must be a JSON object, got {_kind(value)}", None if what == "body" else what)
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def message(
    body: Mapping[str, Any],
    *,
    queue: str | None,
    prefix: str = "",
    idempotency_key: str | None = None,
    headers: Mapping[str, Any] | None = None,
) -> Message:
    """A Message from the fields of a request body. ``prefix`` names where the body sits
    (``jobs[3].``) in error messages; ``idempotency_key`` is the ``Idempotency-Key`` header's
    value; ``headers`` replaces the body's headers (already stamped with the sender)."""
    given = fields(body, prefix=prefix, idempotency_key=idempotency_key, headers=headers)
    if queue is not None:
        given["queue"] = queue
    return Message(**given)


def fields(
    body: Mapping[str, Any],
    *,
    allowed: tuple[str, ...] = JOB_FIELDS,
    prefix: str = "",
    idempotency_key: str | None = None,
    headers: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of a request body as keyword arguments of ``Message`` (see :func:`message`)."""
    for name in body:
        if name not in allowed:
            raise BadRequest(
                f"unknown field {prefix}{name!r:.60}; a job has: {', '.join(allowed)}",
                f"{prefix}{name}"[:200],
            )
    given: dict[str, Any] = {k: v for k, v in body.items() if v is not None}
    if "task" in allowed and "task" not in given:
        raise BadRequest(f"{prefix}task is required", f"{prefix}task")
    for name in ("payload", "headers"):
        if name in given and not isinstance(given[name], dict):
            raise BadRequest(f"{prefix}{name} must be a JSON object, got {_kind(given[name])}", f"{prefix}{name}")
    for name in _TIMES:
        if name in given:
            given[name] = _time(given[name], f"{prefix}{name}")
    if idempotency_key is not None:
        key = given.get("idempotency_key")
        if key is not None and key != idempotency_key:
            raise BadRequest(
                "the Idempotency-Key header and the body's idempotency_key differ", f"{prefix}idempotency_key"
            )
        given["idempotency_key"] = idempotency_key
    if headers is not None:
        given["headers"] = headers
    return given


def header_text(raw: bytes, field: str) -> str:
    """A header's value as text: UTF-8, as a body's strings are, so that a key sent in the header and the same key
    in the body (or from Python) are one key. Latin-1, HTTP's historical reading, made the UTF-8 bytes of ``ké``
    the key ``kÃ©``. Raises BadRequest naming ``field`` for bytes that are not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the {field} header is not UTF-8 (byte {exc.start})", field) from None


def undecodable_url(path: str, raw_path: bytes, query: bytes) -> str | None:
    """ "path" or "query" if that part of a request's URL is not UTF-8 once percent-decoded, else None.

    The server decodes the path with U+FFFD for what is not UTF-8 (``caf%E9`` and ``caf%EF`` were both the queue
    ``caf\ufffd``), and Starlette the query alike: a name the client did not write, shared with others."""
    if "\ufffd" in path:
        try:
            unquote_to_bytes(raw_path).decode("utf-8")
        except UnicodeDecodeError:
            return "path"
    if b"%" in query:
        try:
            unquote_to_bytes(query).decode("utf-8")
        except UnicodeDecodeError:
            return "query"
    return None


def _time(value: Any, field: str) -> datetime:
    """An RFC 3339 date-time, in UTC (digits past microseconds are dropped), or BadRequest naming ``field``."""
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be an RFC 3339 time (a string), got {_kind(value)}", field)
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise BadRequest(f"{field} must be an RFC 3339 time ({RFC3339_FORM}), got {value[:40]!r}", field)
    year, month, day, hour, minute, second, fraction, sign, offset_hours, offset_minutes = match.groups()
    try:
        if sign is None:
            zone = UTC
        elif int(offset_hours) > 23 or int(offset_minutes) > 59:
            raise ValueError("the offset must be at most 23:59")
        else:
            offset = timedelta(hours=int(offset_hours), minutes=int(offset_minutes))
            zone = timezone(-offset if sign == "-" else offset)
        microsecond = int((fraction or "")[:6].ljust(6, "0"))
        parsed = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), microsecond, tzinfo=zone
        )
    except ValueError as exc:
        raise BadRequest(f"{field} is not a valid time: {value[:40]!r} ({exc})", field) from None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise BadRequest(
            f"{field} is out of range: {value[:40]} is not within the years 1 to 9999 in UTC", field
        ) from None


def field_of(message: str, prefix: str = "") -> str | None:
    """The field an error message of ``conveyor._limits`` is about: they start with its name."""
    first = message.split(" ", 1)[0]
    if first == "reason":  # an operator action's (the operator API's messages start with it too)
        return first
    return f"{prefix}{first}" if first in JOB_FIELDS or first == "queue" else None


def int_param(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """A query parameter that must be an integer in ``low..high``."""
    text = params.get(name)
    if text is None:
        return default
    # ASCII digits only: int() also reads "5_0", "+5", " 5" and the digits of other scripts (full-width ones).
    value = int(text) if _INTEGER.fullmatch(text) else None
    if value is None or not low <= value <= high:
        raise BadRequest(f"{name} must be an integer from {low} to {high}", name)
    return value


_DECIMAL = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?")


def float_param(params: Mapping[str, str], name: str) -> float | None:
    """An optional query parameter that must be a positive decimal number (``2``, ``2.5``; not ``nan``, ``inf``,
    ``1e3``): None when absent."""
    text = params.get(name)
    if text is None:
        return None
    if not _DECIMAL.fullmatch(text) or float(text) <= 0:
        raise BadRequest(f"{name} must be a positive decimal number (e.g. 2.5)", name)
    return float(text)


def str_param(params: Mapping[str, str], name: str) -> str | None:
    """An optional text query parameter (empty means absent)."""
    return params.get(name) or None


def uuid_of(text: str, field: str) -> UUID:
    """A job id, or BadRequest naming ``field``."""
    try:
        return UUID(text)
    except (ValueError, TypeError, AttributeError):
        raise BadRequest(f"{field} is not a job id (a UUID): {str(text)[:40]!r}", field) from None


def cursor(before: tuple[datetime, UUID]) -> str:
    """The opaque ``before`` cursor of a dead-letter page: the last row's (failed_at, id)."""
    raw = f"{before[0].isoformat()}|{before[1]}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def parse_cursor(text: str) -> tuple[datetime, UUID]:
    """The (failed_at, id) a ``before`` cursor stands for, or BadRequest."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")
        at, _, job_id = raw.partition("|")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError(at)
        return when, UUID(job_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadRequest("before is not a cursor this service handed out (next_before)", "before") from None
