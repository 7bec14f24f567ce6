"""Delivery features above the seam (issue 3), on every SQL engine: backpressure, topics, cron,
effects-once, TTL policy, weighted lanes, retention, the queue contract."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor import App, JobContext, Message, Worker
from conveyor._contract import build, render
from conveyor._errors import ConfigurationError, QueueFull
from conveyor.backends.base import (
    ArchiveReadParams,
    Finish,
    JobsAcquireParams,
    JobsFinishParams,
    SchedulesUpdateParams,
)
from conveyor.testing import drain
from conveyor.worker._calls import BackendCalls
from conveyor.worker._state import Counters
from conveyor.worker.pruner import Pruner
from conveyor.worker.scheduler import Scheduler


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


# -- backpressure ------------------------------------------------------------------------------


def test_queue_full_with_graduated_shedding(app: App) -> None:
    app.queue("bounded", max_depth=10)  # low refused at 5, normal at 8, high at 10

    @app.task(queue="bounded")
    def work() -> None:
        pass

    for _ in range(5):
        work.send({}, priority=-1)
    with pytest.raises(QueueFull) as low:
        work.send({}, priority=-1)
    assert low.value.limit == 5 and low.value.depth == 5 and low.value.retry_after > 0
    for _ in range(3):
        work.send({})  # normal
    with pytest.raises(QueueFull):
        work.send({})
    work.send({}, priority=5)
    work.send({}, priority=5)
    with pytest.raises(QueueFull) as high:
        work.send({}, priority=5)
    assert high.value.limit == 10
    # Nothing accepted is dropped: exactly the 10 accepted jobs are there and all run.
    assert drain(app).completed == 10


def test_retry_after_comes_from_the_drain_rate(app: App) -> None:
    app.queue("rated", max_depth=4, shedding={"low": 1.0, "normal": 1.0, "high": 1.0})

    @app.task(queue="rated")
    def work() -> None:
        pass

    app.send_many([Message(work.name) for _ in range(4)])
    drain(app)  # 4 drained in the last minute: 4/60 jobs per second
    app.send_many([Message(work.name) for _ in range(4)])
    app.producer.load._loads.clear()
    with pytest.raises(QueueFull) as full:
        work.send({})
    # One job over the mark at 4 jobs/min drains in ~15 s.
    assert 10 <= full.value.retry_after <= 20


def test_batch_over_the_mark_enqueues_nothing(app: App) -> None:
    app.queue("atomic", max_depth=3, shedding={"low": 1.0, "normal": 1.0, "high": 1.0})
    with pytest.raises(QueueFull):
        app.send_many([Message("t", queue="atomic") for _ in range(4)])
    assert (
        app.backend.queue_load(
            __import__("conveyor.backends.base", fromlist=["QueueLoadParams"]).QueueLoadParams(
                "atomic", datetime.now(UTC)
            )
        ).depth
        == 0
    )


# -- topics ------------------------------------------------------------------------------------


def test_publish_fans_out_to_matching_subscriptions(app: App) -> None:
    seen: list[tuple[str, int]] = []

    @app.task(queue="billing")
    def bill(order: int) -> None:
        seen.append(("billing", order))

    @app.task(queue="eu-shipping", max_attempts=2, backoff=[0.01])
    def ship(order: int) -> None:
        raise ConnectionError("carrier down")

    @app.task(queue="audit")
    def audit(order: int) -> None:
        seen.append(("audit", order))

    app.subscribe("orders", "billing", bill)
    app.subscribe("orders", "eu-shipping", ship, filter={"region": {"in": ["eu", "uk"]}})
    app.subscribe("orders", "audit", audit, filter={"kind": "paid"})
    jobs = app.publish("orders", {"order": 1}, headers={"region": "eu", "kind": "paid"})
    assert sorted(j.status().queue for j in jobs) == ["audit", "billing", "eu-shipping"]
    assert [j.status().queue for j in app.publish("orders", {"order": 2}, headers={"region": "us"})] == ["billing"]
    assert app.publish("nobody-listens", {"order": 3}) == []
    drain(app)
    assert sorted(seen) == [("audit", 1), ("billing", 1), ("billing", 2)]
    # Each subscriber keeps its own retries and DLQ.
    shipped = next(j for j in jobs if j.status().queue == "eu-shipping").status()
    assert (shipped.state, shipped.attempts) == ("dead", 2)
    assert shipped.headers["topic"] == "orders"
    assert app.unsubscribe("orders", "audit") is True
    assert app.unsubscribe("orders", "audit") is False


def test_bad_filters_are_refused(app: App) -> None:
    with pytest.raises(ConfigurationError, match='"in"'):
        app.subscribe("t", "q", "task", filter={"region": ["eu"]})
    with pytest.raises(ConfigurationError):
        app.subscribe("t", "q", "task", filter={"region": {"like": "e%"}})


# -- cron --------------------------------------------------------------------------------------


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_each_tick_fires_once_with_three_schedulers(app: App) -> None:
    @app.periodic("*/5 * * * *", name="report")
    def report() -> None:
        pass

    start = app.schedules["report"].next_run_at
    clock = FixedClock(start)
    schedulers = [Scheduler(app.producer, BackendCalls(app.backend, Counters()), clock) for _ in range(3)]

    async def tick_all() -> int:
        return sum(await asyncio.gather(*(s.run_once() for s in schedulers)))

    fired = []
    for i in range(4):  # four ticks, 5 minutes apart, three schedulers racing for each
        clock.now = start + timedelta(minutes=5 * i, seconds=1)
        fired.append(asyncio.run(tick_all()))
    assert fired == [1, 1, 1, 1]
    ticks = sorted(json.loads(r.headers)["tick"] for r in _live(app))
    assert ticks == [(start + timedelta(minutes=5 * i)).isoformat() for i in range(4)]


def test_missed_ticks_fire_once_after_downtime(app: App) -> None:
    @app.periodic("* * * * *", name="every-minute")
    def every_minute() -> None:
        pass

    start = app.schedules["every-minute"].next_run_at
    clock = FixedClock(start + timedelta(minutes=30, seconds=5))  # down for 30 ticks
    scheduler = Scheduler(app.producer, BackendCalls(app.backend, Counters()), clock)
    assert asyncio.run(scheduler.run_once()) == 1
    assert asyncio.run(scheduler.run_once()) == 0
    schedule = app.backend.schedules_list()[0]
    assert schedule.next_run_at == start + timedelta(minutes=31)


def test_paused_and_changed_at_runtime(app: App) -> None:
    @app.periodic("0 * * * *", name="hourly")
    def hourly() -> None:
        pass

    start = app.schedules["hourly"].next_run_at
    clock = FixedClock(start + timedelta(seconds=1))
    scheduler = Scheduler(app.producer, BackendCalls(app.backend, Counters()), clock)
    asyncio.run(scheduler.declare())
    assert app.backend.schedules_update(SchedulesUpdateParams("hourly", paused=True)) is True
    assert asyncio.run(scheduler.run_once()) == 0
    new_next = start + timedelta(minutes=30)
    assert app.backend.schedules_update(
        SchedulesUpdateParams("hourly", paused=False, cron="*/30 * * * *", next_run_at=new_next)
    )
    clock.now = new_next + timedelta(seconds=1)
    assert asyncio.run(scheduler.run_once()) == 1
    # A worker restart re-declares the schedule from code: the runtime change of cron is replaced
    # only because the declared cron differs; the pause state is kept.
    assert app.backend.schedules_update(SchedulesUpdateParams("missing", paused=True)) is False


def _live(app: App) -> list[Any]:
    from conveyor.testing import enqueued

    return enqueued(app)


# -- effects once, TTL -------------------------------------------------------------------------


def test_once_skips_a_side_effect_already_done(app: App) -> None:
    effects: list[int] = []

    @app.task(queue="q", max_attempts=3, backoff=[0.01])
    def charge(order: int, ctx: JobContext) -> None:
        if ctx.once(f"charge:{order}"):
            effects.append(order)
        if ctx.attempt == 1:
            raise ConnectionError("lost the ack on the way back")

    charge.delay(order=7)
    drain(app)
    assert effects == [7]


def test_ttl_policy_dead_letters_when_the_queue_says_so(app: App) -> None:
    app.queue("strict", on_expire="dead")

    @app.task(queue="strict")
    def work() -> None:
        pass

    job = work.send({}, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    drain(app)
    status = job.status()
    assert (status.state, status.reason) == ("dead", "expired")


# -- lanes -------------------------------------------------------------------------------------


def test_weighted_lanes_do_not_starve_the_low_lane(app: App) -> None:
    starts: list[str] = []
    lock = threading.Lock()

    @app.task(queue="high")
    def high() -> None:
        with lock:
            starts.append("high")

    @app.task(queue="low")
    def low() -> None:
        with lock:
            starts.append("low")

    app.send_many([Message(high.name) for _ in range(600)] + [Message(low.name) for _ in range(600)])
    worker = Worker(
        app, queues=["high", "low"], weights={"high": 3, "low": 1}, concurrency=4, prefetch=40, poll_interval=0.02
    )

    async def run_until(n: int) -> None:
        task = asyncio.create_task(worker.run())
        while len(starts) < n:
            await asyncio.sleep(0.01)
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(run_until(400), 60))
    first = Counter(starts[:400])
    assert 0.18 <= first["low"] / 400 <= 0.32, first


# -- retention ---------------------------------------------------------------------------------


def test_pruner_enforces_retention_per_queue(app: App) -> None:
    app.queue("short", retention=timedelta(hours=1), dead_retention=timedelta(days=1))

    @app.task(queue="short")
    def ok() -> None:
        pass

    @app.task(queue="short")
    def bad() -> None:
        raise ValueError("x")

    @app.task(queue="long")
    def kept() -> None:
        pass

    app.send_many(
        [Message(ok.name) for _ in range(30)]
        + [Message(bad.name) for _ in range(5)]
        + [Message(kept.name) for _ in range(7)]
    )
    drain(app)
    later = FixedClock(datetime.now(UTC) + timedelta(hours=2))
    pruner = Pruner(app.catalogue, BackendCalls(app.backend, Counters()), later, batch=4, pause=0)
    pruned = asyncio.run(pruner.run_once())
    assert pruned >= 30
    rows = app.backend.archive_read(ArchiveReadParams(None, 1000))
    assert Counter((r.queue, r.state) for r in rows) == {("short", "dead"): 5, ("long", "completed"): 7}
    much_later = FixedClock(datetime.now(UTC) + timedelta(days=15))
    asyncio.run(Pruner(app.catalogue, BackendCalls(app.backend, Counters()), much_later, batch=4, pause=0).run_once())
    assert app.backend.archive_read(ArchiveReadParams(None, 1000)) == []


# -- the contract ------------------------------------------------------------------------------


def test_contract_lists_every_queue_options_and_topic(app: App) -> None:
    app.queue("emails", max_depth=1000, sla=timedelta(minutes=5), ordered=True)

    @app.task(queue="emails", max_attempts=7, backoff=[1, 10], visibility_timeout=45)
    def send_email() -> None:
        pass

    app.subscribe("signups", "emails", send_email, filter={"plan": "pro"})
    contract = build(app)
    emails = next(q for q in contract["queues"] if q["queue"] == "emails")
    assert emails["max_depth"] == 1000 and emails["sla_s"] == 300 and emails["ordering"].startswith("per-key")
    assert emails["tasks"][0]["max_attempts"] == 7
    assert emails["tasks"][0]["visibility_timeout_s"] == 45
    assert emails["tasks"][0]["backoff"] == "fixed 1s, 10s"
    assert contract["topics"] == [
        {"topic": "signups", "subscriptions": [{"queue": "emails", "task": send_email.name, "filter": {"plan": "pro"}}]}
    ]
    assert json.loads(render(contract, "json")) == contract
    md = render(contract, "md")
    assert "## Queue `emails`" in md and "| max_depth | 1000 |" in md
    yaml_text = render(contract, "yaml")
    assert "max_depth: 1000" in yaml_text and 'topic: "signups"' in yaml_text


def test_stale_finish_is_not_counted(app: App) -> None:
    """Sanity for the helpers above: finishing with a wrong receipt applies nothing."""
    app.send("t", {}, queue="q")
    d = app.backend.jobs_acquire(JobsAcquireParams("q", 1, 30, "w", datetime.now(UTC)))[0]
    wrong = Finish(d.id, "00000000000000000000000000000000", "completed")
    assert app.backend.jobs_finish_many(JobsFinishParams([wrong], datetime.now(UTC))) == 0
