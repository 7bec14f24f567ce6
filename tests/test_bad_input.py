"""Bad input through the Python API (issue 14): a clear error, nothing written, the same on every engine.

Every value a caller gives (message fields, task, queue, backoff and worker options, schedule and
topic names) is checked once above the seam (``conveyor._limits``), so the memory, SQLite and
PostgreSQL engines refuse exactly the same things, before anything is written."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from conveyor import (
    App,
    ConfigurationError,
    ExponentialBackoff,
    FixedSchedule,
    JobContext,
    JobNotFoundError,
    Message,
    PayloadError,
    Reject,
    Retry,
    Worker,
)
from conveyor._limits import MAX_JSON_DEPTH, MAX_KEY_BYTES, MAX_NAME_CHARS
from conveyor._message import LATEST
from conveyor.admin import ScalingPolicy
from conveyor.backends.base import DeadListParams, JobGetParams, QueuesStatsParams, Schedule, SchedulesUpsertParams
from conveyor.testing import drain
from conveyor.worker._calls import BackendCalls
from conveyor.worker._state import Counters
from conveyor.worker.scheduler import Scheduler

NAN = math.nan
INF = math.inf


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def app(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[App]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{os.fspath(tmp_path)}/conveyor.db"
    else:
        url = str(request.getfixturevalue("postgres_database"))
    a = App(url, migrate=True)
    yield a
    a.close()


def _nothing_written(app: App) -> None:
    assert app.backend.queues_stats(QueuesStatsParams(datetime.now(UTC))) == []
    assert app.backend.schedules_list() == []


def _deep(levels: int) -> dict[str, Any]:
    """A JSON object nested ``levels`` deep (the object itself is level 1)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


# -- numbers -----------------------------------------------------------------------------------

BAD_ENVELOPES: list[tuple[dict[str, Any], str]] = [
    ({"delay": NAN}, "delay must be a finite number"),
    ({"delay": INF}, "delay must be a finite number"),
    ({"delay": -1}, "delay must be >= 0"),
    ({"delay": 1e12}, "100 years"),
    ({"delay": "10"}, "delay must be a number of seconds"),
    ({"ttl": NAN}, "ttl must be a finite number"),
    ({"ttl": -INF}, "ttl must be a finite number"),
    ({"ttl": 0}, "ttl must be > 0"),
    ({"priority": 2**31}, "priority must be between -2,147,483,648 and 2,147,483,647"),
    ({"priority": -(2**31) - 1}, "priority must be between"),
    ({"priority": 1.5}, "priority must be an integer"),
    ({"priority": NAN}, "priority must be an integer"),
    ({"priority": True}, "priority must be an integer"),
    ({"max_attempts": 0}, "max_attempts must be between 1 and 1,000,000"),
    ({"max_attempts": -3}, "max_attempts must be between"),
    ({"max_attempts": 2.0}, "max_attempts must be an integer"),
    ({"max_attempts": 10**7}, "max_attempts must be between"),
    ({"run_at": "2030-01-01T00:00:00Z"}, "run_at must be a datetime"),
    ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
    ({"expires_at": 12.5}, "expires_at must be a datetime"),
    # SQLite stored the last ~15 µs of the year 9999 as the year 10000, which no read could take back.
    ({"run_at": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)}, "run_at is past the latest time"),
    ({"expires_at": datetime.max.replace(tzinfo=UTC)}, "expires_at is past the latest time"),
    ({"run_at": datetime.max.replace(tzinfo=UTC), "ttl": 60}, "run_at is past the latest time"),
    ({"run_at": LATEST, "ttl": 0.001}, r"run_at \+ ttl is past the latest time"),
    ({"run_at": LATEST, "ttl": 1}, r"run_at \+ ttl is past the latest time"),
    (  # the message showed the datetime's repr
        {"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=12)))},
        "^run_at is out of range: 9999-12-31T23:00:00-12:00 is not within the years 1 to 9999 in UTC$",
    ),
    (
        {"expires_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))},
        "expires_at is out of range: 0001-01-01T",
    ),
]


@pytest.mark.parametrize(("envelope", "message"), BAD_ENVELOPES, ids=lambda v: repr(v)[:40])
def test_bad_numbers_and_times_are_refused_before_anything_is_written(
    app: App, envelope: dict[str, Any], message: str
) -> None:
    with pytest.raises(PayloadError, match=message):
        app.send("t", {"x": 1}, queue="q", **envelope)
    # In a batch, the good message before it is not written either, and the error names the bad one.
    with pytest.raises(PayloadError, match=message.removesuffix("$") + r".* \(job 1 of the send\)$"):
        app.send_many([Message("t", {"x": 0}, queue="q"), Message("t", {"x": 1}, queue="q", **envelope)])
    _nothing_written(app)


def test_numbers_at_the_limits_are_stored_as_given(app: App) -> None:
    low = app.send("t", {}, queue="q", priority=-(2**31), max_attempts=1_000_000, delay=0)
    high = app.send("t", {}, queue="q", priority=2**31 - 1, max_attempts=1, ttl=0.001, delay=3600)
    assert (low.status().priority, low.status().max_attempts) == (-(2**31), 1_000_000)
    assert (high.status().priority, high.status().max_attempts) == (2**31 - 1, 1)
    last = app.send("t", {}, queue="q", run_at=LATEST, expires_at=LATEST)
    assert last.status().run_at == LATEST


# -- names and keys ----------------------------------------------------------------------------


def _incompressible(chars: int) -> str:
    """Random CJK text (3 bytes a character): PostgreSQL cannot compress it to fit an index entry."""
    rng = random.Random(chars)
    return "".join(chr(0x4E00 + rng.randrange(20_000)) for _ in range(chars))


LONG_NAME = "n" * (MAX_NAME_CHARS + 1)
LONG_KEY = _incompressible(MAX_KEY_BYTES // 3 + 1)

BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"queue": LONG_NAME}, f"queue is {MAX_NAME_CHARS + 1} characters long, over the {MAX_NAME_CHARS}"),
    ({"task": LONG_NAME}, "task is 201 characters long"),
    ({"task": ""}, "task must not be empty"),
    ({"queue": ""}, "queue must not be empty"),
    ({"queue": 7}, "queue must be a string, got int"),
    ({"task": None}, "task must be a string, got NoneType"),
    ({"queue": "a\x00b"}, "queue contains a NUL character"),
    ({"task": "t\ud800"}, "task is not valid Unicode"),
    ({"idempotency_key": LONG_KEY}, f"idempotency_key is {len(LONG_KEY.encode())} bytes, over the 512-byte"),
    ({"ordering_key": "k" * (MAX_KEY_BYTES + 1)}, "ordering_key is 513 bytes"),
    ({"idempotency_key": 42}, "idempotency_key must be a string, got int"),
    ({"ordering_key": b"bytes"}, "ordering_key must be a string, got bytes"),
    ({"idempotency_key": ""}, "idempotency_key must not be empty"),
    ({"idempotency_key": "k\x00"}, "idempotency_key contains a NUL"),
    ({"ordering_key": "\udcff"}, "ordering_key is not valid Unicode"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_FIELDS, ids=lambda v: repr(v)[:40])
