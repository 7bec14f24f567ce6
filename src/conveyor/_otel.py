"""The producer's side of OpenTelemetry tracing (see :mod:`conveyor.tracing`), apart from the worker's
so that the producer can use it without importing the worker."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

TRACER_NAME = "conveyor"


def available() -> bool:
    """Whether the OpenTelemetry API is importable."""
    return importlib.util.find_spec("opentelemetry") is not None and (
        importlib.util.find_spec("opentelemetry.trace") is not None
    )


_api: Any = None
# Whether OTEL_PYTHON_TRACER_PROVIDER names a provider, read once like OpenTelemetry's other settings.
_named: bool | None = None


def configured() -> bool:
    """Whether a tracer provider was set (an SDK): without one no span records, and the producer and
    the worker skip tracing altogether (reading a job's headers for nothing cost the hot path). Called
    once per job: the API module is looked up once, not imported on every call."""
    global _api, _named
    if _named is None:
        _named = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
    if _api is None:
        # A provider is set by code that imported the API, or named by OTEL_PYTHON_TRACER_PROVIDER:
        # with neither, none can be set yet, and the producer's first send does not pay the API's
        # import (~8 ms, and 3 ms more for the propagators).
        if "opentelemetry.trace" not in sys.modules and not _named:
            return False
        from opentelemetry import trace

        _api = trace
    if not _named and hasattr(_api, "_TRACER_PROVIDER"):
        # Set by code or not at all. Until it is, the API's get_tracer_provider() reads os.environ
        # on every call (~5 us of each job's ~200 us in a worker whose handlers import the API, as
        # redis-py does); its module's global says the same. Should it ever go, ask the API.
        provider = _api._TRACER_PROVIDER
        return provider is not None and not isinstance(provider, _api.ProxyTracerProvider)
    return not isinstance(_api.get_tracer_provider(), _api.ProxyTracerProvider)


_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: object) -> str | None:
    """``value`` if it is a W3C ``traceparent`` (version, trace id, parent id, flags; lower-case hex,
    ids not all zeros), else None: an invalid one is ignored and the trace starts afresh, as the W3C
    Trace Context recommendation asks of a receiver."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str) and _TRACEPARENT.fullmatch(value):
        return value
    return None


@contextmanager
def send_span(task: str, queue: str | None, count: int, parent: str | None = None) -> Iterator[str | None]:
    """A ``PRODUCER`` span around one send of ``count`` jobs; yields the W3C ``traceparent`` to store
    in the jobs' headers: the span's, else ``parent`` (None when neither: no SDK, or not sampled).

    ``parent``, a valid ``traceparent`` (an HTTP request's), is the span's parent instead of the
    current context; without an SDK it is what the jobs carry, so their handlers still continue the
    caller's trace."""
    if not configured():
        yield parent
        return
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer(TRACER_NAME)
    attributes: dict[str, Any] = {"messaging.system": "conveyor", "conveyor.task": task}
    if queue is not None:
        attributes["conveyor.queue"] = queue
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    within = propagate.extract({"traceparent": parent}) if parent is not None else None
    with tracer.start_as_current_span(
        f"send {task}", context=within, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            propagate.inject(carrier)
        yield carrier.get("traceparent", parent)


def first_task(tasks: Sequence[object]) -> str:
    """The span name's task for a batch: the task if all jobs share it, else ``many`` (also when
    the first is not a string, such as a list from a hostile HTTP body: its batch is refused inside
    the span; hashing it here was a 500)."""
    if not tasks:  # no Message among a hostile send_many's items: refused inside the span
        return "many"
    first = tasks[0]
    if type(first) is str and all(t == first for t in tasks):
        return first
    return "many"
