"""The envelope: ids, JSON-only payloads, the size limit, headers, times."""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from uuid import UUID, SafeUUID

import pytest

from conveyor import App, Message, PayloadError
from conveyor._backoff import ExponentialBackoff, FixedSchedule
from conveyor._ids import uuid7


@pytest.fixture
def app(sqlite_url: str) -> Iterator[App]:
    a = App(sqlite_url)
    yield a
    a.close()


def test_uuid7_is_version_7_and_monotonic() -> None:
    ids = [uuid7() for _ in range(10_000)]
    assert all(i.version == 7 for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_uuid7_is_equal_to_the_uuid_of_its_text() -> None:
    minted = uuid7()
    plain = UUID(str(minted))
    assert (minted == plain, hash(minted) == hash(plain), minted.is_safe) == (True, True, SafeUUID.unknown)
    assert pickle.loads(pickle.dumps(minted)) == minted


def test_a_forked_process_mints_ids_of_its_own() -> None:
    """A prefork server imports the app, then forks: parent and child must not share the unread
    randomness (nor the id clock), or both mint the same id in the same millisecond and the second
    job is taken for a resend of the first (nothing enqueued)."""
    uuid7()  # the parent's pool now holds unread randomness a child would inherit
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: mint, report, leave at once (no pytest teardown in a child)
        try:
            os.write(write, ",".join(str(uuid7()) for _ in range(200)).encode())
        finally:
            os._exit(0)
    os.close(write)
    parent = [uuid7() for _ in range(200)]
    with os.fdopen(read, "rb") as pipe:
        child = [UUID(text) for text in pipe.read().decode().split(",")]
    os.waitpid(pid, 0)
    random_bits = 0x3FFF_FFFF_FFFF_FFFF
    assert len(child) == 200
    assert not {u.int & random_bits for u in parent} & {u.int & random_bits for u in child}


def test_a_message_is_a_frozen_envelope_with_its_own_defaults() -> None:
    first, second = Message("t"), Message("t")
    assert first.payload == {} and first.payload is not second.payload  # a fresh dict each
    assert (first.queue, first.priority, first.headers, first.max_attempts) == (None, None, None, None)
    assert first.id != second.id and first.id.version == 7
    given = uuid7()
    positional = Message("t", {"a": 1}, "q", 5, None, None, None, None, "k", "o", {"h": 1}, 3, given)
    assert positional == Message(
        task="t", payload={"a": 1}, queue="q", priority=5, idempotency_key="k", ordering_key="o",
        headers={"h": 1}, max_attempts=3, id=given,
    )  # fmt: skip
    assert dataclasses.replace(positional, priority=6).priority == 6
    assert dataclasses.replace(positional) == positional
    with pytest.raises(dataclasses.FrozenInstanceError):
        positional.task = "u"  # type: ignore[misc]
    with pytest.raises(TypeError, match="unexpected keyword argument 'prio'"):
        Message("t", prio=1)  # type: ignore[call-arg]
    # An explicit None payload stays None, and the send refuses it (as it always did).
    assert Message("t", None).payload is None  # type: ignore[arg-type]


def test_a_message_whose_payload_is_none_is_refused(app: App) -> None:
    with pytest.raises(PayloadError, match="payload must be a JSON object"):
        app.send_many([Message("t", None)])  # type: ignore[arg-type]


def test_non_json_payload_is_refused_with_a_clear_error(app: App) -> None:
    with pytest.raises(PayloadError, match=r"not JSON-serialisable.*reference"):
        app.send("t", {"when": datetime.now(UTC)})
    with pytest.raises(PayloadError, match="must be a JSON object"):
        app.send("t", [1, 2])  # type: ignore[arg-type]


def test_payload_over_the_limit_names_the_limit_and_suggests_a_reference(app: App) -> None:
    with pytest.raises(PayloadError, match=r"over the 262144-byte limit.*reference"):
        app.send("t", {"blob": "x" * 300_000})
    small = App(app.database_url, max_payload_bytes=100)
    try:
        with pytest.raises(PayloadError, match="100-byte limit"):
            small.send("t", {"blob": "x" * 200})
    finally:
        small.close()


def test_nothing_is_enqueued_when_one_message_of_a_batch_is_bad(app: App) -> None:
    good = Message("t", {"a": 1}, queue="atomic")
    with pytest.raises(PayloadError):
        app.send_many([good, Message("t", {"a": float("nan")}, queue="atomic")])
    from conveyor.backends.base import QueuesStatsParams

    stats = app.backend.queues_stats(QueuesStatsParams(datetime.now(UTC)))
    assert [s for s in stats if s.queue == "atomic"] == []


def test_headers_are_completed(app: App) -> None:
    job = app.send("t", {}, headers={"tenant": "acme", "correlation_id": "req-1"})
    headers = job.status().headers
    assert headers["tenant"] == "acme"
    assert headers["correlation_id"] == "req-1"
    assert headers["schema_version"] == 1
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, len(trace_id), len(span_id), len(flags)) == ("00", 32, 16, 2)
    # Sampled. Conveyor's own traceparent says 01; once a test has installed an OpenTelemetry SDK (the global
    # tracer provider cannot be unset), the SDK's span context may add the random-trace-id flag (03).
    assert int(flags, 16) & 1 == 1, flags


def test_a_payload_that_contains_itself_is_refused_with_a_clear_error(app: App) -> None:
    loop: dict[str, object] = {}
    loop["self"] = loop
    with pytest.raises(PayloadError, match="contains itself"):
        app.send("t", loop)


def test_default_headers_are_the_same_json_as_completed_headers_encoded() -> None:
    import json

    from conveyor._message import complete_headers, encode_headers, encode_json_object

    job_id = uuid7()
    fast = encode_headers(None, job_id)
    slow = encode_json_object(complete_headers(None, job_id), "headers")
    # Same keys in the same order, same spacing: only the random traceparent differs.
    assert list(json.loads(fast)) == list(json.loads(slow)) == ["schema_version", "traceparent", "correlation_id"]
    assert fast.replace(json.loads(fast)["traceparent"], "") == slow.replace(json.loads(slow)["traceparent"], "")
    assert encode_headers({}, job_id).startswith('{"schema_version":1,"traceparent":"00-')


def test_id_is_known_before_send(app: App) -> None:
    message = Message("t", {})
    job = app.send_many([message])[0]
    assert job.id == message.id


def test_delay_run_at_ttl(app: App) -> None:
    before = datetime.now(UTC)
    delayed = app.send("t", {}, delay=60).status()
    assert delayed.run_at >= before + timedelta(seconds=59)
    with pytest.raises(PayloadError, match="either delay or run_at"):
        app.send("t", {}, delay=1, run_at=before)
    with pytest.raises(PayloadError, match="timezone-aware"):
        app.send("t", {}, run_at=datetime.now())
    with pytest.raises(PayloadError, match="bad send option"):
        app.send("t", {}, colour="blue")


def test_backoff_full_jitter_bounds() -> None:
    backoff = ExponentialBackoff(base=1, cap=10)
    for attempts in range(1, 8):
        for _ in range(100):
            assert 0 <= backoff.delay(attempts) <= min(10, 2**attempts)
    assert FixedSchedule([60, 300, 1800]).delay(1) == 60
    assert FixedSchedule([60, 300, 1800]).delay(9) == 1800
    with pytest.raises(ValueError):
        FixedSchedule([])