def test_names_and_keys_past_the_limits_are_refused_before_anything_is_written(
    app: App, fields: dict[str, Any], message: str
) -> None:
    """Today PostgreSQL's btree limit was reported as "database unavailable" (and retried forever);
    SQLite took what PostgreSQL refuses. Now every engine refuses the same, before the insert."""
    fields = dict(fields)  # the parameters are shared by the engines
    task = fields.pop("task", "t")
    with pytest.raises(PayloadError, match=message):
        app.send_many([Message("t", {}, queue="q"), Message(task, {}, **{"queue": "q", **fields})])
    _nothing_written(app)


def test_names_and_keys_at_the_limits_are_accepted(app: App) -> None:
    key = "é" * (MAX_KEY_BYTES // 2)  # 512 bytes
    job = app.send("t" * MAX_NAME_CHARS, {}, queue="q" * MAX_NAME_CHARS, idempotency_key=key, ordering_key=key)
    status = job.status()
    assert (status.queue, status.task) == ("q" * MAX_NAME_CHARS, "t" * MAX_NAME_CHARS)
    again = app.send("t" * MAX_NAME_CHARS, {}, queue="q" * MAX_NAME_CHARS, idempotency_key=key)
    assert again.id == job.id


# -- JSON --------------------------------------------------------------------------------------


def test_deeply_nested_payloads_are_refused(app: App) -> None:
    app.send("t", _deep(MAX_JSON_DEPTH), queue="q")  # at the limit: accepted
    for levels in (MAX_JSON_DEPTH + 1, 990, 100_000):  # 990 used to be accepted, 100,000 a RecursionError
        with pytest.raises(PayloadError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            app.send("t", _deep(levels), queue="deep")
    with pytest.raises(PayloadError, match="nested deeper"):
        app.send("t", {}, queue="deep", headers=_deep(MAX_JSON_DEPTH + 1))
    # Brackets inside strings do not nest.
    app.send("t", {"text": "[" * 500 + "{" * 500}, queue="q")
    assert [s.queue for s in app.backend.queues_stats(QueuesStatsParams(datetime.now(UTC)))] == ["q"]


def test_nul_in_payload_or_headers_is_refused_on_every_engine(app: App) -> None:
    """PostgreSQL's jsonb cannot store \\u0000; refusing it everywhere keeps one meaning per job."""
    for payload, headers in (
        ({"s": "a\x00b"}, None),
        ({"nested": [{"k": "\x00"}]}, None),
        ({"key\x00": 1}, None),
        ({}, {"tenant": "acme\x00"}),
    ):
        with pytest.raises(PayloadError, match="NUL character"):
            app.send("t", payload, queue="q", headers=headers)
    with pytest.raises(PayloadError, match="not valid Unicode"):
        app.send("t", {"s": "\ud83d"}, queue="q")
    _nothing_written(app)


def test_a_payload_whose_keys_json_writes_alike_is_refused_on_every_engine(app: App) -> None:
    """{1: "a", "1": "b"} was written with the key "1" twice and read back as {"1": "b"}: one value silently lost
    (the README: a payload round-trips or is not accepted)."""
    colliding: list[dict[Any, Any]] = [
        {1: "a", "1": "b"},
        {True: 1, "true": 2},
        {None: 1, "null": 2},
        {"outer": [{"x": 1}, {1.5: "a", "1.5": "b"}]},
    ]
    for payload in colliding:
        with pytest.raises(PayloadError, match="two keys that JSON writes as the same text"):
            app.send("t", payload, queue="q")
        with pytest.raises(PayloadError, match=r"two keys that JSON writes as the same text.*\(job 1 of the send\)"):
            app.send_many([Message(task="t", queue="q"), Message(task="t", payload=payload, queue="q")])
    with pytest.raises(PayloadError, match="two keys that JSON writes as the same text"):
        app.send("t", {}, queue="q", headers={1: "a", "1": "b"})
    _nothing_written(app)
    # A non-string key alone is written as its text, as before.
    job = app.send("t", {1: "a", "n": {None: 2}}, queue="q")
    assert job.status().payload == {"1": "a", "n": {"null": 2}}


ROUND_TRIP = {
    "backslash-u0000 as text": "\\u0000",
    "backslashes": "\\\\u0000 \\",
    "controls": "\x01\x07\x08\x1b[31m\x7f\x9b",
    "newlines": "a\nb\r\nc\td",
    "unicode": "é ß 中文 🚀 \u202e \ufeff",
    "quotes": "\"'`",
    "numbers": [0, -1, 2**53, 1.5, -0.0, 1e-300],
    "empty": ["", {}, [], None, True, False],
}


def test_payloads_and_headers_round_trip_identically_on_every_engine(app: App) -> None:
    job = app.send("t", ROUND_TRIP, queue="q", headers={"tricky": "\\u0000 \x1b é"})
    status = job.status()
    assert status.payload == ROUND_TRIP
    assert status.headers["tricky"] == "\\u0000 \x1b é"


# -- options -----------------------------------------------------------------------------------

BAD_TASK_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"visibility_timeout": NAN}, "visibility_timeout must be a finite number"),
    ({"visibility_timeout": INF}, "visibility_timeout must be a finite number"),
    ({"visibility_timeout": 0}, r"visibility_timeout must be >= 0\.5"),
    # Taken before: shorter than the heartbeat's 0.2 s, so a job of a few seconds was rescued and run again
    # until it was dead-lettered as poison (test_a_lease_shorter_than_the_heartbeat_is_refused).
    ({"visibility_timeout": 0.1}, r"visibility_timeout must be >= 0\.5 and at most"),
    ({"timeout": NAN}, "timeout must be a finite number"),
    ({"timeout": -1}, "timeout must be > 0"),
    ({"max_attempts": 0}, "max_attempts must be between 1"),
    ({"max_attempts": NAN}, "max_attempts must be an integer"),
    ({"max_deliveries": 0}, "max_deliveries must be between 1"),
    ({"max_deliveries": 10**9}, "max_deliveries must be between"),
    ({"priority": 2**40}, "priority must be between"),
    ({"version": 0}, "version must be between 1"),
    ({"backoff": [1, NAN]}, "a fixed backoff delay must be a finite number"),
    ({"backoff": [-5]}, "a fixed backoff delay must be >= 0"),
    ({"backoff": []}, "needs one or more"),
    ({"backoff": ExponentialBackoff}, "backoff must be"),
    ({"dead_on": ["ValueError"]}, "dead_on must list exception classes"),
    ({"ack_policy": "sometimes"}, "ack_policy must be"),
    ({"queue": ""}, "queue must not be empty"),
    ({"queue": LONG_NAME}, "queue is 201 characters long"),
    ({"name": LONG_NAME}, "task name is 201 characters long"),
    ({"name": ""}, "task name must not be empty"),
]


