"""The envelope: what a producer sends, validated and encoded once, before it reaches the database."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from types import MappingProxyType
from typing import Any
from uuid import UUID

from conveyor._errors import PayloadError, PayloadTooLarge
from conveyor._ids import random_bytes, uuid7
from conveyor._limits import MAX_JSON_DEPTH, check_seconds

#: The default payload size limit (bytes of encoded JSON). Large data belongs in object storage.
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024

#: Header keys Conveyor itself fills in when the producer does not.
SCHEMA_VERSION = "schema_version"
TRACEPARENT = "traceparent"
CORRELATION_ID = "correlation_id"


#: The default of Message.payload: each message then gets an empty dict of its own.
_NO_PAYLOAD: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One job to enqueue: the envelope of DESIGN §1.

    ``payload`` must be a JSON object (it becomes the handler's keyword arguments). ``queue`` None
    means the task's declared queue (or ``"default"``). Give either ``delay`` (seconds) or ``run_at``;
    either ``ttl`` (seconds) or ``expires_at``. ``id`` is minted here (UUIDv7) when not given, so a
    producer knows it before the enqueue commits. The fields are checked when the message is sent
    (``App.send_many``), against the limits of ``conveyor._limits``: a bad one raises PayloadError
    and nothing is written."""

    task: str
    payload: Mapping[str, Any]
    queue: str | None
    priority: int | None
    delay: float | None
    run_at: datetime | None
    ttl: float | None
    expires_at: datetime | None
    idempotency_key: str | None
    ordering_key: str | None
    headers: Mapping[str, Any] | None
    max_attempts: int | None
    id: UUID

    # Written by hand: a frozen dataclass's own __init__ sets each field through
    # object.__setattr__, half the cost of building a message (a bulk send builds thousands). The
    # slots' descriptors set them directly; the message stays as immutable as before.
    def __init__(
        self,
        task: str,
        payload: Mapping[str, Any] = _NO_PAYLOAD,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        ttl: float | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        max_attempts: int | None = None,
        id: UUID | None = None,
    ) -> None:
        s = _SETTERS
        s[0](self, task)
        s[1](self, {} if payload is _NO_PAYLOAD else payload)
        s[2](self, queue)
        s[3](self, priority)
        s[4](self, delay)
        s[5](self, run_at)
        s[6](self, ttl)
        s[7](self, expires_at)
        s[8](self, idempotency_key)
        s[9](self, ordering_key)
        s[10](self, headers)
        s[11](self, max_attempts)
        s[12](self, uuid7() if id is None else id)


# The slot descriptors' setters of Message's fields, in declaration order.
_SETTERS: tuple[Any, ...] = tuple(vars(Message)[f.name].__set__ for f in fields(Message))


# One encoder for every call: json.dumps with options builds a new JSONEncoder each time, which
# was a third of the encoding cost of a 20,000-job send_many. Same output as
# json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# The same encoder's C core, made once: JSONEncoder.encode builds it anew on every call, which was
# most of the cost of encoding a small payload. Without a markers dict it does not look for
# circular references; those end in RecursionError instead, which encode_json_object reports.
_C_ENCODE = (
    c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False)
    if c_make_encoder is not None
    else None
)


