"""The worker runtime against real backends: outcomes, policies, fencing, shutdown, burst."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from tests.conftest import jobs_vacuums, terminate_other_sessions

from conveyor import App, JobContext, Message, Reject, Retry, Worker
from conveyor.backends.base import (
    JobsAcquireParams,
    JobsListParams,
    JobsRescueParams,
    JobsStartParams,
    LeaseRef,
    LeasesExtendParams,
)

T = TypeVar("T")


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def drain(app: App, **kwargs: Any) -> Worker:
    """Run a burst worker until its queues are empty."""
    worker = Worker(app, burst=True, poll_interval=0.02, **kwargs)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    return worker


def test_success_keeps_result(app: App) -> None:
    @app.task(queue="q")
    def add(a: int, b: int) -> int:
        return a + b

    job = add.delay(a=2, b=3)
    worker = drain(app)
    status = job.status()
    assert (status.state, status.result, status.attempts, status.deliveries) == ("completed", 5, 1, 1)
    assert worker.counters.completed == 1


def test_transient_error_retries_then_dead_letters(app: App) -> None:
    calls: list[int] = []

    @app.task(queue="q", max_attempts=3, backoff=[0.01])
    def flaky(ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        raise ConnectionError("down")

    job = flaky.delay()
    drain(app)
    status = job.status()
    assert calls == [1, 2, 3]
    assert status.state == "dead"
    assert status.reason == "max_attempts_exceeded"
    assert status.attempts == 3
    assert status.error is not None and status.error.type == "ConnectionError"
    assert "ConnectionError: down" in status.error.traceback


def test_transient_error_then_success(app: App) -> None:
    @app.task(queue="q", max_attempts=5, backoff=[0.01])
    def once_flaky(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise TimeoutError("first time")
        return "ok"

    job = once_flaky.delay()
    drain(app)
    status = job.status()
    assert (status.state, status.attempts, status.result) == ("completed", 2, "ok")


@pytest.mark.parametrize("exc", [ValueError("bad"), KeyError("k"), TypeError("t"), Reject("no")])
def test_permanent_errors_dead_letter_at_once(app: App, exc: Exception) -> None:
    @app.task(queue="q", max_attempts=5, backoff=[0.01])
    def broken() -> None:
        raise exc

    job = broken.delay()
    drain(app)
    status = job.status()
    assert status.state == "dead"
    assert status.attempts == 1
    assert status.reason == ("rejected" if isinstance(exc, Reject) else "permanent_error")


def test_custom_dead_on(app: App) -> None:
    class PaymentDeclined(Exception):
        pass

    @app.task(queue="q", dead_on=[PaymentDeclined], backoff=[0.01])
    def charge() -> None:
        raise PaymentDeclined("card declined")

    job = charge.delay()
    drain(app)
    assert job.status().reason == "permanent_error"


def test_retry_with_explicit_delay(app: App) -> None:
    seen: list[float] = []

    @app.task(queue="q", max_attempts=3)
    def later(ctx: JobContext) -> None:
        seen.append(time.monotonic())
        if ctx.attempt == 1:
            raise Retry(delay=0.3)

    job = later.delay()
    drain(app)
    assert job.status().state == "completed"
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.3


def test_unknown_task_dead_letters_without_running(app: App) -> None:
    job = app.send("no.such.task", {"x": 1}, queue="q")
    drain(app, queues=["q"])
    status = job.status()
    assert (status.state, status.reason, status.attempts) == ("dead", "unknown_task", 0)


def test_newer_schema_version_dead_letters(app: App) -> None:
    @app.task(queue="q", version=1)
    def v1() -> None:
        pass

    job = v1.send({}, headers={"schema_version": 2})
    drain(app)
    assert job.status().reason == "unsupported_version"


@pytest.mark.parametrize(
    ("headers", "version"),
    [
        ("{}", 1),
        ('{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', 1),
        ('{"schema_version":3}', 3),
        # As the producer encodes them and as PostgreSQL's jsonb gives them back: the first version.
        ('{"schema_version":1,"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', 1),
        ('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "schema_version": 1}', 1),
        ('{"schema_version": 1 }', 1),
        ('{"schema_version": 10}', 10),
        ('{"schema_version": 1.5}', None),
        ('{"schema_version": 1e0}', None),
        ('{"schema_version": 1, "schema_version": 2}', 2),
        ('{"x": {"schema_version": 1}, "schema_version": 4}', 4),
        ('{"x": {"schema_version": 7}}', 1),
        ('{"note": "\\"schema_version\\": 1,", "schema_version": 5}', 5),
        ('{"note":"schema_version"}', 1),
        ('{"schema\\u005fversion":3}', 3),  # an escaped key is still the key
        ('{"schema_version":"3"}', None),
        ("[]", None),
        ("{", None),
        ("not json", None),
        # The producer refuses these; raw SQL stores them.
        ('{"schema_version": 0}', None),
        ('{"schema_version": -2}', None),
        ('{"schema_version": true}', None),
    ],
)
def test_a_jobs_schema_version_is_read_from_its_headers(headers: str, version: int | None) -> None:
    # Most jobs are of the first version; their headers are not decoded for it, and no header text
    # may pass for a first version when it names another or is not a JSON object. None: there is no
    # version a handler could take, and the answer says why.
    from conveyor._outcomes import _schema_version

    found = _schema_version(headers)
    if version is None:
        assert isinstance(found, str) and found.startswith("the job's "), found
    else:
        assert found == version


def test_a_first_version_job_as_producers_write_it_is_read_without_decoding_its_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fast path must fire for the headers real jobs carry (every producer names the version):
    # it once only did for headers without the key, which no producer writes.
    from conveyor import _outcomes
    from conveyor._message import encode_headers

    def refuse(text: str) -> Any:
        raise AssertionError(f"decoded {text!r}")

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    produced = encode_headers({"tenant": "acme"}, uuid.uuid4(), traceparent=traceparent)
    stored = json.dumps(json.loads(produced))  # jsonb's text: a space after each colon and comma
    assert json.loads(stored)["schema_version"] == 1
    monkeypatch.setattr("conveyor._outcomes.json.loads", refuse)
    assert _outcomes._schema_version(produced) == _outcomes._schema_version(stored) == 1


def test_async_handler_runs_on_the_loop(app: App) -> None:
    @app.task(queue="q")
    async def fetch(n: int) -> int:
        await asyncio.sleep(0.01)
        return n * 10

    jobs = app.send_many([Message(fetch.name, {"n": i}) for i in range(20)])
    drain(app, concurrency=20)
    assert sorted(j.status().result for j in jobs) == [i * 10 for i in range(20)]


def test_timeout_is_a_transient_failure(app: App) -> None:
    @app.task(queue="q", timeout=0.05, max_attempts=2, backoff=[0.01])
    async def slow() -> None:
        await asyncio.sleep(5)

    job = slow.delay()
    drain(app)
    status = job.status()
    assert (status.state, status.reason, status.attempts) == ("dead", "max_attempts_exceeded", 2)
    assert status.error is not None and status.error.type == "HandlerTimeout"


def test_manual_ack_policy(app: App) -> None:
    @app.task(queue="q", ack_policy="manual", max_attempts=3, backoff=[0.01])
    def manual(ctx: JobContext, action: str) -> None:
        if action == "ack":
            ctx.ack({"done": True})
        elif action == "reject":
            ctx.reject("not for us")
        elif action == "nack" and ctx.attempt == 1:
            ctx.nack(delay=0.01)
        elif action == "nack":
            ctx.ack("second time")

    acked = manual.delay(action="ack")
    rejected = manual.delay(action="reject")
    nacked = manual.delay(action="nack")
    drain(app)
    assert acked.status().result == {"done": True}
    assert rejected.status().reason == "rejected"
    assert (nacked.status().state, nacked.status().attempts) == ("completed", 2)


def test_expired_job_is_not_run(app: App) -> None:
    ran: list[int] = []

    @app.task(queue="q")
    def work() -> None:
        ran.append(1)

    job = work.send({}, ttl=0.05)
    time.sleep(0.1)
    drain(app)
    assert job.status().state == "expired"
    assert ran == []


def test_poison_job_dead_lettered_before_running(app: App) -> None:
    """A job delivered more than its limit (its workers died) is not run again."""
    ran: list[int] = []

    @app.task(queue="q", max_deliveries=2)
    def poison() -> None:
        ran.append(1)

    job = poison.delay()
    backend = app.backend
    now = datetime.now(UTC)
    for i in range(2):
        # Simulate a worker that started the job (counting the start) and died: the lease expires.
        got = backend.jobs_acquire(JobsAcquireParams("q", 1, 1.0, "dead-worker", now + timedelta(seconds=10 * i)))
        assert len(got) == 1
        backend.jobs_start_many(JobsStartParams([LeaseRef(got[0].id, got[0].receipt)], now))
        backend.jobs_rescue_expired(JobsRescueParams(now + timedelta(seconds=10 * i + 5)))
    drain(app)
    status = job.status()
    assert (status.state, status.reason, status.deliveries, status.rescues, status.attempts) == (
        "dead",
        "max_deliveries_exceeded",
        2,
        2,
        0,
    )
    assert ran == []


def test_stale_ack_is_fenced_and_counted(app: App) -> None:
    """A handler that outlives its lease cannot overwrite the newer delivery's outcome."""
    release = threading.Event()
    started = threading.Event()

    @app.task(queue="q", visibility_timeout=0.5)
    def slow(ctx: JobContext) -> str:
        started.set()
        release.wait(10)
        return f"delivery {ctx.deliveries}"

    @app.task(queue="f")  # another queue: the lease taken at acquire is the longest of the queue's tasks
    def filler() -> None:
        pass

    job = slow.delay()
    # One slot and a buffer of one: once the filler waits in the buffer, this worker fetches nothing
    # more, so the rescued job can only go to "someone else" (with room, its own listener would
    # take the job back the moment rescue returns it).
    worker = Worker(
        app,
        ["q", "f"],
        concurrency=1,
        prefetch=1,
        poll_interval=0.02,
        # No heartbeat during the test (the tasks' own leases apply: the worker's is only a default).
        heartbeat_interval=3600,
        visibility_timeout=7200,
        rescue_interval=3600,
    )

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await asyncio.to_thread(started.wait, 10)
        await asyncio.to_thread(filler.delay)
        for _ in range(200):
            if worker.counters.acquired == 2:
                break
            await asyncio.sleep(0.02)
        assert worker.counters.acquired == 2
        # The lease runs out; rescue hands the job to "someone else", who completes it.
        await asyncio.sleep(0.6)
        backend = app.backend
        assert backend.jobs_rescue_expired(JobsRescueParams(datetime.now(UTC))) == 1
        other = backend.jobs_acquire(JobsAcquireParams("q", 1, 30, "other", datetime.now(UTC)))
        assert len(other) == 1
        from conveyor.backends.base import Finish, JobsFinishParams

        finish = Finish(other[0].id, other[0].receipt, "completed", result='"other"')
        assert backend.jobs_finish_many(JobsFinishParams([finish], datetime.now(UTC))) == 1
        release.set()
        for _ in range(200):
            if worker.counters.stale_acks:
                break
            await asyncio.sleep(0.02)
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert worker.counters.stale_acks == 1
    assert job.status().result == "other"