@pytest.mark.parametrize(("options", "message"), BAD_TASK_OPTIONS, ids=lambda v: repr(v)[:40])
def test_bad_task_options_raise_configuration_error(options: dict[str, Any], message: str) -> None:
    app = App("memory://")
    with pytest.raises(ConfigurationError, match=message):

        @app.task(**options)
        def handler() -> None:
            pass

    assert app.tasks == {}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ExponentialBackoff(base=NAN), "backoff base must be a finite number"),
        (lambda: ExponentialBackoff(cap=INF), "backoff cap must be a finite number"),
        (lambda: ExponentialBackoff(base=-1), "backoff base must be >= 0"),
        (lambda: FixedSchedule([60, INF]), "a fixed backoff delay must be a finite number"),
        (lambda: FixedSchedule("60"), "needs one or more"),  # type: ignore[arg-type]
    ],
)
def test_bad_backoff_values_raise_configuration_error(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_exponential_backoff_survives_a_million_attempts() -> None:
    """max_attempts may be 1,000,000: 2 ** attempts must not overflow a float on the way."""
    backoff = ExponentialBackoff(jitter=False)  # base 1.0 s, cap 3600 s
    assert backoff.delay(10_000) == 3600


BAD_QUEUE_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"max_depth": 0}, "max_depth must be between 1"),
    ({"max_depth": 2**31}, "max_depth must be between"),
    ({"max_depth": NAN}, "max_depth must be an integer"),
    ({"dedup_window": timedelta(0)}, "dedup_window must be positive"),
    ({"dedup_window": 60}, "dedup_window must be a datetime.timedelta"),
    ({"retention": timedelta(days=-1)}, "retention must be positive"),
    ({"sla": 30.0}, "sla must be a datetime.timedelta"),
    ({"shedding": {"low": NAN}}, "shedding needs low/normal/high fractions"),
    ({"shedding": {"low": "half"}}, "shedding needs"),
    # Graduated: a higher class is never refused before a lower one (before, both were taken silently, and the
    # second shed normal sends at 30 % while low ones went on to the default 50 %).
    ({"shedding": {"low": 1.0, "normal": 0.8, "high": 0.5}}, r"low 1 above normal 0\.8"),
    ({"shedding": {"normal": 0.3}}, r"low 0\.5 \(the default\) above normal 0\.3"),
    ({"shedding": {"high": 0.7}}, r"normal 0\.8 \(the default\) above high 0\.7"),
    ({"on_expire": "drop"}, "on_expire must be"),
    ({"concurrency": 0}, "concurrency must be between 1"),
]


@pytest.mark.parametrize(("options", "message"), BAD_QUEUE_OPTIONS, ids=lambda v: repr(v)[:40])
def test_bad_queue_options_raise_configuration_error(options: dict[str, Any], message: str) -> None:
    app = App("memory://")
    with pytest.raises(ConfigurationError, match=message):
        app.queue("q", **options)
    with pytest.raises(ConfigurationError, match="queue is 201 characters long"):
        app.queue(LONG_NAME)
    assert app.queues == {}


def test_a_partial_shedding_is_the_default_ladder_with_the_given_classes() -> None:
    # What the contract prints and what sends meet: every class, the given ones and the defaults.
    app = App("memory://")
    options = app.queue("q", max_depth=10, shedding={"low": 0.2})
    assert dict(options.shedding) == {"low": 0.2, "normal": 0.8, "high": 1.0}
    assert (options.limit_for(-1), options.limit_for(0), options.limit_for(1)) == (2, 8, 10)


