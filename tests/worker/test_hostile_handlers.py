"""Hostile handlers and refused outcomes: one bad job harms only itself, never its batch or its worker."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import driver_connection

from conveyor import App, BackendUnavailable, JobContext, Retry, Worker
from conveyor._limits import MAX_NAME_CHARS
from conveyor._message import keys_collide
from conveyor.backends.base import JobsListParams, JobsRescueParams
from conveyor.worker._stall import StallWatch


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def run(app: App, timeout: float = 60, **kwargs: Any) -> Worker:
    """Run a burst worker until its queues are empty; fail the test if it takes longer than ``timeout``."""
    worker = Worker(app, burst=True, poll_interval=0.02, **kwargs)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=timeout))
    return worker


def test_text_no_database_can_store_is_stored_escaped_and_harms_no_other_job(app: App) -> None:
    # NUL made the batched finish fail on PostgreSQL (jsonb refuses \u0000, text refuses 0x00): the
    # whole batch was redelivered until max_deliveries, and good jobs ended dead. Lone surrogates
    # (not UTF-8 at all) are the other text no engine can take as it is.
    @app.task(queue="q", max_attempts=1)
    def good(i: int) -> int:
        return i

    @app.task(queue="q")
    def nul_result() -> dict[str, Any]:
        return {"text": "a\x00b", "key\x00": ["\ud800", "ok"]}

    @app.task(queue="q", max_attempts=1)
    def nul_error() -> None:
        raise RuntimeError("bad\x00text \udc80")

    goods = [good.delay(i=i) for i in range(10)]
    result_job = nul_result.delay()
    error_job = nul_error.delay()
    goods += [good.delay(i=i) for i in range(10, 20)]

    worker = run(app)

    assert worker.exit_code == 0
    assert [(j.status().state, j.status().result) for j in goods] == [("completed", i) for i in range(20)]
    assert [j.status().deliveries for j in goods] == [1] * 20
    result = result_job.status()
    assert result.state == "completed"
    assert result.result == {"text": "a\\u0000b", "key\\u0000": ["\\ud800", "ok"]}
    error = error_job.status()
    assert (error.state, error.reason) == ("dead", "max_attempts_exceeded")
    assert error.error is not None
    assert error.error.message == "bad\\u0000text \\udc80"  # whole: SQLite cut it at the NUL before
    assert "RuntimeError: bad\\u0000text" in error.error.traceback


class _Twin(str):
    """A str that equals only itself (its own __eq__ and __hash__): two of the same text are two dict keys."""

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


def test_a_result_whose_keys_collide_as_json_is_kept_as_its_repr_not_silently_cut(app: App) -> None:
    # json.dumps writes 1, True, None and 1.5 as the keys "1", "true", "null" and "1.5": a dict that also
    # has that string key was stored with one of the two values silently lost ({"1": "b"}), at any depth.
    # Such a result is kept as its repr, as a result JSON cannot hold at all is. So is a dict whose
    # keys become one once made storable (NUL and its six-character escape).
    colliding: list[Any] = [
        {1: "a", "1": "b"},
        {"ok": [{"x": 1}, {True: 1, "true": 2}]},
        {"n": {None: 0, "null": 1}},
        {1.5: "a", "1.5": "b"},
        [{"k\x00": 1, "k\\u0000": 2}],
        {_Twin("a"): 1, _Twin("a"): 2},  # a str subclass whose own __eq__ makes two equal texts two keys
    ]
    faithful: list[Any] = [{1: "a", 2: "b"}, {"1": "a", 2: "b"}, {"a": [{True: 1, None: 2, 3.5: 3}]}, [1, "1", [2]]]

    @app.task(queue="q")
    def give(i: int) -> Any:
        return (colliding + faithful)[i]

    jobs = [give.delay(i=i) for i in range(len(colliding) + len(faithful))]
    run(app)

    statuses = [j.status() for j in jobs]
    assert [s.state for s in statuses] == ["completed"] * len(jobs)
    assert [s.result for s in statuses[: len(colliding)]] == [{"repr": repr(v)} for v in colliding]
    # Keys of other types that collide with nothing are still written as JSON writes them.
    assert [s.result for s in statuses[len(colliding) :]] == [
        {"1": "a", "2": "b"},
        {"1": "a", "2": "b"},
        {"a": [{"true": 1, "null": 2, "3.5": 3}]},
        [1, "1", [2]],
    ]


# Few keys, so that a dict often holds a key and its JSON text ({1: .., "1": ..}).
_KEYS = st.sampled_from(["1", "true", "null", "1.5", "a", 1, True, None, 1.5, 2])
_RESULTS = st.recursive(
    st.one_of(st.integers(0, 2), st.text(max_size=2), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple), st.dictionaries(_KEYS, inner, max_size=4)
    ),
    max_leaves=12,
)


def _collides(value: Any) -> bool:
    """The plain rule keys_collide has to keep: some dict has two keys json.dumps writes as one text."""
    if isinstance(value, dict):
        texts = {str.__str__(k) if isinstance(k, str) else json.dumps(k) for k in value}
        return len(texts) != len(value) or any(_collides(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_collides(v) for v in value)


@settings(max_examples=300)
@given(_RESULTS)
def test_the_collision_check_finds_every_dict_whose_keys_collide_as_json(result: Any) -> None:
    assert keys_collide(result) == _collides(result)


def _refuse_archiving(app: App, database_url: str, when: str) -> None:
    """Make the real database refuse to archive a row for which the SQL condition ``when`` holds (a
    trigger; ``NEW`` is the archive row)."""
    app.backend.migrate()
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                f"CREATE TRIGGER refuse BEFORE INSERT ON archive WHEN {when} "
                "BEGIN SELECT RAISE(ABORT, 'this result is refused'); END"
            )
        return
    if database_url.startswith("mysql"):
        with driver_connection(database_url, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(
                f"""CREATE TRIGGER refuse BEFORE INSERT ON archive FOR EACH ROW
                BEGIN
                    IF {when.replace("AS text", "AS CHAR")} THEN
                        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'this result is refused';
                    END IF;
                END"""
            )
        return
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"""CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF {when} THEN RAISE EXCEPTION 'this result is refused'; END IF;
                RETURN NEW;
            END $$"""
        )
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON archive FOR EACH ROW EXECUTE FUNCTION refuse()")


def test_an_outcome_the_database_refuses_dead_letters_only_its_own_job(app: App, database_url: str) -> None:
    _refuse_archiving(app, database_url, "CAST(NEW.result AS text) LIKE '%REFUSE-ME%'")

    @app.task(queue="q")
    def echo(text: str) -> str:
        return text

    jobs = [echo.delay(text=f"ok {i}") for i in range(30)]
    refused = echo.delay(text="please REFUSE-ME")
    jobs += [echo.delay(text=f"ok {i}") for i in range(30, 60)]

    worker = run(app, concurrency=10)

    assert worker.exit_code == 0
    assert [j.status().state for j in jobs] == ["completed"] * 60
    assert [j.status().deliveries for j in jobs] == [1] * 60
    status = refused.status()
    assert (status.state, status.reason, status.attempts, status.deliveries) == ("dead", "outcome_refused", 1, 1)
    assert status.error is not None and status.error.type == "OutcomeRefused"
    assert "this result is refused" in status.error.message


def test_an_outcome_dropped_as_unwritable_still_counts_its_start(app: App, database_url: str) -> None:
    # The database refuses the job's first delivery both as a row and as a dead letter (outcome_refused):
    # the outcome is dropped and the job runs again once its lease expires. Its start was to be counted
    # with that outcome, so it was lost too: the archive said deliveries=1 for a job that ran twice, and
    # the pipeline's duplicate-delivery check (deliveries > attempts) could not see it.
    _refuse_archiving(app, database_url, "CAST(NEW.payload AS text) LIKE '%DROP-ME%' AND NEW.rescues = 0")
    runs: list[str] = []

    @app.task(queue="q", visibility_timeout=1)
    def echo(text: str) -> str:
        runs.append(text)
        return text

    job = echo.delay(text="DROP-ME")
    worker = run(app, rescue_interval=0.1)

    assert worker.exit_code == 0
    assert runs == ["DROP-ME", "DROP-ME"]
    status = job.status()
    assert (status.state, status.rescues, status.attempts, status.deliveries) == ("completed", 1, 1, 2)


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
@pytest.mark.parametrize("kind", ["def", "async def", "async def with a timeout"])
def test_a_handlers_base_exception_is_a_failed_attempt(app: App, exc: BaseException, kind: str) -> None:
    # With a timeout an async handler runs in a task of its own, and asyncio re-raises SystemExit
    # and KeyboardInterrupt from a task out of the event loop: the worker ended (exit code 3), every
    # other running job left to be rescued and run again (found by a hostile sweep).
    if kind == "def":

        @app.task(queue="q", name="hostile", max_attempts=3, backoff=[0.01])
        def hostile() -> None:
            raise exc
    else:

        @app.task(queue="q", name="hostile", max_attempts=3, backoff=[0.01], timeout=20 if "timeout" in kind else None)
        async def hostile() -> None:
            await asyncio.sleep(0)
            raise exc

    @app.task(queue="q")
    def good(i: int) -> int:
        return i

    bad = app.send("hostile", {})
    goods = [good.delay(i=i) for i in range(20)]

    worker = run(app, concurrency=1, prefetch=30)

    assert worker.exit_code == 0
    status = bad.status()
    assert (status.state, status.reason, status.attempts, status.deliveries) == ("dead", "max_attempts_exceeded", 3, 3)
    assert status.error is not None and status.error.type == type(exc).__qualname__
    assert [(g.status().state, g.status().deliveries) for g in goods] == [("completed", 1)] * 20


def test_an_exception_class_with_a_huge_name_is_stored_cut_to_what_a_filter_can_name(app: App) -> None:
    # The type's name was stored whole: 20 MB on PostgreSQL and SQLite, and on MySQL a statement past the
    # server's max_allowed_packet, the job dead as outcome_refused, its error replaced (found by a hostile sweep).
    # Then it was cut at MAX_ERROR_CHARS, past the 200 characters of a filter: a dead letter whose type no
    # `dlq list/replay --error-type` could name. An unnamed class's error did not show at all (its type was "").
    names = {
        "huge": "E" + "\U0001f600" * 5_000_000,
        "long": "L" * (MAX_NAME_CHARS + 1),
        "exact": "X" * MAX_NAME_CHARS,
        "unnamed": "",
    }

    @app.task(queue="q", name="hostile", max_attempts=1)
    def hostile(kind: str) -> None:
        raise type(names[kind], (Exception,), {})("message")

    jobs = {kind: app.send("hostile", {"kind": kind}) for kind in names}
    assert run(app).exit_code == 0
    stored: dict[str, str] = {}
    for kind, job in jobs.items():
        status = job.status()
        assert (status.state, status.reason) == ("dead", "max_attempts_exceeded"), (kind, status.error)
        assert status.error is not None and status.error.message == "message", kind
        stored[kind] = status.error.type
        assert 0 < len(stored[kind]) <= MAX_NAME_CHARS, kind
        # The filter names exactly this dead letter: listed, selected and replayed by its type.
        assert [d.id for d in app.admin.dead_letters(queue="q", error_type=stored[kind])] == [job.id], kind
        assert app.admin.select(queue="q", error_type=stored[kind]) == [job.id], kind
    assert stored["exact"] == names["exact"]
    assert stored["unnamed"] == "(unnamed exception class)"
    said = "... (a name of 5000001 characters)"
    assert stored["huge"] == names["huge"][: MAX_NAME_CHARS - len(said)] + said
    assert stored["long"] == "L" * (MAX_NAME_CHARS - 30) + "... (a name of 201 characters)"
    replayed = app.admin.replay(queue="q", error_type=stored["long"], reason="fixed", actor="test")
    assert [dead for dead, _ in replayed.replayed] == [jobs["long"].id]


def test_a_sync_handler_past_its_timeout_frees_its_slot(app: App) -> None:
    # Before: the hung thread kept the pool's only thread, the next job waited for it for ever and
    # heartbeats kept that job's lease alive: nothing ran again.
    release = threading.Event()

    @app.task(queue="q", timeout=0.3, max_attempts=1)
    def hangs() -> None:
        release.wait(60)

    @app.task(queue="q")
    def good(i: int) -> int:
        return i

    hung = hangs.delay()
    goods = [good.delay(i=i) for i in range(20)]
    began = time.monotonic()
    try:
        worker = run(app, timeout=30, concurrency=2, prefetch=4)
    finally:
        release.set()

    assert time.monotonic() - began < 10
    assert worker.exit_code == 0
    status = hung.status()
    assert (status.state, status.reason) == ("dead", "max_attempts_exceeded")
    assert status.error is not None and status.error.type == "HandlerTimeout"
    assert [g.status().state for g in goods] == ["completed"] * 20


def test_an_async_handler_that_ignores_cancellation_still_frees_its_slot(app: App) -> None:
    @app.task(queue="q", timeout=0.2, max_attempts=1)
    async def stubborn() -> None:
        for _ in range(100):
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                continue  # a handler that swallows its cancellation

    @app.task(queue="q")
    def good(i: int) -> int:
        return i

    bad = stubborn.delay()
    goods = [good.delay(i=i) for i in range(5)]
    worker = run(app, timeout=30, concurrency=1, prefetch=2)

    assert worker.exit_code == 0
    assert bad.status().error is not None and bad.status().error.type == "HandlerTimeout"  # type: ignore[union-attr]
    assert [g.status().state for g in goods] == ["completed"] * 5


def test_as_many_hung_threads_as_slots_stop_the_worker_non_zero(app: App) -> None:
    # A thread cannot be stopped: past this many, only a new process gets them back.
    release = threading.Event()

    @app.task(queue="q", timeout=0.2, max_attempts=5, backoff=[0.01])
    def hangs(ctx: JobContext) -> None:
        release.wait(60)

    jobs = [hangs.delay() for _ in range(2)]
    try:
        worker = run(app, timeout=30, concurrency=2)
    finally:
        release.set()
    assert worker.exit_code == 1
    # The timed-out attempts were recorded before the worker stopped; nothing is left leased.
    assert all(j.status().attempts >= 1 for j in jobs)
    assert {r.state for r in app.backend.jobs_list(JobsListParams())} <= {"pending"}


class _FailingAcquire:
    """Wraps a backend so that its acquires raise a bug-like error after ``after`` calls."""

    def __init__(self, backend: Any, after: int) -> None:
        self._backend = backend
        self._left = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def jobs_acquire(self, params: Any) -> Any:
        if self._left <= 0:
            raise RuntimeError("a bug in the fetch loop")
        self._left -= 1
        return self._backend.jobs_acquire(params)


def test_a_failed_loop_stops_the_worker_non_zero_and_loses_nothing(app: App) -> None:
    @app.task(queue="q")
    def slow(i: int) -> int:
        time.sleep(0.05)
        return i

    jobs = [slow.delay(i=i) for i in range(30)]
    real = app.backend
    app._backend = _FailingAcquire(real, after=1)  # type: ignore[assignment]
    worker = Worker(app, queues=["q"], concurrency=2, prefetch=10, poll_interval=0.02)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    app._backend = real

    assert worker.exit_code == 1
    states = [j.status().state for j in jobs]
    # The first acquire's jobs: those started ran and were flushed, the rest went back to pending.
    assert states.count("completed") >= 1
    assert set(states) <= {"completed", "pending"}
    assert [r.state for r in real.jobs_list(JobsListParams())] == ["pending"] * states.count("pending")
    assert all(j.status().deliveries == (1 if j.status().state == "completed" else 0) for j in jobs)


def test_a_finished_job_keeps_its_lease_while_its_outcome_cannot_be_written(app: App) -> None:
    # The finish failing for longer than the lease while the database is otherwise there (a
    # statement_timeout that only the finish hits, a lock on its rows). Before: the heartbeat stopped
    # extending a job's lease once its outcome was queued, so the lease expired, the job was rescued
    # and ran again though it had completed.
    runs: list[int] = []

    @app.task(queue="q", visibility_timeout=1)
    def t(i: int) -> None:
        runs.append(i)

    job = t.delay(i=1)
    real = app.backend.jobs_finish_many
    failing_until: list[float] = []

    def finish_many(params: Any) -> int:
        if not failing_until:
            failing_until.append(time.monotonic() + 3.5)
        if time.monotonic() < failing_until[0]:
            raise BackendUnavailable("injected: the finish statement timed out")
        return real(params)

    app.backend.jobs_finish_many = finish_many  # type: ignore[method-assign]
    worker = run(app, rescue_interval=0.2)
    assert runs == [1]
    assert app.job(job.id).state == "completed"
    assert worker.counters.rescued == 0 and worker.counters.stale_acks == 0


def test_a_cancelled_batch_split_down_to_one_item_ends_once_its_caller_gives_up() -> None:
    """A graceful stop whose release the database cancels row after row (a lock held elsewhere, a
    statement_timeout shorter than one row): the split ends at one item, raised once the caller gives
    up. Before: one item "split" into none and itself, one level deeper per attempt, until a
    RecursionError after ~1,000 attempts (a stop of ~1,000 statement timeouts instead of 30 s)."""
    from conveyor._errors import StatementCancelled
    from conveyor.backends.sqlite import MemoryBackend
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters

    calls: list[list[int]] = []

    def cancelled(part: list[int]) -> int:
        calls.append(part)
        raise StatementCancelled("canceling statement due to statement timeout")

    backend = MemoryBackend()
    runner = BackendCalls(backend, Counters())
    try:
        with pytest.raises(StatementCancelled):
            asyncio.run(runner.call_batch(cancelled, [1, 2, 3, 4], list, give_up=lambda: True, what="release"))
    finally:
        runner.shutdown()
        backend.close()
    assert calls == [[1, 2, 3, 4], [1, 2], [1]]  # halves, then the first single item, given up: raised


def test_a_cancelled_statement_retried_is_not_logged_as_an_unavailable_database(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator's KILL QUERY / pg_cancel_backend (or a statement timeout) on a worker's acquire: the
    retry's warning said "database unavailable", sending the operator to look for an outage."""
    from conveyor._errors import StatementCancelled
    from conveyor.backends.sqlite import MemoryBackend
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters

    tries: list[int] = []

    def cancelled_once(n: int) -> int:
        tries.append(n)
        if len(tries) == 1:
            raise StatementCancelled("MySQL cancelled acquire: Query execution was interrupted")
        return n

    backend = MemoryBackend()
    runner = BackendCalls(backend, Counters())
    try:
        with caplog.at_level(logging.WARNING, logger="conveyor"):
            assert asyncio.run(runner.call(cancelled_once, 7, what="acquire")) == 7
    finally:
        runner.shutdown()
        backend.close()
    assert tries == [7, 7]
    lines = [r.getMessage() for r in caplog.records if "acquire" in r.getMessage()]
    assert len(lines) == 1 and "database cancelled the statement" in lines[0], lines
    assert "unavailable" not in lines[0]