def test_heartbeat_keeps_long_jobs_leased(app: App) -> None:
    @app.task(queue="q", visibility_timeout=0.6)
    def long() -> str:
        time.sleep(1.5)
        return "done"

    job = long.delay()
    worker = drain(app, heartbeat_interval=0.1, rescue_interval=0.1)
    status = job.status()
    assert (status.state, status.deliveries) == ("completed", 1)
    assert worker.counters.stale_acks == 0 and worker.counters.rescued == 0


def test_ctx_extend(app: App) -> None:
    @app.task(queue="q", visibility_timeout=0.5)
    def extends(ctx: JobContext) -> bool:
        ok = ctx.extend(30)
        time.sleep(0.8)
        return ok

    job = extends.delay()
    drain(app, heartbeat_interval=3600, visibility_timeout=7200, rescue_interval=0.1)
    status = job.status()
    assert (status.state, status.result, status.deliveries) == ("completed", True, 1)


def test_graceful_stop_releases_buffered_jobs(app: App) -> None:
    started = threading.Event()
    release = threading.Event()

    @app.task(queue="q")
    def block() -> None:
        started.set()
        release.wait(10)

    jobs = app.send_many([Message(block.name) for _ in range(10)])
    worker = Worker(app, concurrency=1, prefetch=10, poll_interval=0.02)

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await asyncio.to_thread(started.wait, 10)
        worker.stop()
        await asyncio.sleep(0.3)
        release.set()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 30))
    states = [j.status() for j in jobs]
    assert sum(s.state == "completed" for s in states) == 1
    pending = [s for s in states if s.state == "pending"]
    assert len(pending) == 9
    assert all((s.deliveries == 0 and s.started_at is None) or s.deliveries == 0 for s in pending)
    assert worker.counters.released == 9


