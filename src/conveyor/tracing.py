"""OpenTelemetry tracing (``pip install 'conveyor[otel]'``, plus an SDK or a vendor distribution
configured as the global tracer provider).

- **Producer**: every ``send``/``send_many``/``delay`` (and ``publish``) runs in a ``PRODUCER`` span
  named ``send <task>``; its context is written into each job's ``traceparent`` header, unless the
  caller gave one.
- **Worker**: the handler runs inside a ``CONSUMER`` span named ``process <task>`` whose parent is the
  job's ``traceparent``, with the attributes ``conveyor.queue``, ``conveyor.task``, ``conveyor.attempt``,
  ``conveyor.job_id`` and, once decided, ``conveyor.outcome`` (completed, retried, dead, expired); a
  failed attempt sets the span's status to error. The span is current while the handler runs (in its
  thread too), so spans the handler opens are its children.

Without ``opentelemetry`` installed nothing here is used; with the API but no tracer provider set (no
SDK), the producer and the worker skip tracing (one check per send and per job) and jobs keep their
random ``traceparent``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from conveyor._otel import TRACER_NAME, available, configured, send_span
from conveyor.backends.base import Delivery
from conveyor.worker._observe import Observer, Outcome, outcome_name

__all__ = ["HandlerTracing", "available", "configured", "send_span"]


class HandlerTracing(Observer):
    """The worker's observer that runs each handler inside a span continuing the job's trace."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace

        self._trace = trace
        self._context = context
        self._propagate = propagate
        self._tracer = trace.get_tracer(TRACER_NAME)

    def before_run(self, delivery: Delivery, now: datetime) -> Any:
        if not configured():
            return None
        try:
            headers = json.loads(delivery.headers)
        except ValueError:
            headers = {}
        carrier = {k: v for k in ("traceparent", "tracestate") if isinstance(v := headers.get(k), str)}
        parent = self._propagate.extract(carrier)
        span = self._tracer.start_span(
            f"process {delivery.task}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "conveyor",
                "conveyor.queue": delivery.queue,
                "conveyor.task": delivery.task,
                "conveyor.attempt": delivery.attempts + 1,
                "conveyor.job_id": str(delivery.id),
            },
        )
        token = self._context.attach(self._trace.set_span_in_context(span))
        return span, token

    def after_run(self, delivery: Delivery, outcome: Outcome | None, seconds: float, token: Any) -> None:
        if token is None:
            return
        span, attached = token
        name = outcome_name(outcome)
        span.set_attribute("conveyor.outcome", name)
        if name in ("retried", "dead"):
            error = getattr(outcome, "error", None)
            description = f"{error.type}: {error.message}" if error is not None else name
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description[:500]))
        span.end()
        self._context.detach(attached)