def test_bad_app_options_raise_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="max_payload_bytes must be between 1"):
        App("memory://", max_payload_bytes=0)
    with pytest.raises(ConfigurationError, match=r"dedup_window must be a datetime\.timedelta"):
        App("memory://", dedup_window=3600)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"visibility_timeout": NAN}, "visibility_timeout must be a finite number"),
        ({"visibility_timeout": 0}, r"visibility_timeout must be >= 0\.5"),
        ({"visibility_timeout": 0.499}, r"visibility_timeout must be >= 0\.5 and at most"),
        ({"graceful_timeout": INF}, "graceful_timeout must be a finite number"),
        ({"concurrency": 0}, "concurrency must be between 1"),
        ({"prefetch": -1}, "prefetch must be between 0"),
        ({"worker_id": "w" * 513}, "worker_id is 513 bytes, over the 512-byte limit"),
        ({"worker_id": "host\x00:1"}, "worker_id contains a NUL character"),
        ({"worker_id": "host\ud800:1"}, "worker_id is not valid Unicode"),
        # Each was taken, and its loop queried the database without pause (about 90 % of a core, idle).
        ({"poll_interval": 1e-9}, r"poll_interval must be >= 0\.01 and at most"),
        ({"heartbeat_interval": 1e-9}, r"heartbeat_interval must be >= 0\.01"),
        ({"schedule_interval": 1e-9}, r"schedule_interval must be >= 0\.01"),
        ({"rescue_interval": 0.009}, r"rescue_interval must be >= 0\.01"),
        ({"prune_interval": 1e-300}, r"prune_interval must be >= 0\.01"),
        ({"presence_interval": 5e-324}, r"presence_interval must be >= 0\.01"),
        # Each was taken: leases ran out between heartbeats, and every job longer than one ran twice.
        ({"heartbeat_interval": 60}, r"heartbeat_interval \(60 s\) must be shorter than visibility_timeout \(30 s\)"),
        ({"heartbeat_interval": 5, "visibility_timeout": 5}, r"heartbeat_interval \(5 s\) must be shorter"),
    ],
)
def test_bad_worker_options_raise_before_anything_is_leased(options: dict[str, Any], message: str) -> None:
    """A lease of NaN seconds is stored as NULL on SQLite: the job would never expire or be rescued."""
    app = App("memory://")
    app.send("t", {}, queue="q")
    with pytest.raises(ConfigurationError, match=message):
        Worker(app, ["q"], burst=True, **options)
    assert app.backend.queues_stats(QueuesStatsParams(datetime.now(UTC)))[0].pending == 1


def test_an_empty_queue_list_is_refused_and_a_queue_named_twice_is_drained_once() -> None:
    # Before: an empty list drained every queue the app's tasks declare (a filter that kept no queue took
    # all the work), and a queue named twice was kept twice: each round acquired from it twice and the
    # worker registry listed it twice.
    app = App("memory://")
    app.send("t", {}, queue="q")
    for empty in ([], (), iter([])):
        with pytest.raises(ConfigurationError, match="queues is empty: name at least one queue, or give None"):
            Worker(app, empty, burst=True)
    assert app.backend.queues_stats(QueuesStatsParams(datetime.now(UTC)))[0].pending == 1
    worker = Worker(app, ["b", "a", "b", "a"], weights={"a": 2, "b": 1})
    assert (worker.queues, worker.config.queues) == (["b", "a"], ("b", "a"))


def test_a_lease_shorter_than_the_heartbeat_is_refused_and_the_shortest_keeps_its_job(tmp_path: Any) -> None:
    # A task leased for 0.1 s whose handler took 1.5 s was rescued and run again at each heartbeat it
    # missed (the heartbeat extends every 0.2 s at most), and dead-lettered after 10 deliveries
    # without ever failing. Now such a lease is refused, and the shortest one allowed keeps its job.
    app = App(f"sqlite:///{tmp_path}/conveyor.db", migrate=True)
    with pytest.raises(ConfigurationError, match=r"visibility_timeout must be >= 0\.5"):
        app.task(name="too.short", queue="q", visibility_timeout=0.1)(lambda: None)
    runs: list[int] = []

    @app.task(name="shortest", queue="q", visibility_timeout=0.5)
    def shortest(ctx: JobContext) -> None:
        runs.append(ctx.deliveries)
        time.sleep(1.5)

    job = shortest.delay()
    worker = Worker(app, ["q"], burst=True, rescue_interval=0.05, poll_interval=0.02)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    assert (job.status().state, runs, worker.counters.stale_acks) == ("completed", [1], 0)
    app.close()


def test_a_heartbeat_not_shorter_than_a_drained_tasks_lease_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    # A task's lease may be shorter than the worker's default, which WorkerConfig compares the interval
    # with: its jobs running longer than it were rescued and run again, silently.
    app = App("memory://")

    @app.task(name="short", queue="q", visibility_timeout=5)
    def short() -> None:
        pass

    @app.task(queue="q")
    def usual() -> None:
        pass

    @app.task(queue="elsewhere", visibility_timeout=1)
    def not_drained() -> None:
        pass

    with caplog.at_level("WARNING", logger="conveyor.worker"):
        Worker(app, ["q"], heartbeat_interval=10)
        Worker(app, ["q"], heartbeat_interval=4.9)
        Worker(app, ["q"])
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "heartbeat_interval 10 s is not shorter than the visibility_timeout of task(s) 'short': their jobs that "
        "run longer than their lease will be delivered again while they run"
    ]