def encode_json_object(value: Mapping[str, Any], what: str, limit: int | None = None) -> str:
    """Encode a JSON object compactly; raise PayloadError if it is not one, is over ``limit`` bytes,
    is nested deeper than ``MAX_JSON_DEPTH``, or holds a string no engine can store (NUL, a lone
    surrogate)."""
    if type(value) is not dict:  # the ABC check costs 0.25 µs a row
        if not isinstance(value, Mapping):
            raise PayloadError(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
        value = dict(value)  # a read-only or chained mapping: the encoder writes dicts only
    try:
        text = "".join(_C_ENCODE(value, 0)) if _C_ENCODE is not None else _ENCODER.encode(value)
    except RecursionError:
        raise PayloadError(
            f"{what} is not JSON-serialisable (it contains itself, or is nested deeper than {MAX_JSON_DEPTH} levels)"
        ) from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"{what} is not JSON-serialisable ({exc}); Conveyor stores JSON only, never pickle: "
            "send plain data, or a reference (an object key, a row id) to the data"
        ) from None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise PayloadError(
                f"{what} holds a string that is not valid Unicode (a lone surrogate such as '\\ud800'), "
                "which cannot be stored as UTF-8"
            ) from None
    if limit is not None and size > limit:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {limit}-byte limit: store the data elsewhere "
            "(object storage, a table) and enqueue a reference to it (an object key, a row id)"
        )
    # The encoder writes a NUL character as the escape \u0000, which PostgreSQL's jsonb refuses; it
    # is refused here, on every engine, so that a job means the same wherever it is stored.
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise PayloadError(
            f"{what} holds a string with a NUL character (\\u0000), which PostgreSQL cannot store: "
            "remove it, or encode binary data (base64) first"
        )
    # Nesting deeper than MAX_JSON_DEPTH takes two brackets per level, so short texts are never too deep.
    if len(text) > 2 * MAX_JSON_DEPTH and _too_deep(text):
        raise PayloadError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
    if value and keys_collide(value):
        raise PayloadError(
            f"{what} has a dict with two keys that JSON writes as the same text (1 and '1', True and 'true', "
            "None and 'null'): one value would be lost"
        )
    return text


def decode_payload(text: str) -> dict[str, Any]:
    """A stored payload as the handler's keyword arguments. Raises PayloadError (the job is dead at
    once, whatever its task's ``dead_on``) for one the producer would have refused and only raw SQL or
    another writer stores: text that is not JSON Python can read (an integer of 4,300+ digits, nesting
    past the recursion limit, which was retried to max_attempts), or JSON that is not an object."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: not JSON, or an integer of 4,300+ digits
        raise PayloadError(f"the stored payload is not JSON Python can read ({str(exc)[:200]})") from None
    if type(value) is not dict:
        raise PayloadError(
            f"the stored payload is not a JSON object but {_json_kind(value)}: "
            "a handler takes its payload's keys as keyword arguments"
        )
    return value


def _json_kind(value: Any) -> str:
    """What a decoded JSON value is, as JSON names it."""
    if value is None:
        return "null"
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


_CONTAINERS = (dict, list, tuple)
_SCALARS = frozenset((str, int, float, bool, type(None)))


def keys_collide(value: Any) -> bool:
    """Whether some dict in ``value`` (one the encoder took) has two keys that JSON writes as the same
    text: the encoder turns ``1``, ``True``, ``None`` and ``1.5`` into strings, so ``{1: "a", "1": "b"}``
    is written with the key ``"1"`` twice and read back as ``{"1": "b"}``, one value silently lost.

    Cheap where it can be, as it runs on every payload and every kept result (0.3-0.6 µs for a flat one):
    a dict's keys are compared only when one of them is not a string, and a dict or list of scalars is
    passed over in C."""
    if isinstance(value, dict):
        for key in value:
            if type(key) is not str:
                # A non-str key is written as json.dumps writes it as a value ("true", "null", "1.5"), a
                # str subclass's as its text (compared as a plain str: its own __eq__/__hash__ may hide twins).
                if len({str.__str__(k) if isinstance(k, str) else json.dumps(k) for k in value}) != len(value):
                    return True
                break
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return False
    if _SCALARS.issuperset(map(type, items)):
        return False
    return any(keys_collide(item) for item in items if isinstance(item, _CONTAINERS))


# ``\u0000`` preceded by an even number of backslashes: an escaped NUL, not an escaped backslash
# followed by the text "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A JSON string (brackets inside it do not nest), and an innermost array or object.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_INNERMOST = re.compile(r"[\[{][^\[\]{}]*[\]}]")


def _too_deep(text: str) -> bool:
    """Whether the JSON ``text`` nests deeper than MAX_JSON_DEPTH. Every consumer must be able to
    decode an accepted job: text nested nearly as deep as Python's recursion limit encodes here but
    fails to decode in a worker's deeper stack."""
    if text.count("{") + text.count("[") <= MAX_JSON_DEPTH:
        return False
    bare = _JSON_STRING.sub('""', text)
    for _ in range(MAX_JSON_DEPTH):
        bare, found = _INNERMOST.subn("0", bare)
        if not found:
            return False
    return "[" in bare or "{" in bare


