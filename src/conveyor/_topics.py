"""Fan-out topics: which subscriptions a published message's headers match."""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from conveyor._errors import ConfigurationError, PayloadError
from conveyor._idempotency import same_json
from conveyor._limits import check_name, preview
from conveyor._message import Message, encode_json_object

if TYPE_CHECKING:
    from conveyor.backends.base import Subscription


#: The header every copy of a publish carries: the name of the topic it was published to.
TOPIC = "topic"


def parse_filter(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate a subscription filter: ``{header: value}`` (equality) or ``{header: {"in": [...]}}`` (one
    value at least). Raises ConfigurationError, also for a value no engine can store."""
    if text is None:
        return {}
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or an integer of 4,300+ digits
            raise ConfigurationError(f"subscription filter is not JSON: {exc}") from None
    elif isinstance(text, Mapping):
        value = dict(text)
    else:
        raise ConfigurationError(f"a subscription filter must be a JSON object, got {type(text).__name__}")
    if not isinstance(value, dict):
        raise ConfigurationError("a subscription filter must be a JSON object of header conditions")
    for key, condition in value.items():
        if isinstance(condition, dict):
            if set(condition) != {"in"} or not isinstance(condition["in"], list):
                raise ConfigurationError(
                    f'filter on {_shown(key)}: a condition object must be {{"in": [values...]}}, '
                    f"got {_shown(condition)}"
                )
            if not condition["in"]:
                # No header value is one of none: the subscription would never receive a message.
                raise ConfigurationError(
                    f'filter on {_shown(key)}: {{"in": []}} matches no message: give at least one value to match'
                )
        elif isinstance(condition, list):
            raise ConfigurationError(f'filter on {_shown(key)}: use {{"in": [...]}} to match one of several values')
    try:
        # NaN and infinity first, in words for a filter: encode_json_object's are for a payload.
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"subscription filter is not JSON ({exc})") from None
    except RecursionError:
        pass  # encode_json_object names the depth
    try:
        # What a payload must be too: no NUL, valid Unicode, not too deep. A filter is the subscriber's
        # configuration, refused as the rest of a subscription is.
        encode_json_object(value, "subscription filter")
    except PayloadError as exc:
        raise ConfigurationError(str(exc)) from None
    return value


def _shown(value: object) -> str:
    """A filter's key or condition in an error message, bounded: a condition nested 5,000 deep overflowed the stack
    of the full repr (a RecursionError traceback), a 10 MB key made a 10 MB message."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60


def matches(filter_: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """True when every condition of the filter holds for the headers (a missing header fails). Values
    compare as JSON values: ``true`` is not ``1``, ``0`` is not ``false``; ``1`` is ``1.0``."""
    for key, condition in filter_.items():
        if key not in headers:
            return False
        value = headers[key]
        if isinstance(condition, dict):
            if not any(same_json(value, one) for one in condition["in"]):
                return False
        elif not same_json(value, condition):
            return False
    return True


def published(
    topic: str,
    payload: Mapping[str, Any] | None,
    headers: Mapping[str, Any] | None,
    envelope: Mapping[str, Any],
    subscriptions: Callable[[str], Iterable[Subscription]],
    check: Callable[[Message], object],
) -> list[Message]:
    """The messages one publish sends: one per subscription of ``topic`` (``subscriptions`` reads
    them) whose filter matches ``headers``, each with the ``topic`` header and the ``envelope``'s
    Message fields (not ``queue`` or ``task``: a subscription's). Raises PayloadError for a bad
    payload, headers (a ``topic`` header naming another topic) or option, subscriber or not: ``check``
    validates a message as a send would (``Producer.prepare``). An idempotency key is held per queue, as
    for a send: a queue subscribed to two topics holds one key for both."""
    topic = check_name(topic, "topic")
    if headers is not None and not isinstance(headers, Mapping):
        raise PayloadError(f"headers must be a JSON object (a dict), got {type(headers).__name__}")
    given = (headers or {}).get(TOPIC, topic)
    if given != topic:
        # The header states which topic the copy came from, as ``sent_by`` states which token sent a job: never
        # the producer's to set. Overwritten, a producer's own "topic" header was lost without a word; the same
        # name is taken, so that a handler may publish again the headers of a copy it received.
        shown = preview(given) if isinstance(given, str) else f"a value of type {type(given).__name__}"
        raise PayloadError(
            f"headers' {TOPIC} is the name of the topic published to ({preview(topic)}), set by publish: got "
            f"{shown}; give your header another name"
        )
    body = payload if payload is not None else {}
    merged = {**(headers or {}), TOPIC: topic}
    options = dict(envelope)
    for named in ("queue", "task"):
        if named in options:
            # Refused subscriber or not: taken with none, it broke the publish once a queue was subscribed.
            raise PayloadError(f"publish takes no {named}=: each subscription names the queue and task of its job")
    try:
        # Publishing is sending: the message is checked whole with no subscriber too.
        check(Message(task=topic, payload=body, headers=merged, **options))
        messages = []
        for sub in subscriptions(topic):
            if matches(json.loads(sub.filter), merged):
                messages.append(Message(task=sub.task, payload=body, queue=sub.queue, headers=merged, **options))
    except TypeError as exc:
        raise PayloadError(f"bad publish option: {exc}") from None
    return messages