def test_handler_side_numbers_are_checked_where_the_handler_gives_them() -> None:
    """ctx.extend(nan) would store a lease that never expires; Retry(delay=inf) a run_at past any date."""
    app = App("memory://")
    seen: list[str] = []

    @app.task(queue="q", max_attempts=1)
    def extend_nan(ctx: JobContext) -> None:
        try:
            ctx.extend(NAN)
        except ConfigurationError as exc:
            seen.append(str(exc))
            raise

    @app.task(queue="q", max_attempts=2)
    def retry_inf() -> None:
        raise Retry(delay=INF)

    @app.task(queue="q", max_attempts=2, ack_policy="manual")
    def nack_nan(ctx: JobContext) -> None:
        ctx.nack(NAN)

    extend_nan.delay()
    retry_inf.delay()
    nack_nan.delay()
    result = drain(app)
    assert seen == ["ctx.extend seconds must be a finite number of seconds, got nan"]
    # A ConfigurationError is a ValueError: the handler is wrong, so the job is dead at once.
    assert (result.dead, result.completed, result.retried) == (3, 0, 0)
    errors = sorted(str(r.error_message) for r in app.backend.dead_list(DeadListParams()))
    assert errors == [
        "Retry delay must be a finite number of seconds, got inf",
        "ctx.extend seconds must be a finite number of seconds, got nan",
        "ctx.nack delay must be a finite number of seconds, got nan",
    ]


def test_a_processed_key_past_the_limit_fails_its_handler_not_the_worker(app: App) -> None:
    """ctx.once keys are index entries too (the processed_keys table)."""

    @app.task(queue="q")
    def once(ctx: JobContext) -> None:
        ctx.once("k" * (MAX_KEY_BYTES + 1))

    job = once.delay()
    assert drain(app).dead == 1
    status = job.status()
    assert status.error is not None and "ctx.once key is 513 bytes" in status.error.message


# -- schedules and topics ----------------------------------------------------------------------


def test_bad_schedules_are_refused_before_anything_is_written(app: App) -> None:
    with pytest.raises(ConfigurationError, match="schedule name must not be empty"):
        app.admin.add_schedule("", "* * * * *", "t", actor="test")
    with pytest.raises(ConfigurationError, match="schedule task must not be empty"):
        app.admin.add_schedule("s", "* * * * *", "", actor="test")
    with pytest.raises(ConfigurationError, match="schedule name is 201 characters long"):
        app.admin.add_schedule(LONG_NAME, "* * * * *", "t", actor="test")
    with pytest.raises(ConfigurationError, match="schedule queue is 201"):
        app.admin.add_schedule("s", "* * * * *", "t", queue=LONG_NAME, actor="test")
    with pytest.raises(ConfigurationError, match="priority must be between"):
        app.admin.add_schedule("s", "* * * * *", "t", priority=2**31, actor="test")
    with pytest.raises(PayloadError, match="NUL"):
        app.admin.add_schedule("s", "* * * * *", "t", payload={"x": "\x00"}, actor="test")
    with pytest.raises(ConfigurationError, match="schedule name must not be empty"):

        @app.periodic("* * * * *", name="")
        def nameless() -> None:
            pass

    _nothing_written(app)
    added = app.admin.add_schedule("ok", "*/5 * * * *", "t", queue="reports", payload={"scope": "all"}, actor="test")
    assert [(s.name, s.queue, json.loads(s.payload)) for s in app.backend.schedules_list()] == [
        ("ok", "reports", {"scope": "all"})
    ]
    assert added.cron == "*/5 * * * *"


BAD_CRONS: list[tuple[Any, str]] = [
    ("*/ * * * *", "bad minute field '*/'"),  # was every minute
    ("1_0 * * * *", "bad minute field '1_0'"),  # was minute 10
    ("\u0665 * * * *", "bad minute field '\u0665'"),  # an Arabic-Indic 5: was minute 5
    ("0 0 31 2 *", "never fires"),  # was refused only when the decorator ran, after its task was registered
    (None, "a cron expression must be a string, got NoneType"),  # was an AttributeError
    (5, "a cron expression must be a string, got int"),
]


def test_bad_cron_expressions_are_refused_before_anything_is_written(app: App) -> None:
    for cron, message in BAD_CRONS:
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            app.periodic(cron)
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            app.admin.add_schedule("s", cron, "t", actor="test")
    assert app.tasks == {}
    _nothing_written(app)
    app.admin.add_schedule("s", "0 0 29 2 *", "t", actor="test")
    for cron, message in BAD_CRONS:
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            app.admin.set_schedule("s", cron, actor="test")
    assert [s.cron for s in app.backend.schedules_list()] == ["0 0 29 2 *"]


def test_bad_topic_names_are_refused(app: App) -> None:
    with pytest.raises(ConfigurationError, match="topic is 201 characters long"):
        app.subscribe(LONG_NAME, "q", "t")
    with pytest.raises(ConfigurationError, match="queue must not be empty"):
        app.subscribe("orders", "", "t")
    with pytest.raises(PayloadError, match="topic contains a NUL"):
        app.publish("or\x00ders", {})
    assert app.publish("orders", {}) == []


def test_names_from_non_utf8_bytes_in_lookups_are_one_clear_error(app: App) -> None:
    # A name read from a command line of non-UTF-8 bytes holds lone surrogates. Before, on SQLite,
    # pausing or removing a schedule or unsubscribing by such a name raised a bare UnicodeEncodeError
    # (a traceback at the CLI); PostgreSQL already said UnstorableText.
    # Schedule lookups now check the name as adding one does (below).
    name = b"\xff\xfe".decode("utf-8", "surrogateescape")
    for call in (
        lambda: app.admin.pause_schedule(name, actor="t"),
        lambda: app.admin.remove_schedule(name, actor="t"),
    ):
        with pytest.raises(ConfigurationError, match="schedule name is not valid Unicode"):
            call()
    # Unsubscribing checks its names as subscribing does, on every engine.
    with pytest.raises(ConfigurationError, match="lone surrogate"):
        app.admin.unsubscribe("orders", name, actor="t")
    _nothing_written(app)