def test_lanes_strict_order(app: App) -> None:
    order: list[str] = []

    @app.task(queue="critical")
    def urgent() -> None:
        order.append("critical")

    @app.task(queue="default")
    def normal() -> None:
        order.append("default")

    app.send_many([Message(normal.name) for _ in range(5)] + [Message(urgent.name) for _ in range(5)])
    drain(app, queues=["critical", "default"], concurrency=1, prefetch=1)
    assert order == ["critical"] * 5 + ["default"] * 5


def test_priority_within_a_queue(app: App) -> None:
    order: list[int] = []

    @app.task(queue="q")
    def record(p: int) -> None:
        order.append(p)

    app.send_many([Message(record.name, {"p": p}, priority=p) for p in (0, 5, 1, 9, 3)])
    drain(app, concurrency=1, prefetch=1)
    assert order == [9, 5, 3, 1, 0]


def test_lost_lease_is_reported_by_heartbeat(app: App) -> None:
    """Extending a lease that was rescued and re-acquired elsewhere reports it lost."""

    @app.task(queue="q")
    def noop() -> None:
        pass

    noop.delay()
    backend = app.backend
    now = datetime.now(UTC)
    first = backend.jobs_acquire(JobsAcquireParams("q", 1, 1.0, "w1", now))[0]
    backend.jobs_rescue_expired(JobsRescueParams(now + timedelta(seconds=2)))
    backend.jobs_acquire(JobsAcquireParams("q", 1, 30.0, "w2", now + timedelta(seconds=2)))
    params = LeasesExtendParams([LeaseRef(first.id, first.receipt)], 30.0, now + timedelta(seconds=3))
    assert backend.leases_extend_many(params) == []