def test_a_batch_size_that_fit_is_kept_for_the_next_batches_of_its_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every heartbeat sent its whole batch again, had it cancelled, split it and warned again."""
    from conveyor._errors import StatementCancelled
    from conveyor.backends.sqlite import MemoryBackend
    from conveyor.worker import _calls
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters

    calls: list[list[int]] = []

    def at_most_two(part: list[int]) -> list[int]:
        calls.append(part)
        if len(part) > 2:
            raise StatementCancelled("canceling statement due to statement timeout")
        return part

    backend = MemoryBackend()
    runner = BackendCalls(backend, Counters())
    try:
        assert asyncio.run(runner.call_batch(at_most_two, [1, 2, 3, 4, 5], list, what="heartbeat")) == [1, 2, 3, 4, 5]
        assert calls == [[1, 2, 3, 4, 5], [1, 2], [3, 4], [5]]  # halved once, then in parts of that size
        calls.clear()
        assert asyncio.run(runner.call_batch(at_most_two, [1, 2, 3, 4, 5], list, what="heartbeat")) == [1, 2, 3, 4, 5]
        assert calls == [[1, 2], [3, 4], [5]]  # in parts of the size that fit, none cancelled
        calls.clear()
        asyncio.run(runner.call_batch(at_most_two, [1, 2], list, what="release"))  # another kind: its own size
        assert calls == [[1, 2]]
        calls.clear()
        monkeypatch.setattr(_calls, "BATCH_CAP_SECONDS", 0.0)  # kept for a while only: whole again after
        asyncio.run(runner.call_batch(at_most_two, [1, 2, 3, 4, 5], list, what="heartbeat"))
        assert calls[0] == [1, 2, 3, 4, 5]
    finally:
        runner.shutdown()
        backend.close()


def test_a_stale_run_of_a_job_leaves_the_newer_delivery_alone(app: App) -> None:
    """A job whose lease ran out mid-run is rescued and leased again by the same worker while the
    first run goes on. Before: the worker's registry held one entry per job id, so the stale run's
    outcome dropped the newer delivery's entry: its lease was no longer extended (ctx.extend said the
    lease was lost), it ran out, and the job ran again and again (a helper's sweep: 99 of 100 jobs
    ran more than once under a lock wait)."""
    first_done = threading.Event()
    extended: list[bool] = []
    runs: list[object] = []
    lock = threading.Lock()

    @app.task(name="stale.twice", queue="stale", visibility_timeout=1.0)
    def twice(ctx: JobContext) -> None:
        with lock:
            runs.append(ctx.job_id)
            first = len(runs) == 1
        if first:
            time.sleep(2.5)  # past its lease: rescued and leased again meanwhile
            first_done.set()
            return
        assert ctx.extend(30)  # no heartbeat in this test: this run keeps its lease by itself
        assert first_done.wait(10)
        time.sleep(0.3)  # the stale run's outcome is flushed
        extended.append(ctx.extend(30))

    job = twice.delay()
    worker = Worker(
        app,
        burst=True,
        concurrency=2,
        heartbeat_interval=100,
        visibility_timeout=200,  # a default only: the task's lease of 1 s applies
        rescue_interval=0.2,
        poll_interval=0.05,
    )
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    assert extended == [True]
    assert len(runs) == 2 and worker.counters.stale_acks == 1
    assert app.job(job.id).state == "completed"


def test_an_async_handler_behind_a_plain_decorator_is_awaited(app: App) -> None:
    # A decorator that keeps functools.wraps but is itself a plain function: the task was taken for
    # a def handler, run in a thread, and its coroutine (never awaited) completed the job unrun.
    ran: list[int] = []

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    @app.task(queue="q")
    @logged
    async def wrapped(i: int) -> int:
        await asyncio.sleep(0)
        ran.append(i)
        return i

    def bare(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # no functools.wraps: cannot be told apart
            return fn(*args, **kwargs)

        return wrapper

    async def hidden() -> None:
        ran.append(-1)

    app.task(queue="q", name="hidden", max_attempts=1)(bare(hidden))

    jobs = [wrapped.delay(i=i) for i in range(5)]
    unwrapped = app.send("hidden", {})
    worker = run(app)

    assert worker.exit_code == 0
    assert [(j.status().state, j.status().result) for j in jobs] == [("completed", i) for i in range(5)]
    assert sorted(ran) == list(range(5))
    status = unwrapped.status()
    assert (status.state, status.reason) == ("dead", "permanent_error")  # a TypeError: failed, not completed unrun
    assert status.error is not None and "never awaited" in status.error.message


@pytest.mark.parametrize("kind", ["subclass without __init__", "delay set after", "manual nack delay"])
def test_a_retry_with_an_odd_delay_is_a_failed_attempt(app: App, kind: str) -> None:
    # Before: "internal error processing job", the job dropped until its lease ran out, then run
    # again at every lease's end with no attempt or error recorded, until max_deliveries.
    class MyRetry(Retry):
        def __init__(self, message: str) -> None:
            Exception.__init__(self, message)

    @app.task(queue="q", max_attempts=2, ack_policy="manual" if kind == "manual nack delay" else "auto")
    def odd(ctx: JobContext) -> None:
        if kind == "subclass without __init__":
            raise MyRetry("x")
        if kind == "delay set after":
            retry = Retry()
            retry.delay = "soon"  # type: ignore[assignment]
            raise retry
        ctx.nack()
        ctx.retry_delay = float("nan")

    job = odd.delay()
    first = time.monotonic()
    worker = run(app, visibility_timeout=30)
    status = job.status()
    assert worker.exit_code == 0
    # The task's backoff, then dead after its 2 attempts, never waiting for a lease to run out.
    assert (status.state, status.reason, status.attempts) == ("dead", "max_attempts_exceeded", 2)
    assert time.monotonic() - first < 25


def test_a_retry_delay_set_out_of_range_is_bounded() -> None:
    from conveyor._limits import MAX_SECONDS
    from conveyor._outcomes import _delay

    assert [_delay(v) for v in (1e300, 10**400, -5, 2.5, float("inf"))] == [
        MAX_SECONDS,
        MAX_SECONDS,
        0.0,
        2.5,
        MAX_SECONDS,
    ]
    assert [_delay(v) for v in (None, float("nan"), "1", True, object())] == [None] * 5


@pytest.mark.parametrize("reason", [b"bytes", object(), "\x00 and \ud800"])
def test_a_manual_reason_of_any_kind_dead_letters_only_its_job(app: App, reason: object) -> None:
    # Before, on SQLite, a reason JSON could not hold (bytes, an object) ended the worker's completer
    # and the worker, with the outcomes of its batch: 20 good jobs left processing.
    @app.task(queue="q", ack_policy="manual")
    def rejecting(ctx: JobContext) -> None:
        ctx.reject(reason)  # type: ignore[arg-type]

    @app.task(queue="q", ack_policy="manual")
    def good(i: int, ctx: JobContext) -> None:
        ctx.ack(i)

    bad = rejecting.delay()
    goods = [good.delay(i=i) for i in range(20)]
    worker = run(app)

    assert worker.exit_code == 0
    assert [(g.status().state, g.status().result) for g in goods] == [("completed", i) for i in range(20)]
    status = bad.status()
    assert (status.state, status.reason) == ("dead", "rejected")
    assert status.error is not None and status.error.message


def test_a_handler_that_closes_the_app_stops_its_worker_and_loses_nothing(database_url: str) -> None:
    # Before, on PostgreSQL, the worker retried "pool already closed" as an unavailable database for
    # ever (a --burst worker never exited); SQLite already stopped. Now both stop non-zero, and the
    # jobs they held come back to other workers once their leases run out.
    app = App(database_url, migrate=True)

    @app.task(queue="q")
    def closing() -> None:
        app.backend.close()

    @app.task(queue="q")
    def good(i: int) -> int:
        return i

    ids = [good.delay(i=i).id for i in range(10)] + [closing.delay().id] + [good.delay(i=i).id for i in range(10)]
    worker = run(app, timeout=60, concurrency=1, visibility_timeout=1)
    assert worker.exit_code != 0
    later = App(database_url)
    try:
        states = [later.job(i).state for i in ids]
        assert all(s in ("completed", "pending", "processing") for s in states), states  # none lost
    finally:
        later.close()


async def _cancels_itself(how: str) -> None:
    """What an async handler does to its own task (see the test below)."""
    me = asyncio.current_task()
    assert me is not None
    if how == "cancel, await":
        me.cancel()
        await asyncio.sleep(1)
    elif how == "cancel twice, await":
        me.cancel()
        me.cancel()
        await asyncio.sleep(1)
    elif how == "cancel in a try/finally that awaits":
        try:
            me.cancel()
            await asyncio.sleep(1)
        finally:
            await asyncio.sleep(0.01)
    elif how == "cancel, return":
        me.cancel()  # taken at the task's next await, after the handler: the slot's, before
    elif how == "raise CancelledError":
        await asyncio.sleep(0)
        raise asyncio.CancelledError
    elif how == "loop.stop()":
        asyncio.get_running_loop().stop()
    elif how == "loop.stop(), error swallowed":
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().stop()
    elif how == "loop.stop() from a callback":
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.stop)
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("timeout", [None, 20])
@pytest.mark.parametrize(
    "how",
    [
        "cancel, await",
        "cancel twice, await",
        "cancel in a try/finally that awaits",
        "cancel, return",
        "raise CancelledError",
        "loop.stop()",
        "loop.stop(), error swallowed",
        "loop.stop() from a callback",
    ],
)
def test_an_async_handler_that_cancels_its_task_or_stops_the_loop_fails_only_its_attempt(
    app: App, how: str, timeout: float | None
) -> None:
    # Before, without a timeout, a handler cancelling its own task cancelled its slot: the executor
    # ended cancelled and the worker with it (asyncio.run raised CancelledError); loop.stop(), with or
    # without a timeout, ended asyncio.run ("Event loop stopped before Future completed") with every
    # task cancelled. Either way the other running and prefetched jobs waited for their leases.
    @app.task(queue="q", name="hostile", max_attempts=3, backoff=[0.01], timeout=timeout)
    async def hostile() -> None:
        await _cancels_itself(how)

    @app.task(queue="q")
    async def good(i: int) -> int:
        await asyncio.sleep(0.01)
        return i

    bad = app.send("hostile", {})
    goods = [good.delay(i=i) for i in range(20)]

    worker = run(app, timeout=30, concurrency=2, prefetch=30)

    assert worker.exit_code == 0
    assert [(g.status().state, g.status().result, g.status().deliveries) for g in goods] == [
        ("completed", i, 1) for i in range(20)
    ]
    status = bad.status()
    assert (status.state, status.reason, status.attempts, status.deliveries) == ("dead", "max_attempts_exceeded", 3, 3)
    assert status.error is not None
    if how.startswith("loop.stop()"):
        assert (status.error.type, status.error.message) == (
            "RuntimeError",
            "the handler stopped the event loop (loop.stop()) that the worker runs on: refused",
        )
    elif how == "raise CancelledError":
        assert status.error.type == "CancelledError"
    else:
        assert (status.error.type, status.error.message) == ("CancelledError", "the handler cancelled its own task")


def test_an_async_handler_that_takes_its_own_cancellation_completes_and_its_slot_stays_sound(app: App) -> None:
    # The cancellation it requested is taken back (Task.uncancel) once it returns: an asyncio.timeout
    # in the next handler of the same slot still turns its cancellation into a TimeoutError.
    @app.task(queue="q")
    async def takes_it() -> str:
        me = asyncio.current_task()
        assert me is not None
        me.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1)
        return "went on"

    @app.task(queue="q")
    async def times_out(i: int) -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)
        except TimeoutError:
            return f"timed out {i}"
        return "not timed out"

    first = takes_it.delay()
    nexts = [times_out.delay(i=i) for i in range(3)]
    worker = run(app, timeout=30, concurrency=1)

    assert worker.exit_code == 0
    assert (first.status().state, first.status().result) == ("completed", "went on")
    assert [n.status().result for n in nexts] == [f"timed out {i}" for i in range(3)]


def test_a_late_cancellation_of_a_slot_by_a_handler_does_not_end_the_worker(app: App) -> None:
    # The handler returns; its slot is cancelled later (a callback it scheduled), while the slot waits
    # for work or runs the next job. Before: that ended the slot, then the worker.
    @app.task(queue="q")
    async def late() -> None:
        me = asyncio.current_task()
        assert me is not None
        asyncio.get_running_loop().call_later(0.05, me.cancel)

    @app.task(queue="q", max_attempts=5, backoff=[0.01])
    async def good(i: int) -> int:
        await asyncio.sleep(0.02)
        return i

    bad = late.delay()
    goods = [good.delay(i=i) for i in range(20)]
    worker = run(app, timeout=30, concurrency=1)

    assert worker.exit_code == 0
    assert bad.status().state == "completed"
    # The job the slot ran when the cancellation came (if any) failed that attempt and ran again.
    assert [(g.status().state, g.status().result) for g in goods] == [("completed", i) for i in range(20)]
    assert sum(g.status().deliveries for g in goods) <= 21


def test_a_worker_cancelled_past_its_graceful_timeout_still_cancels_a_running_handler(app: App) -> None:
    # The worker's own cancellation is never taken for a handler's: the handler is cancelled, the
    # worker ends, and the job (not finished) is left to its lease.
    started = threading.Event()
    cancelled: list[bool] = []

    @app.task(queue="q")
    async def long() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    job = long.delay()
    worker = Worker(app, concurrency=1, poll_interval=0.02, graceful_timeout=0.2)

    async def main() -> None:
        running = asyncio.create_task(worker.run())
        while not started.is_set():
            await asyncio.sleep(0.01)
        worker.stop()
        await asyncio.wait_for(running, timeout=20)

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 15
    assert cancelled == [True]
    assert job.status().state == "processing"  # not finished: its lease runs out, rescue returns it


def test_a_ctrl_c_that_lands_in_an_async_handler_still_interrupts_run_sync(app: App) -> None:
    # Without the worker's signal handlers (run_sync(install_signals=False)) Ctrl-C is asyncio.Runner's:
    # it cancels the run's task from the signal handler, in the context of the code the signal
    # interrupted. In a handler's, the worker's tasks took that cancel for the handler's and refused it:
    # the worker ran on (here, to the end of its burst) and the job failed as if it had cancelled them.
    @app.task(queue="q")
    async def interrupted() -> str:
        os.kill(os.getpid(), signal.SIGINT)  # taken in this handler, as a Ctrl-C during a busy one
        time.sleep(0.2)
        await asyncio.sleep(0)
        return "done"

    job = interrupted.delay()
    worker = Worker(app, concurrency=1, poll_interval=0.02, burst=True)
    # Python's own SIGINT handler, as in a fresh process (an earlier test of the suite's may leave another
    # one; neither asyncio.Runner nor the worker takes Ctrl-C over from a handler that is not the default).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.run_sync(install_signals=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert job.status().state == "processing"  # cut short, as a Ctrl-C does: its lease runs out


def _slow_task(app: App, queue: str, timeout: float | None, shared: dict[str, asyncio.Task[Any]]) -> None:
    """Register task "slow": it notes the task it runs in as ``shared["slow"]``, sleeps 0.5 s, returns "slept"."""

    @app.task(queue=queue, name="slow", timeout=timeout)
    async def slow() -> str:
        task = asyncio.current_task()
        assert task is not None
        shared["slow"] = task
        await asyncio.sleep(0.5)
        return "slept"


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_a_handler_may_cancel_a_task_another_handler_started_but_not_the_task_another_handler_runs_in(
    app: App, timeout: float | None
) -> None:
    # A library's shared background task (started lazily in whichever handler used it first) may be
    # cancelled from another handler; the task another handler runs in (its slot, or its timeout's
    # task) may not: that cancel is refused and fails the canceller's attempt only.
    shared: dict[str, asyncio.Task[Any]] = {}

    async def until(name: str) -> asyncio.Task[Any]:
        while name not in shared:
            await asyncio.sleep(0.005)
        return shared[name]

    @app.task(queue="q", name="starts")
    async def starts() -> str:
        shared["background"] = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        return "started"

    @app.task(queue="q", name="stops")
    async def stops() -> bool:
        background = await until("background")
        accepted = background.cancel()
        await asyncio.sleep(0.01)
        return accepted and background.cancelled()

    _slow_task(app, "q", timeout, shared)

    @app.task(queue="q", name="cuts", max_attempts=1)
    async def cuts() -> bool:
        return (await until("slow")).cancel()

    jobs = [app.send(name, {}) for name in ("starts", "slow", "stops", "cuts")]

    worker = run(app, timeout=30, concurrency=4)

    assert worker.exit_code == 0
    assert [(j.status().state, j.status().result) for j in jobs[:3]] == [
        ("completed", "started"),
        ("completed", "slept"),
        ("completed", True),
    ]
    status = jobs[3].status()
    assert status.state == "dead"
    assert status.error is not None
    assert (status.error.type, status.error.message) == (
        "RuntimeError",
        "the handler cancelled tasks of the worker's own (its loops, the other handlers): refused",
    )


def test_two_workers_on_one_loop_keep_the_guards_until_the_last_one_ends(app: App) -> None:
    # The first worker to end took the task factory off the loop: the other's tasks created after that
    # (here the task its handler with a timeout runs in) were plain tasks, and another handler's cancel
    # of them went through: the slow job failed, cancelled, though it was not the canceller's.
    shared: dict[str, asyncio.Task[Any]] = {}

    @app.task(queue="first")
    async def quick() -> str:
        return "quick"

    _slow_task(app, "second", 10, shared)

    @app.task(queue="second", name="cuts", max_attempts=1)
    async def cuts() -> bool:
        while "slow" not in shared:
            await asyncio.sleep(0.005)
        return shared["slow"].cancel()

    quick.delay()
    first = Worker(app, ["first"], burst=True, poll_interval=0.02)
    second = Worker(app, ["second"], concurrency=2, poll_interval=0.02)

    async def main() -> list[Any]:
        first_run = asyncio.create_task(first.run())
        await asyncio.sleep(0)  # the first worker guards the loop; the second joins it
        second_run = asyncio.create_task(second.run())
        await asyncio.wait_for(first_run, timeout=30)
        jobs = [app.send("slow", {}), app.send("cuts", {})]
        for _ in range(1000):
            if all(j.status().state in ("completed", "dead") for j in jobs):
                break
            await asyncio.sleep(0.02)
        second.stop()
        await asyncio.wait_for(second_run, timeout=30)
        return jobs

    slow_job, cuts_job = asyncio.run(main())

    assert (first.exit_code, second.exit_code) == (0, 0)
    done = slow_job.status()
    assert (done.state, done.result, done.deliveries) == ("completed", "slept", 1)
    status = cuts_job.status()
    assert status.state == "dead" and status.error is not None
    assert status.error.message == (
        "the handler cancelled tasks of the worker's own (its loops, the other handlers): refused"
    )


def _sum_in_a_new_loop(results: Any) -> None:
    async def go() -> int:
        loop = asyncio.get_running_loop()
        total = await loop.run_in_executor(None, sum, [1, 2, 3])  # its callback comes from a thread
        await loop.getaddrinfo("localhost", 80)
        return int(total)

    results.put(asyncio.run(go()))


def test_well_behaved_handlers_are_not_refused_by_the_guards(app: App) -> None:
    # A task created from a thread of the handler's own (run_coroutine_threadsafe: the sync/async bridge)
    # is not the worker's: the handler may cancel it (the first cut of the guard refused it and failed
    # the job). A multiprocessing child forked from a handler may run an event loop of its own: only the
    # loop it inherited is policed (the first cut ended the child at its executor's first callback).
    import multiprocessing

    @app.task(queue="q", name="bridge", max_attempts=1)
    async def bridge() -> str:
        loop = asyncio.get_running_loop()
        box: dict[str, Any] = {}

        def start() -> None:
            box["future"] = asyncio.run_coroutine_threadsafe(asyncio.sleep(5), loop)

        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.wrap_future(box["future"]), 0.05)
        return "timed out"

    @app.task(queue="q", name="spawns", max_attempts=1)
    async def spawns() -> list[int | None]:
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        child = context.Process(target=_sum_in_a_new_loop, args=(results,))
        child.start()
        got = await asyncio.get_running_loop().run_in_executor(None, results.get, True, 20)
        await asyncio.get_running_loop().run_in_executor(None, child.join, 20)
        return [got, child.exitcode]

    jobs = [app.send("bridge", {}), app.send("spawns", {})]

    worker = run(app, timeout=60, concurrency=2)

    assert worker.exit_code == 0
    assert [(j.status().state, j.status().result) for j in jobs] == [("completed", "timed out"), ("completed", [6, 0])]


@contextlib.contextmanager
def another_workers_rescue(app: App, blocked: threading.Event, after: float) -> Iterator[list[int]]:
    """What another worker's rescue loop does meanwhile: once, ``after`` seconds from ``blocked``; yields
    the list the number of jobs it rescued goes into."""
    rescued: list[int] = []

    def rescue() -> None:
        if blocked.wait(30):
            time.sleep(after)
            rescued.append(app.backend.jobs_rescue_expired(JobsRescueParams(app.clock())))

    rescuer = threading.Thread(target=rescue)
    rescuer.start()
    try:
        yield rescued
    finally:
        blocked.set()
        rescuer.join()


def test_an_async_handler_that_blocks_the_event_loop_costs_the_other_jobs_nothing(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    # A blocking call in an async def held the loop, and with it the heartbeat: past a lease, every other
    # job the worker held (running beside it, finished with the outcome unwritten, buffered) was rescued
    # and ran again. The stall watch keeps their leases from a thread; the blocker's own runs out as before.
    runs: list[str] = []
    blocked = threading.Event()

    @app.task(queue="q", visibility_timeout=2.0, max_attempts=1)
    async def blocks(ctx: JobContext) -> None:
        runs.append("blocks")
        if not blocked.is_set():
            blocked.set()
            time.sleep(5)  # the mistake: a blocking call on the event loop, past its lease

    @app.task(queue="q", visibility_timeout=2.0, max_attempts=1)
    async def waits(i: int) -> int:
        runs.append(f"waits-{i}")
        await asyncio.sleep(1.5)
        return i

    @app.task(queue="q", visibility_timeout=2.0, max_attempts=1)
    def sleeps(i: int) -> int:
        runs.append(f"sleeps-{i}")
        time.sleep(1.5)
        return i

    blocker = blocks.delay()
    others = [waits.delay(i=i) for i in range(3)] + [sleeps.delay(i=i) for i in range(3)]
    others += [waits.delay(i=i) for i in range(3, 8)]  # buffered behind the seven running
    caplog.set_level(logging.WARNING, logger="conveyor.worker")
    # 4 s in, the blocker's lease (2 s) has run out, and so had every lease not kept.
    with another_workers_rescue(app, blocked, after=4) as rescued:
        worker = run(app, timeout=60, concurrency=7, prefetch=16)

    assert worker.exit_code == 0
    assert rescued == [1], "jobs beside the blocking handler lost their leases"
    assert [o.status().state for o in others] == ["completed"] * len(others)
    assert sorted(r for r in runs if r != "blocks") == sorted(
        [f"waits-{i}" for i in range(8)] + [f"sleeps-{i}" for i in range(3)]
    ), "a job beside the blocking handler ran twice"
    # The blocker's lease was not kept for it: rescued, it ran again (its first outcome came too late).
    assert runs.count("blocks") == 2 and blocker.status().state == "completed"
    said = [r.getMessage() for r in caplog.records if "event loop has been blocked" in r.getMessage()]
    assert len(said) == 1 and str(blocker.id) in said[0] and "test_hostile_handlers.py" in said[0], said


def test_a_worker_whose_loop_stays_blocked_lets_its_leases_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A loop blocked for good (a deadlock, a sleep for ever) must not hold the other jobs for good: past
    # twice the longest lease (at least KEEP_AT_LEAST, a minute; 0 here) the watch lets the leases run out.
    monkeypatch.setattr(StallWatch, "KEEP_AT_LEAST", 0.0)
    with contextlib.closing(App(f"sqlite:///{tmp_path}/conveyor.db", migrate=True)) as app:
        blocked_for_good(app, caplog)


def blocked_for_good(app: App, caplog: pytest.LogCaptureFixture) -> None:
    blocked = threading.Event()

    @app.task(queue="q", visibility_timeout=1.0, max_attempts=1)
    async def blocks() -> None:
        if not blocked.is_set():
            blocked.set()
            time.sleep(6)

    @app.task(queue="q", visibility_timeout=1.0, max_attempts=1)
    def sleeps(i: int) -> int:
        time.sleep(0.5)
        return i

    blocks.delay()
    others = [sleeps.delay(i=i) for i in range(4)]
    caplog.set_level(logging.WARNING, logger="conveyor.worker")
    with another_workers_rescue(app, blocked, after=5) as rescued:  # past the 2 s leases of 1 s are kept for
        worker = run(app, timeout=60, concurrency=5, prefetch=5)

    assert worker.exit_code == 0
    assert rescued == [5]  # the blocker and the four finished jobs whose outcomes the blocked loop held
    assert [o.status().state for o in others] == ["completed"] * 4  # ran again, as before the watch
    assert any("no longer keeps the leases of the 5 job(s)" in r.getMessage() for r in caplog.records)


def test_short_leases_are_kept_from_a_short_block_and_an_idle_loop_is_not_taken_for_blocked(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # With leases under 0.75 s a stall is a heartbeat's interval (0.2 s), shorter than the loop's tick
    # (0.25 s): an idle loop was taken for blocked from the start, with no one to blame, so the handler that
    # blocked it later was not named and its lease was kept with the others.
    blocked = threading.Event()
    with contextlib.closing(App(sqlite_url, migrate=True)) as app:

        @app.task(queue="q", visibility_timeout=0.6, max_attempts=1)
        async def blocks() -> None:
            await asyncio.sleep(0.8)  # the loop idles first: no stall yet
            if not blocked.is_set():
                blocked.set()
                time.sleep(1.5)

        @app.task(queue="q", visibility_timeout=0.6, max_attempts=1)
        async def waits(i: int) -> int:
            await asyncio.sleep(2.5)
            return i

        blocker = blocks.delay()
        others = [waits.delay(i=i) for i in range(3)]
        caplog.set_level(logging.WARNING, logger="conveyor.worker")
        with another_workers_rescue(app, blocked, after=1.2) as rescued:
            worker = run(app, timeout=60, concurrency=4)

        assert worker.exit_code == 0
        assert rescued == [1], "only the blocker's lease runs out"
        assert [o.status().state for o in others] == ["completed"] * 3
        said = [r.getMessage() for r in caplog.records if "event loop has been blocked" in r.getMessage()]
        assert len(said) == 1 and str(blocker.id) in said[0], said


def test_of_two_workers_on_one_loop_only_the_blockers_own_names_it(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Each worker watches the loop they share. A task the blocking handler started was traced to its run by
    # both, whatever the worker: the other one said it kept "its other jobs' leases, not this one's" of a job
    # it never held. It now says the loop is blocked, by no handler of its own, and keeps all of its leases.
    with contextlib.closing(App(sqlite_url, migrate=True)) as app:

        async def blocking() -> None:
            time.sleep(1.5)

        @app.task(queue="b", max_attempts=1)
        async def blocks() -> None:
            await asyncio.sleep(0.3)
            await asyncio.create_task(blocking())  # the task it started blocks

        @app.task(queue="a", max_attempts=1)
        async def waits() -> None:
            await asyncio.sleep(1)

        blocker = blocks.delay()
        innocent = waits.delay()
        caplog.set_level(logging.WARNING, logger="conveyor.worker")
        first = Worker(app, ["a"], burst=True, poll_interval=0.02)
        second = Worker(app, ["b"], burst=True, poll_interval=0.02)

        async def main() -> None:
            await asyncio.wait_for(asyncio.gather(first.run(), second.run()), timeout=30)

        asyncio.run(main())

        assert innocent.status().state == "completed" and blocker.status().state == "completed"
        said = [r.getMessage() for r in caplog.records if "event loop has been blocked" in r.getMessage()]
        assert len(said) == 2 and sum(str(blocker.id) in s for s in said) == 1, said
        assert all("in blocking" in s for s in said), said