def test_bad_dead_letter_arguments_are_one_typed_error_alike_on_every_engine(app: App) -> None:
    @app.task(name="doomed", queue="doomed", max_attempts=1)
    def doomed() -> None:
        raise Reject("always")

    dead = [doomed.delay().id for _ in range(2)]
    assert drain(app, ["doomed"]).dead == 2
    aware = datetime(2030, 1, 1, tzinfo=UTC)
    refused: list[tuple[Any, str]] = [
        # Before: SQLite refused 1.5 and took True, PostgreSQL the reverse (BackendError both), "5" a TypeError.
        (lambda: app.admin.dead_letters(limit=True), "^limit must be an integer, got True$"),
        (lambda: app.admin.dead_letters(limit=1.5), "^limit must be an integer, got float 1.5$"),
        (lambda: app.admin.dead_letters(limit="5"), "^limit must be an integer"),
        (lambda: app.admin.audit(True), "^limit must be an integer"),
        # Before: a TypeError on SQLite; PostgreSQL read the naive time in its session's zone and the string as a time.
        (lambda: app.admin.dead_letters(before=(datetime(2030, 1, 1), dead[0])), "timezone-aware"),
        (lambda: app.admin.dead_letters(before=("2030-01-01T00:00:00Z", dead[0])), "timezone-aware"),
        (lambda: app.admin.dead_letters(before=(aware, "x")), "^not a job id: 'x'$"),  # PostgreSQL: BackendError
        (lambda: app.admin.dead_letters(before=(aware,)), "^before must be the"),  # an IndexError
        (lambda: app.admin.dead_letters(before=aware), "^before must be the"),  # a TypeError
        # A string is a sequence of characters: refused for its first one ("not a job id: '0'").
        (lambda: app.admin.replay(str(dead[0]), reason="r", actor="t"), "^ids must be a list of job ids"),
        (lambda: app.admin.purge(str(dead[0]), reason="r", actor="t"), "^ids must be a list of job ids"),
        # The message quoted all million characters.
        (lambda: app.admin.purge(["x" * 10**6], reason="r", actor="t"), "^not a job id: 'x{40}'\\.\\.\\.$"),
        # Before: the database refused it (UnstorableText) or, when nothing was selected, nothing wrote it.
        (lambda: app.admin.replay(dead[:1], reason="r\udcff", actor="t"), "valid Unicode"),
        (lambda: app.admin.purge(queue="nowhere", reason="r\udcff", actor="t"), "valid Unicode"),
        # NaN slipped past the pacing's comparison: no limit at all.
        (lambda: app.admin.replay(dead, reason="r", actor="t", rate=0.01, max_seconds=NAN), "max_seconds must be"),
        (lambda: app.admin.replay(dead, reason="r", actor="t", rate=0.01, max_seconds="5"), "max_seconds must be"),
    ]
    for call, message in refused:
        with pytest.raises(ConfigurationError, match=message):
            call()
    # The message quoted all million characters (conveyor dlq show printed them).
    with pytest.raises(JobNotFoundError, match=r"^not a job id: 'x{40}'\.\.\.$"):
        app.admin.dead_letter("x" * 10**6)
    assert {s.id for s in app.admin.dead_letters(queue="doomed")} == set(dead), "nothing replayed or purged"
    assert app.admin.audit() == []


