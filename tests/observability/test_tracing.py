"""OpenTelemetry: the producer's span is the parent of the handler's span (through the job's
traceparent header), with queue, task, attempt and outcome as attributes; spans the handler opens
are children of its span, in its thread too. Recorded by the SDK's in-memory exporter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conveyor import App, JobContext

from .conftest import drain


def test_the_handler_span_continues_the_trace_of_the_send(app: App, spans: InMemorySpanExporter) -> None:
    @app.task(queue="q", name="greet")
    def greet(name: str) -> str:
        with trace.get_tracer("user").start_as_current_span("inside handler"):
            return f"hello {name}"

    job = greet.delay(name="ada")
    drain(app)

    by_name = {s.name: s for s in spans.get_finished_spans()}
    send, process, inside = by_name["send greet"], by_name["process greet"], by_name["inside handler"]
    assert send.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
    assert send.context is not None and process.context is not None and inside.context is not None
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.context.trace_id == send.context.trace_id
    assert inside.parent is not None and inside.parent.span_id == process.context.span_id
    assert dict(process.attributes or {}) == {
        "messaging.system": "conveyor",
        "conveyor.queue": "q",
        "conveyor.task": "greet",
        "conveyor.attempt": 1,
        "conveyor.job_id": str(job.id),
        "conveyor.outcome": "completed",
    }
    assert (send.attributes or {})["conveyor.queue"] == "q"
    # The stored header is the producer span's context.
    # (The flags are the SDK's: sampled, and "random trace id" on recent SDKs.)
    assert job.status().headers["traceparent"][:-3] == f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}"


def test_each_attempt_is_a_span_with_its_outcome(app: App, spans: InMemorySpanExporter) -> None:
    @app.task(queue="q", name="flaky", max_attempts=2, backoff=[0.0])
    async def flaky(ctx: JobContext) -> None:
        raise ConnectionError(f"attempt {ctx.attempt}")

    flaky.delay()
    drain(app)

    (send,) = [s for s in spans.get_finished_spans() if s.name == "send flaky"]
    runs = sorted((s for s in spans.get_finished_spans() if s.name == "process flaky"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})["conveyor.attempt"] for s in runs] == [1, 2]
    assert [(s.attributes or {})["conveyor.outcome"] for s in runs] == ["retried", "dead"]
    assert all(s.status.status_code == StatusCode.ERROR for s in runs)
    assert "ConnectionError: attempt 2" in (runs[1].status.description or "")
    assert send.context is not None
    assert all(s.parent is not None and s.parent.span_id == send.context.span_id for s in runs)


def test_a_caller_traceparent_is_kept_and_send_many_is_one_span(app: App, spans: InMemorySpanExporter) -> None:
    from conveyor import Message

    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    kept = app.send("t", {}, queue="q", headers={"traceparent": given})
    jobs = app.send_many([Message(task="t", payload={"n": n}, queue="q") for n in range(3)])

    assert kept.status().headers["traceparent"] == given
    (batch,) = [
        s
        for s in spans.get_finished_spans()
        if s.name == "send t" and (s.attributes or {}).get("messaging.batch.message_count") == 3
    ]
    assert batch.context is not None
    parents = {j.status().headers["traceparent"][:-3] for j in jobs}
    assert parents == {f"00-{batch.context.trace_id:032x}-{batch.context.span_id:016x}"}


def test_delay_many_is_one_span_whose_context_every_job_carries(app: App, spans: InMemorySpanExporter) -> None:
    @app.task(name="fan", queue="q")
    def fan(n: int) -> None: ...

    jobs = fan.delay_many([{"n": n} for n in range(100)])
    (batch,) = [s for s in spans.get_finished_spans() if s.name == "send fan"]
    assert (batch.attributes or {})["messaging.batch.message_count"] == 100
    assert (batch.attributes or {})["conveyor.queue"] == "q"
    assert batch.context is not None
    parents = {j.status().headers["traceparent"][:-3] for j in jobs}
    assert parents == {f"00-{batch.context.trace_id:032x}-{batch.context.span_id:016x}"}


_LATE_PROVIDER = """
import sys
from conveyor import App

app = App(sys.argv[1])
app.backend.migrate()
app.send("t", {})
assert "opentelemetry.trace" not in sys.modules, "the first send imported the OpenTelemetry API"
assert "opentelemetry.propagate" not in sys.modules, "the first send imported the propagators"

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from conveyor.tracing import configured

assert not configured(), "the API imported but no provider set counts as configured"
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
app.send("t", {})
print([s.name for s in exporter.get_finished_spans()])
"""


def test_a_send_before_tracing_is_set_up_imports_no_api_and_a_later_provider_records(tmp_path: Path) -> None:
    # No SDK yet and nobody imported the API: the first send must not pay its import (~10 ms of a
    # first 1,000-job send_many); a provider set afterwards records the next send's span.
    out = subprocess.run(
        [sys.executable, "-c", _LATE_PROVIDER, f"sqlite:///{tmp_path / 'q.db'}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['send t']"


def test_a_provider_named_by_the_environment_is_configured() -> None:
    # OTEL_PYTHON_TRACER_PROVIDER names a provider that no code sets: the API loads it when asked.
    script = "from conveyor.tracing import configured; print(configured())"
    env = {**os.environ, "OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}
    named = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    env.pop("OTEL_PYTHON_TRACER_PROVIDER")
    unnamed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert (named.stdout.strip(), unnamed.stdout.strip()) == ("True", "False"), named.stderr + unnamed.stderr


def test_a_send_span_given_a_parent_is_its_child_and_hands_its_own_context_on(spans: InMemorySpanExporter) -> None:
    # What the HTTP service does with a request's traceparent: its producer span is a child of the
    # caller's span, and the jobs carry the producer span's context (same trace, the span's own id).
    from conveyor._otel import send_span, valid_traceparent

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert valid_traceparent(parent.encode()) == parent
    with send_span("t", "q", 3, valid_traceparent(parent)) as carried:
        pass
    (span,) = [s for s in spans.get_finished_spans() if s.name == "send t"]
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    assert span.context is not None and span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert carried == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"
    assert (span.attributes or {})["messaging.batch.message_count"] == 3


def test_a_send_many_of_things_that_are_not_messages_is_refused_inside_its_span(
    app: App, spans: InMemorySpanExporter
) -> None:
    # With a tracer provider the span's attributes read every message: a dict among them was an
    # AttributeError, a batch of none an IndexError, where the untraced send says PayloadError.
    import pytest

    from conveyor import Message, PayloadError

    for bad in ([{"task": "t"}], [Message("t", {}), {"task": "t"}]):
        with pytest.raises(PayloadError, match="takes Message objects, got dict"):
            app.send_many(bad)  # type: ignore[arg-type]