def test_rescue_waits_for_the_workers_own_pending_acks(app: App) -> None:
    """After an outage longer than a lease, a worker must write its own acks before rescuing."""
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters
    from conveyor.worker.rescuer import Rescuer

    app.send("t", {}, queue="q")
    backend = app.backend
    now = datetime.now(UTC)
    backend.jobs_acquire(JobsAcquireParams("q", 1, 1.0, "w", now))
    later = now + timedelta(seconds=5)
    backlog = [1]
    rescuer = Rescuer(BackendCalls(backend, Counters()), Counters(), lambda: later, ready=lambda: not backlog)
    assert asyncio.run(rescuer.run_once()) == 0
    backlog.clear()
    assert asyncio.run(rescuer.run_once()) == 1


async def _time_pickup(send: Callable[[], object], ran: threading.Event) -> float:
    """Send one job; the seconds until its handler ran (it waits 10 s at most)."""
    sent = time.monotonic()
    await asyncio.to_thread(send)
    await asyncio.to_thread(ran.wait, 10)
    return time.monotonic() - sent


@pytest.fixture
def pg_app(postgres_database: str) -> Iterator[App]:
    a = App(postgres_database, migrate=True)
    yield a
    a.close()


def _listeners(url: str) -> set[int]:
    """The server pids of the sessions listening for jobs on ``url``'s database (a worker's idle fetcher)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE '%LISTEN conveyor_jobs%' AND pid <> pg_backend_pid()"
        ).fetchall()
    return {pid for (pid,) in rows}


async def _listening(url: str, besides: frozenset[int] = frozenset()) -> set[int]:
    """Wait until a worker listens for jobs on ``url``'s database on a session not in ``besides`` (a
    notification sent before that is lost, and these tests' workers poll once an hour); their pids."""
    for _ in range(1000):
        pids = await asyncio.to_thread(_listeners, url)
        if pids - besides:
            return pids
        await asyncio.sleep(0.01)
    raise AssertionError("no worker listened within 10 s")


def _idle_then(worker: Worker, idle: float, scenario: Callable[[], T]) -> T:
    """Run ``worker``; after ``idle`` seconds run ``scenario`` on a thread; stop the worker; return what it returned."""

    async def run() -> T:
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(idle)
        try:
            return await asyncio.to_thread(scenario)
        finally:
            worker.stop()
            await task

    return asyncio.run(asyncio.wait_for(run(), 30))


def test_an_idle_worker_starts_a_delayed_job_at_its_run_at_not_at_its_next_poll(app: App) -> None:
    # The worker knows the job is scheduled (this process wrote it, Backend.jobs_next_due): it wakes
    # when it is due. With a poll interval of 30 s it would otherwise wait for the poll (PostgreSQL:
    # a scheduled job sends no notification; SQLite: the idle poll, 2 s into its doubling, waits ~2 s).
    started = threading.Event()

    @app.task(queue="q")
    def later() -> None:
        started.set()

    worker = Worker(app, concurrency=2, poll_interval=30)

    def scenario() -> tuple[float, float]:
        # run_at is the time of the call plus 1 s: a job started before (its call's start + 1 s) started
        # early; one started more than 0.4 s after (its call's return + 1 s) waited for a poll. (Stamped
        # on both sides: one CI send under load took 0.3 s, and after it the start looked 0.32 s early.)
        before = time.monotonic()
        later.send(None, delay=1.0)
        sent = time.monotonic()
        assert started.wait(10)
        now = time.monotonic()
        return now - before - 1.0, now - sent - 1.0

    early, late = _idle_then(worker, 2.0, scenario)
    assert early > -0.05 and late < 0.4, (early, late)