def test_a_token_expiry_or_scaling_queues_no_engine_takes_alike_are_refused(app: App) -> None:
    # Before: PostgreSQL stored the first as the year 10000 and every later read of the token table failed;
    # the string and the float were AttributeErrors.
    for expires_at, message in [
        (datetime.max.replace(tzinfo=timezone(-timedelta(hours=14))), "^expires_at must not be after 9999-12-31"),
        (datetime.max.replace(tzinfo=UTC), "^expires_at must not be after"),
        ("2099-01-01T00:00:00Z", "timezone-aware time in the future"),
        (INF, "timezone-aware time in the future"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            app.admin.create_token("t", "operator", expires_at=expires_at, actor="test")
    assert app.admin.tokens() == []
    # Before: a string was its characters, "emails" the queues e, m, a, i, l and s (a recommendation for others).
    with pytest.raises(ConfigurationError, match="not one string"):
        app.admin.scaling(ScalingPolicy(1, 100), queues="emails")


def test_schedule_lookups_refuse_names_no_schedule_can_have(app: App) -> None:
    # Before: on PostgreSQL a NUL in the name failed the statement ("PostgreSQL failed schedules_update:
    # ... cannot contain NUL", a BackendError, which the CLI and HTTP take for the database's fault);
    # the other engines said NotFoundError, quoting a 100,000-character name whole; an int failed
    # PostgreSQL's statement as "operator does not exist: text = smallint".
    app.admin.add_schedule("s", "* * * * *", "t", actor="test")
    cases: list[tuple[object, str]] = [
        ("s\x00", "schedule name contains a NUL character"),
        ("s" * 100_000, "schedule name is 100000 characters long"),
        (5, "schedule name must be a string, got int"),
        ("", "schedule name must not be empty"),
    ]
    admin = app.admin
    lookups: list[tuple[Any, tuple[str, ...]]] = [
        (admin.pause_schedule, ()),
        (admin.resume_schedule, ()),
        (admin.set_schedule, ("0 * * * *",)),
        (admin.remove_schedule, ()),
    ]
    for name, message in cases:
        for lookup, rest in lookups:
            with pytest.raises(ConfigurationError, match=re.escape(message)) as raised:
                lookup(name, *rest, actor="t")
            assert len(str(raised.value)) < 200
    assert [(s.name, s.cron, s.paused) for s in app.backend.schedules_list()] == [("s", "* * * * *", False)]
    assert [e.action for e in app.admin.audit()] == ["schedule.add"]


def test_one_failing_schedule_does_not_block_the_others(app: App) -> None:
    """Schedules fire in name order; one that cannot fire (stored before names had limits, or by
    hand) is logged and skipped, and the ones after it still fire."""
    now = datetime.now(UTC)
    due = now - timedelta(seconds=1)
    rows = [
        # A queue name past the limit: PostgreSQL's index refused its job ("unavailable", forever).
        Schedule("a-long-queue", "* * * * *", "t", _incompressible(1500), "{}", due),
        Schedule("b-not-an-object", "* * * * *", "t", "q", "[1]", due),
        Schedule("c-bad-cron", "not a cron", "t", "q", "{}", due),
        Schedule("d-good", "* * * * *", "t", "q", "{}", due),
    ]
    app.backend.schedules_upsert(SchedulesUpsertParams(rows))
    scheduler = Scheduler(app.producer, BackendCalls(app.backend, Counters()), lambda: now)

    async def run_once() -> int:
        return await asyncio.wait_for(scheduler.run_once(), timeout=30)

    assert asyncio.run(run_once()) == 1
    stats = app.backend.queues_stats(QueuesStatsParams(now))
    assert [(s.queue, s.pending) for s in stats] == [("q", 1)]
    assert asyncio.run(run_once()) == 0  # the bad ones are skipped again, without harm


def test_printable_escapes_what_a_terminal_would_act_on_or_cannot_show() -> None:
    """One helper for the CLI and the pipeline's CLI (they had one each, and the CLI's let a lone
    surrogate through: a UnicodeEncodeError when printed)."""
    from conveyor._errors import printable

    assert printable("plain ünïcode 名前") == "plain ünïcode 名前"
    assert printable("a\x1b[31mb") == "a\\x1b[31mb"
    assert printable("x\u202ey\u2066z") == "x\\u202ey\\u2066z"
    assert printable("bad \udcff byte") == "bad \\udcff byte"
    assert printable("private \ue000 unassigned \U000e0080") == "private \\ue000 unassigned \\U000e0080"
    assert printable("line\u2028para\u2029") == "line\\u2028para\\u2029"
    assert printable("a\nb\tc") == "a\\x0ab\\x09c"
    assert printable("a\nb\tc\x00", multiline=True) == "a\nb\tc\\x00"
    assert printable(42) == "42"
    printable("\udcff".join(chr(c) for c in range(0x2100))).encode("utf-8")  # never a lone surrogate left


# -- found by a hostile sweep of the producer (session 35) -----------------------------------------


@pytest.mark.parametrize("bad", ["not-a-uuid", str(uuid.uuid4()).upper(), uuid.uuid4().hex, 7, b"x" * 16])
def test_a_job_id_that_is_not_a_uuid_is_refused_before_anything_is_written(app: App, bad: object) -> None:
    # Before, SQLite and memory:// stored it as written: an id not in canonical text crashed every
    # worker's fetcher (ValueError), or one in another case was never acked (running forever).
    with pytest.raises(PayloadError, match=r"id must be a uuid\.UUID"):
        app.send("t", {}, id=bad)
    with pytest.raises(PayloadError, match=r"id must be a uuid\.UUID"):
        app.send_many([Message("t", {}), Message("t", {}, id=bad)])  # type: ignore[arg-type]
    _nothing_written(app)


def test_a_uuid_subclass_id_is_stored_as_the_uuid_it_is(app: App) -> None:
    class Mine(uuid.UUID):
        pass

    given = Mine(int=uuid.uuid4().int)
    job = app.send("t", {"x": 1}, id=given)
    assert job.id == given and job.status().state == "pending"


def test_send_many_takes_any_iterable_of_messages_and_refuses_anything_else(app: App) -> None:
    jobs = app.send_many(Message("t", {"n": n}) for n in range(3))
    assert len(jobs) == 3 and all(j.status().state == "pending" for j in jobs)
    for bad in ("abc", Message("t", {}), {"task": "t"}, 5):
        with pytest.raises(PayloadError, match="must be a list of Message objects"):
            app.send_many(bad)  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match="takes Message objects, got dict"):
        app.send_many([{"task": "t"}])  # type: ignore[list-item]


def test_a_payload_that_is_not_an_object_is_refused_even_when_falsy(app: App) -> None:
    # `payload or {}` stored [] and 0 as {}.
    for bad in ([], 0, "", False):
        with pytest.raises(PayloadError, match="payload must be a JSON object"):
            app.send("t", bad)  # type: ignore[arg-type]
    _nothing_written(app)


def test_read_only_and_chained_mappings_are_payloads(app: App) -> None:
    from collections import ChainMap, UserDict
    from types import MappingProxyType

    for given in (MappingProxyType({"a": 1}), UserDict({"a": 1}), ChainMap({"a": 1})):
        job = app.send("t", given)
        assert json.loads(app.backend.job_get(JobGetParams(job.id)).payload) == {"a": 1}  # type: ignore[union-attr]


def test_headers_that_are_not_an_object_or_a_bad_schema_version_are_refused(app: App) -> None:
    for bad in ("abc", [("a", 1)], 5):
        with pytest.raises(PayloadError, match="headers must be a JSON object"):
            app.send("t", {}, headers=bad)
        with pytest.raises(PayloadError, match="headers must be a JSON object"):
            app.publish("news", {}, headers=bad)  # type: ignore[arg-type]
    for version in ("1", 0, -3, True, 1.5):
        with pytest.raises(PayloadError, match="schema_version must be an integer of at least 1"):
            app.send("t", {}, headers={"schema_version": version})
    _nothing_written(app)


def test_publish_checks_its_payload_with_no_subscriber(app: App) -> None:
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        app.publish("news", {"s": {1, 2}})
    with pytest.raises(ConfigurationError, match="subscription filter must be a JSON object"):
        app.subscribe("news", "q", "t", filter=5)  # type: ignore[arg-type]
    for topic, queue in (("news\x00", "q"), ("news", 5)):
        with pytest.raises(ConfigurationError):
            app.unsubscribe(topic, queue)  # type: ignore[arg-type]


def test_wait_refuses_a_timeout_that_is_not_a_finite_number(app: App) -> None:
    job = app.send("t", {})
    for bad in (None, "1", NAN, INF, -1):
        with pytest.raises(ConfigurationError, match="timeout must be"):
            job.wait(timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="poll must be"):
        job.wait(timeout=1, poll=0)


def test_a_worker_given_one_queue_name_as_a_string_is_refused(app: App) -> None:
    # Before, Worker(app, "emails") drained the queues e, m, a, i, l, s.
    with pytest.raises(ConfigurationError, match=r"not one string: give \['emails'\]"):
        Worker(app, "emails")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="weights name queues this worker does not drain: nope"):
        Worker(app, ["emails"], weights={"emails": 1, "nope": 2})