def new_traceparent() -> str:
    """A fresh W3C traceparent (version 00, sampled) for a job sent outside any trace."""
    ids = random_bytes(24).hex()
    return f"00-{ids[:32]}-{ids[32:]}-01"


def complete_headers(headers: Mapping[str, Any] | None, job_id: UUID, traceparent: str | None = None) -> dict[str, Any]:
    """The headers as stored: the producer's, plus ``schema_version`` (1), a ``traceparent`` (the
    send's trace span's when tracing, else a fresh one) and a ``correlation_id`` (the job id) where
    the producer gave none."""
    out: dict[str, Any] = dict(headers or {})
    out.setdefault(SCHEMA_VERSION, 1)
    out.setdefault(TRACEPARENT, traceparent or new_traceparent())
    out.setdefault(CORRELATION_ID, str(job_id))
    return out


def encode_headers(
    headers: Mapping[str, Any] | None, job_id: UUID, limit: int | None = None, traceparent: str | None = None
) -> str:
    """:func:`complete_headers` encoded as JSON. Without producer headers (the common case) the
    text is assembled directly: the same bytes as encoding the dict, at a fraction of the cost."""
    if headers is not None and type(headers) is not dict and not isinstance(headers, Mapping):
        raise PayloadError(f"headers must be a JSON object (a dict), got {type(headers).__name__}")
    if not headers:
        parent = traceparent or new_traceparent()
        return f'{{"{SCHEMA_VERSION}":1,"{TRACEPARENT}":"{parent}","{CORRELATION_ID}":"{job_id}"}}'
    version = headers.get(SCHEMA_VERSION, 1)
    if type(version) is not int or version < 1:
        raise PayloadError(f"headers' {SCHEMA_VERSION} must be an integer of at least 1, got {version!r}")
    return encode_json_object(complete_headers(headers, job_id, traceparent), "headers", limit)


def resolve_times(message: Message, now: datetime) -> tuple[datetime, datetime | None]:
    """Return ``(run_at, expires_at)`` from the message's delay/run_at and ttl/expires_at.

    Raises PayloadError for both of a pair, a delay or ttl that is not a finite number of seconds
    in range (NaN, infinity, negative, over 100 years), or a time that is not an aware datetime."""
    if message.delay is not None and message.run_at is not None:
        raise PayloadError("give either delay or run_at, not both")
    if message.ttl is not None and message.expires_at is not None:
        raise PayloadError("give either ttl or expires_at, not both")
    run_at = now
    if message.delay is not None:
        run_at = now + timedelta(seconds=check_seconds(message.delay, "delay"))
    elif message.run_at is not None:
        run_at = _aware(message.run_at, "run_at")
    expires_at: datetime | None = None
    if message.ttl is not None:
        ttl = check_seconds(message.ttl, "ttl", strict=True)
        try:
            expires_at = _not_after_latest(run_at + timedelta(seconds=ttl), "run_at + ttl")
        except OverflowError:
            raise PayloadError(
                f"run_at + ttl is past the latest time a job may carry ({run_at.isoformat()} + {ttl:g}s)"
            ) from None
    elif message.expires_at is not None:
        expires_at = _aware(message.expires_at, "expires_at")
    return run_at, expires_at


#: The latest time a job may carry. SQLite keeps times as REAL seconds, which near the year 10000 step by
#: ~30 µs: 9999-12-31T23:59:59.999985Z and later were stored as the year 10000, which no read could turn
#: back into a datetime (the worker's fetch loop stopped on it, for every job of its queue).
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _aware(value: object, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise PayloadError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise PayloadError(f"{name} must be timezone-aware (e.g. datetime.now(UTC)), got a naive datetime")
    try:
        at = value.astimezone(UTC)
    except OverflowError:
        raise PayloadError(
            f"{name} is out of range: {value.isoformat()} is not within the years 1 to 9999 in UTC"
        ) from None
    return _not_after_latest(at, name)


def _not_after_latest(at: datetime, name: str) -> datetime:
    if at > LATEST:
        raise PayloadError(f"{name} is past the latest time a job may carry ({at.isoformat()} > {LATEST.isoformat()})")
    return at