def test_an_idle_worker_starts_a_retry_when_its_backoff_ends(app: App) -> None:
    attempts: list[float] = []
    done = threading.Event()

    @app.task(queue="q", max_attempts=3)
    def flaky(ctx: JobContext) -> None:
        attempts.append(time.monotonic())
        if ctx.attempt == 1:
            raise Retry(delay=1.0)
        done.set()

    worker = Worker(app, concurrency=2, poll_interval=30)

    def scenario() -> float:
        flaky.delay()
        assert done.wait(10)
        return attempts[1] - attempts[0] - 1.0

    late = _idle_then(worker, 2.0, scenario)
    assert len(attempts) == 2 and -0.05 < late < 0.4, (attempts, late)


def test_a_worker_wakes_for_a_job_another_process_scheduled_that_its_acquire_saw(database_url: str) -> None:
    producer, consumer = App(database_url, migrate=True), App(database_url)
    started = threading.Event()

    @consumer.task(name="later", queue="q")
    def later() -> None:
        started.set()

    try:
        # Stamped on both sides of the send (its first call migrates: 0.5 s once under load).
        before = time.monotonic()
        producer.send("later", queue="q", delay=1.5)
        sent = time.monotonic()
        worker = Worker(consumer, concurrency=2, poll_interval=30)

        def scenario() -> tuple[float, float]:
            assert started.wait(10)
            now = time.monotonic()
            return now - before - 1.5, now - sent - 1.5

        early, late = _idle_then(worker, 0.0, scenario)
    finally:
        producer.close()
        consumer.close()
    assert early > -0.05 and late < 0.4, (early, late)


def test_an_idle_worker_picks_up_by_notification_not_by_polling(pg_app: App, postgres_database: str) -> None:
    ran = threading.Event()

    @pg_app.task(queue="q")
    def ping() -> None:
        ran.set()

    # A poll interval of an hour: only the NOTIFY path (the listener's thread acquiring at once)
    # can pick the job up within the test.
    worker = Worker(pg_app, concurrency=2, poll_interval=3600)

    async def scenario() -> float:
        task = asyncio.create_task(worker.run())
        await _listening(postgres_database)
        picked = await _time_pickup(ping.delay, ran)
        worker.stop()
        await task
        return picked

    picked = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert ran.is_set() and picked < 2.0
    assert worker.counters.acquired == worker.counters.completed == 1