def test_weights_that_leave_out_a_drained_queue_are_refused_as_the_cli_refuses_them() -> None:
    # Before: Worker(app, ["a", "b"], weights={"a": 3}) gave b the weight 1 without a word, while
    # `conveyor worker --queues a:3,b` was refused ("give a weight to every queue or to none").
    app = App("memory://")
    app.task(name="ta", queue="a")(lambda: None)
    app.task(name="tc", queue="c")(lambda: None)
    with pytest.raises(ConfigurationError, match=r"weights give no weight to b, which this worker drains"):
        Worker(app, ["a", "b"], weights={"a": 3})
    # Also when the queues are the ones the app's tasks declare (queues=None).
    with pytest.raises(ConfigurationError, match=r"weights give no weight to c, which this worker drains"):
        Worker(app, weights={"a": 3})
    assert Worker(app, ["a", "b"], weights={"a": 3, "b": 1}).config.weights == {"a": 3, "b": 1}
    assert Worker(app, ["a", "b"], weights={}).config.weights is None


def test_a_periodic_declaration_that_fails_registers_nothing(app: App) -> None:
    def tick() -> None:
        pass

    def tock() -> None:
        pass

    for bad in ({"payload": {"x": NAN}}, {"priority": 2**40}):
        with pytest.raises((PayloadError, ConfigurationError)):
            app.periodic("* * * * *", name="bad", **bad)(tick)  # type: ignore[arg-type]
    assert app.catalogue.task_options(f"{__name__}.{tick.__qualname__}") is None
    app.periodic("* * * * *", name="dup")(tick)
    with pytest.raises(ConfigurationError, match="a schedule named 'dup' is declared already"):
        app.periodic("*/5 * * * *", name="dup")(tock)
    assert app.catalogue.schedules["dup"].cron == "* * * * *"
    assert app.catalogue.task_options(f"{__name__}.{tock.__qualname__}") is None


def test_a_sqlite_file_named_with_a_question_mark_hash_or_percent_is_named_by_a_percent_encoded_url(
    tmp_path: os.PathLike[str],
) -> None:
    # A hostile sweep: sqlite:////dir/what?.db was refused as "takes no options" and pointed at '.../what',
    # and a URL's path was never decoded, so no URL could name a file with '?' or '#' in it ('%3F' named a
    # file called 'what%3F.db'), nor a backend's URL name its own file again.
    from conveyor.backends import in_memory_url
    from conveyor.backends.sqlite import SqliteBackend

    folder = os.fspath(tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        App(f"sqlite:///{folder}/what?.db").send("t", {})
    assert "'?' starts a URL's query string" in str(refused.value)
    assert f"percent-encode it as '%3F' (sqlite:///{folder}/what%3F.db)" in str(refused.value)
    with pytest.raises(ConfigurationError, match="percent-encode it as '%23'"):
        App(f"sqlite:///{folder}/hash#x.db").send("t", {})

    names = {"what?.db": "what%3F.db", "hash#x.db": "hash%23x.db", "pct%.db": "pct%25.db", "a b.db": "a%20b.db"}
    for name, encoded in names.items():
        with App(f"sqlite:///{folder}/{encoded}", migrate=True) as app:
            job = app.send("t", {"file": name})
        # A backend on that file has the URL that names it, and reads the job sent through it.
        with App(backend=SqliteBackend(os.path.join(folder, name))) as again:
            assert again.database_url == f"sqlite:///{folder}/{encoded if name != 'a b.db' else name}"
            with App(again.database_url) as by_url:
                assert by_url.job(job.id).payload == {"file": name}
    assert sorted(n for n in os.listdir(folder) if n.endswith(".db")) == sorted(names)

    # ':memory:' spelled with escapes is the private in-memory database it opens, as said plainly.
    assert in_memory_url("sqlite:///%3Amemory%3A")
    assert App("sqlite:///%3Amemory%3A").in_memory

    # A '%' that starts no escape is itself, as before; escapes that spell no UTF-8 are refused.
    with App(f"sqlite:///{folder}/100%.db", migrate=True) as app:
        app.send("t", {})
    assert os.path.exists(os.path.join(folder, "100%.db"))
    with pytest.raises(ConfigurationError, match="percent-escapes must spell UTF-8"):
        App(f"sqlite:///{folder}/bad%FF.db").send("t", {})

    # A file named before escapes were decoded ('old%20name.db') is not replaced by a new, empty one.
    with App(backend=SqliteBackend(os.path.join(folder, "old%20name.db"))) as app:
        old = app.send("t", {})
    with pytest.raises(ConfigurationError, match=r"does not exist, while .*old%20name\.db.* does.*old%2520name\.db"):
        App(f"sqlite:///{folder}/old%20name.db").send("t", {})
    assert not os.path.exists(os.path.join(folder, "old name.db"))
    with App(f"sqlite:///{folder}/old%2520name.db") as app:
        assert app.job(old.id).state == "pending"