def test_an_idle_worker_on_postgres_polls_at_its_poll_interval(pg_app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between notifications an idle worker looks for jobs whose run_at came due once per poll
    # interval (WorkerConfig: 1 s with notifications), not at every bounded step of its listener's
    # wait (4 a second before); a stop is still noticed within a step, and a delayed job that
    # comes due (no notification) is picked up by the poll.
    ran = threading.Event()

    @pg_app.task(queue="q")
    def ping() -> None:
        ran.set()

    backend = pg_app.backend
    acquire = backend.jobs_acquire
    acquires: list[float] = []

    def counting_acquire(params: JobsAcquireParams) -> list[Any]:
        acquires.append(time.monotonic())
        return acquire(params)

    monkeypatch.setattr(backend, "jobs_acquire", counting_acquire)
    worker = Worker(pg_app, concurrency=1, poll_interval=1.0)

    async def scenario() -> tuple[float, float]:
        task = asyncio.create_task(worker.run())
        await asyncio.to_thread(ping.send, None, delay=2.5)
        sent = time.monotonic()
        await asyncio.to_thread(ran.wait, 10)
        late = time.monotonic() - sent - 2.5
        await asyncio.sleep(1.2)
        stopped = time.monotonic()
        worker.stop()
        await task
        return late, time.monotonic() - stopped

    late, stopping = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert ran.is_set() and late < 1.5, late
    # About 4.7 s: the first acquire, then one a second (14-19 at four a second).
    assert 4 <= len(acquires) <= 8, [round(t - acquires[0], 2) for t in acquires]
    assert stopping < 1.0, stopping


def test_an_idle_worker_whose_sessions_are_killed_still_picks_up_by_notification(
    pg_app: App, postgres_database: str
) -> None:
    # A server restart or failover kills the listener's session while the fetcher waits on it: the
    # listener reconnects within the poll interval's steps, and the next job wakes the worker again
    # (a poll interval of an hour: only a notification can start the job within the test).
    import psycopg

    ran = threading.Event()

    @pg_app.task(queue="q")
    def ping() -> None:
        ran.set()

    worker = Worker(pg_app, concurrency=1, poll_interval=3600)

    def kill_sessions() -> int:
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            return terminate_other_sessions(conn)

    async def scenario() -> tuple[int, float]:
        task = asyncio.create_task(worker.run())
        before = await _listening(postgres_database)
        killed = await asyncio.to_thread(kill_sessions)
        await _listening(postgres_database, besides=frozenset(before))  # the listener noticed and reconnected
        picked = await _time_pickup(ping.delay, ran)
        worker.stop()
        await task
        return killed, picked

    killed, picked = asyncio.run(asyncio.wait_for(scenario(), 40))
    assert killed >= 1
    assert ran.is_set() and picked < 3.0, picked
    assert worker.counters.completed == 1


def test_an_idle_worker_runs_a_chain_of_keyed_jobs_without_waiting_for_polls(
    pg_app: App, postgres_database: str
) -> None:
    # Jobs of one ordering key run one after another: each becomes ready when the one before it
    # ends, which wakes the workers (a poll interval of an hour: no poll can start them in time).
    order: list[int] = []

    @pg_app.task(queue="q")
    def step(n: int) -> None:
        order.append(n)

    worker = Worker(pg_app, concurrency=4, poll_interval=3600)

    async def scenario() -> float:
        task = asyncio.create_task(worker.run())
        await _listening(postgres_database)
        sent = time.monotonic()
        for n in range(5):
            await asyncio.to_thread(step.send, {"n": n}, ordering_key="account-7")
        while len(order) < 5 and time.monotonic() - sent < 20:
            await asyncio.sleep(0.01)
        took = time.monotonic() - sent
        worker.stop()
        await task
        return took

    took = asyncio.run(asyncio.wait_for(scenario(), 40))
    assert order == [0, 1, 2, 3, 4]
    assert took < 5.0, took


def test_a_worker_going_idle_after_a_burst_vacuums_the_jobs_table(
    pg_app: App, postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Until a vacuum, every acquire steps over the index entries of the jobs finished since the last
    # one (autovacuum may come a minute later): a worker that goes idle having leased vacuum_after
    # jobs has the table vacuumed; fewer, it does not; and not again within the minute.
    from conveyor.worker.fetcher import Fetcher

    monkeypatch.setattr(Fetcher, "vacuum_after", 20)
    done: list[int] = []

    @pg_app.task(queue="q")
    async def job(i: int) -> None:
        done.append(i)

    worker = Worker(pg_app, concurrency=4)

    async def until(count: int) -> None:
        while len(done) < count:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # idle: the fetcher found nothing more (the vacuum takes ms)

    async def scenario() -> list[int]:
        await asyncio.to_thread(job.delay_many, [{"i": i} for i in range(10)])
        counts = [jobs_vacuums(postgres_database)]
        task = asyncio.create_task(worker.run())
        await until(10)
        counts.append(jobs_vacuums(postgres_database))  # 10 leased: below the threshold
        await asyncio.to_thread(job.delay_many, [{"i": i} for i in range(30)])
        await until(40)
        counts.append(jobs_vacuums(postgres_database))  # 40 leased: vacuumed
        await asyncio.to_thread(job.delay_many, [{"i": i} for i in range(30)])
        await until(70)
        counts.append(jobs_vacuums(postgres_database))  # 30 more, within the minute: not again
        worker.stop()
        await task
        return counts

    counts = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert counts[1] == counts[0] and counts[2] == counts[0] + 1 and counts[3] == counts[2], counts


def test_a_worker_whose_vacuum_fails_carries_on_and_leaves_it_to_autovacuum(
    pg_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A table too big to vacuum within the bound, or a role not allowed to: the failure is logged,
    # the worker goes on running jobs and does not try again (even where it otherwise would).
    from conveyor._errors import BackendUnavailable
    from conveyor.worker import fetcher

    monkeypatch.setattr(fetcher.Fetcher, "vacuum_after", 5)
    monkeypatch.setattr(fetcher, "_VACUUM_EVERY", 0.0)
    tries: list[float] = []

    def refuse() -> None:
        tries.append(time.monotonic())
        raise BackendUnavailable("PostgreSQL unavailable (jobs_vacuum): canceling statement due to statement timeout")

    monkeypatch.setattr(pg_app.backend, "jobs_vacuum", refuse)
    done: list[int] = []

    @pg_app.task(queue="q")
    async def job(i: int) -> None:
        done.append(i)

    worker = Worker(pg_app, concurrency=4)

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        for burst in (1, 2, 3):
            await asyncio.to_thread(job.delay_many, [{"i": i} for i in range(10)])
            while len(done) < 10 * burst:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert len(done) == 30 and len(tries) == 1
    assert worker.counters.completed == 30


def test_acquire_and_finish_run_on_the_loop_unless_the_backend_replaces_them(pg_app: App) -> None:
    # On PostgreSQL the worker's acquire and finish are coroutines on its loop (no database thread,
    # whose wake-ups take the GIL from the handlers); a replaced or wrapped method is called as given,
    # so fault injection still reaches the worker.
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters

    backend = pg_app.backend
    calls = BackendCalls(backend, Counters())
    try:
        assert set(calls._on_loop) == {backend.jobs_acquire, backend.jobs_finish_many}
    finally:
        calls.shutdown()

    def replaced(params: JobsAcquireParams) -> list[Any]:
        return []

    backend.jobs_acquire = replaced  # type: ignore[method-assign]
    try:
        calls = BackendCalls(backend, Counters())
        assert set(calls._on_loop) == {backend.jobs_finish_many}
        now = datetime.now(UTC)
        assert asyncio.run(calls.once(backend.jobs_acquire, JobsAcquireParams("q", 5, 30.0, "w", now))) == []
        calls.shutdown()
    finally:
        del backend.jobs_acquire


def test_a_job_picked_up_by_notification_starts_before_the_next_acquire(pg_app: App, postgres_database: str) -> None:
    # The pickup path: the listener's thread acquires, the event loop buffers the job, and its slot
    # starts it before the fetch loop's next acquire goes to a database thread (which would compete
    # with the handler for the GIL, and did run first: ~0.15 ms of every pickup).
    events: list[str] = []

    @pg_app.task(queue="q")
    async def ping() -> None:
        events.append("handler")

    backend = pg_app.backend
    acquire = backend.jobs_acquire

    def recording_acquire(params: JobsAcquireParams) -> list[Any]:
        events.append("acquire")
        got = acquire(params)
        events.append(f"acquired {len(got)}")
        return got

    backend.jobs_acquire = recording_acquire  # type: ignore[method-assign]
    worker = Worker(pg_app, concurrency=2, poll_interval=3600)

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await _listening(postgres_database)
        while "acquired 0" not in events:  # the first acquire found nothing: idle, waiting on the listener
            await asyncio.sleep(0.01)
        del events[:]
        await asyncio.to_thread(ping.delay)
        for _ in range(500):
            if "handler" in events and events[-1] == "acquired 0":
                break
            await asyncio.sleep(0.01)
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert events[:4] == ["acquire", "acquired 1", "handler", "acquire"], events


def test_stopping_an_idle_worker_leaves_no_job_leased(pg_app: App, postgres_database: str) -> None:
    @pg_app.task(queue="q")
    def noop() -> None:
        pass

    worker = Worker(pg_app, concurrency=1, poll_interval=3600)

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await _listening(postgres_database)
        # Jobs arrive while the worker is told to stop: whatever its listener's thread leased must
        # come back to pending (released) or run, never stay leased until the lease expires.
        await asyncio.to_thread(lambda: pg_app.send_many([Message(noop.name) for _ in range(5)]))
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 30))
    states = [s.state for s in pg_app.backend.jobs_list(JobsListParams())]
    assert "processing" not in states
    assert worker.counters.acquired == worker.counters.completed + worker.counters.released


def test_the_default_buffer_grows_with_the_start_rate_and_shrinks_back(sqlite_url: str) -> None:
    from conveyor._clock import host_now
    from conveyor.worker import WorkerConfig
    from conveyor.worker._buffer import Buffer
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters, Registry
    from conveyor.worker.fetcher import Fetcher

    app = App(sqlite_url)
    counters = Counters()
    calls = BackendCalls(app.backend, counters)

    def fetcher(config: WorkerConfig) -> Fetcher:
        return Fetcher(app.catalogue, calls, Registry(), counters, Buffer(config.concurrency), config, ["q"], host_now)

    # The default buffer adapts (4 to 16 x concurrency: 40 to 160); a given prefetch is fixed.
    adaptive, fixed = fetcher(WorkerConfig(concurrency=10)), fetcher(WorkerConfig(concurrency=10, prefetch=40))
    for f in (adaptive, fixed):
        f._rate_at -= 1.0  # one second ago, no job started yet
    counters.started = 3_000  # 3,000 jobs/s: 50 ms of work is 150 jobs
    adaptive._adapt()
    fixed._adapt()
    assert 140 <= adaptive.capacity <= 150 and fixed.capacity == 40  # the second is a bit over a second

    adaptive._rate_at -= 1.0
    counters.started += 20_000  # 20,000 jobs/s: capped at max_capacity
    adaptive._adapt()
    assert adaptive.capacity == 160

    adaptive._rate_at -= 1.0
    counters.started += 100  # slow jobs: back to the base size
    adaptive._adapt()
    assert adaptive.capacity == 40
    calls.shutdown()
    app.close()


def test_outcomes_queued_during_a_flush_go_in_the_next_flush_together(sqlite_url: str) -> None:
    # One statement per flush: outcomes that handlers queue while it runs wait for the next tick and
    # share its statement. Flushing them at once instead chained statements that each carried the
    # few outcomes that arrived during the one before (a drain averaged ~10 jobs per statement).
    from uuid import uuid4

    from conveyor._clock import host_now
    from conveyor.backends.base import Finish, JobsFinishParams
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters, Registry
    from conveyor.worker.completer import Completer

    app = App(sqlite_url, migrate=True)
    batches: list[int] = []

    def finish_many(params: JobsFinishParams) -> int:
        batches.append(len(params.items))
        if len(batches) == 1:
            for _ in range(5):  # handlers finishing while this statement runs
                completer.add(Finish(uuid4(), str(uuid4()), "completed"))
        return 0  # stale: no such jobs

    app.backend.jobs_finish_many = finish_many  # type: ignore[method-assign]
    counters = Counters()
    calls = BackendCalls(app.backend, counters)
    completer = Completer(calls, Registry(), counters, host_now)
    completer.add(Finish(uuid4(), str(uuid4()), "completed"))
    try:
        assert asyncio.run(completer.run_once()) == 1
        assert batches == [1] and completer.backlog == 5
        assert asyncio.run(completer.run_once()) == 5
        assert batches == [1, 5] and completer.backlog == 0
        assert counters.stale_acks == 6
    finally:
        calls.shutdown()
        app.close()


def test_an_outcome_whose_write_went_through_before_its_connection_was_lost_is_not_called_a_redelivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database took a finish's commit and then the connection went (a server killed or cut off after the
    commit): the retry finds the job archived, a stale ack. The warning said, as a fact, that its lease had
    expired and the job was redelivered (seen on MySQL under KILL: nothing was). It says both causes now."""
    from datetime import UTC, datetime

    from conveyor._clock import host_now
    from conveyor._errors import BackendUnavailable
    from conveyor.backends.base import Finish, JobsAcquireParams, JobsFinishParams
    from conveyor.worker._calls import BackendCalls
    from conveyor.worker._state import Counters, Registry
    from conveyor.worker.completer import Completer

    app = App("memory://", migrate=True)
    app.send("t", {}, queue="q")
    leased = app.backend.jobs_acquire(JobsAcquireParams("q", 1, 30, "w", datetime.now(UTC)))[0]
    real = app.backend.jobs_finish_many
    tries: list[int] = []

    def finish_many(params: JobsFinishParams) -> int:
        tries.append(real(params))
        if len(tries) == 1:
            raise BackendUnavailable("the connection was lost after the commit")
        return tries[-1]

    app.backend.jobs_finish_many = finish_many  # type: ignore[method-assign]
    counters = Counters()
    calls = BackendCalls(app.backend, counters)
    completer = Completer(calls, Registry(), counters, host_now)
    completer.add(Finish(leased.id, leased.receipt, "completed"))
    try:
        with caplog.at_level("WARNING", logger="conveyor.worker"):
            asyncio.run(completer.run_once())
        assert tries == [1, 0] and counters.stale_acks == 1
        assert app.job(leased.id).state == "completed"
        stale = [r.getMessage() for r in caplog.records if "stale ack" in r.getMessage()]
        assert stale == [
            "1 stale ack(s) after the database was away: a try that lost its connection had written them already, "
            "or their leases had expired and the jobs were redelivered"
        ]
    finally:
        calls.shutdown()
        app.close()


@pytest.mark.parametrize("weights", [None, {"a": 3, "b": 1}])
def test_prefetch_zero_leases_only_for_free_slots(app: App, weights: dict[str, int] | None) -> None:
    """``prefetch=0`` (the supervisor's default under --autoscale): while its one slot runs, nothing more is
    leased, also with weighted lanes (whose shares round up to one job each); a finished job frees one lease."""
    release = threading.Event()
    started: list[int] = []

    @app.task(queue="a")
    def block_a(n: int) -> None:
        started.append(n)
        release.wait(10)

    @app.task(queue="b")
    def block_b(n: int) -> None:
        started.append(n)
        release.wait(10)

    app.send_many([Message(block_a.name, {"n": n}) for n in range(3)] + [Message(block_b.name, {"n": 10})])
    worker = Worker(app, ["a", "b"], weights=weights, concurrency=1, prefetch=0, poll_interval=0.02, burst=True)

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        for _ in range(250):
            if started:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # time for any further acquire
        assert len(started) == 1
        assert worker.counters.acquired == 1  # the other three are ready for another worker
        assert sum(s.pending for s in app.admin.queues() if s.queue in ("a", "b")) == 3
        release.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    assert sorted(started) == [0, 1, 2, 10]
    assert worker.counters.completed == 4
