"""The scheduler loop: each cron tick fires once however many schedulers run; missed ticks fire
once; schedules change at runtime."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _clock import FixedClock

from conveyor import App
from conveyor.backends.base import (
    Schedule,
    SchedulesUpdateParams,
    SchedulesUpsertParams,
)
from conveyor.worker._calls import BackendCalls
from conveyor.worker._state import Counters
from conveyor.worker.scheduler import Scheduler


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def _live(app: App) -> list[Any]:
    from conveyor.testing import enqueued

    return enqueued(app)


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


def test_a_schedule_with_no_tick_before_the_year_10000_is_logged_once_and_skipped(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """Its next tick overflowed datetime: an OverflowError, which run_once did not catch, stopped the loop."""
    last = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    app.backend.schedules_upsert(SchedulesUpsertParams([Schedule("last", "* * * * *", "t", "q", "{}", last)]))
    scheduler = Scheduler(app.producer, BackendCalls(app.backend, Counters()), FixedClock(last + timedelta(seconds=30)))
    with caplog.at_level(logging.ERROR, logger="conveyor.worker"):
        assert asyncio.run(scheduler.run_once()) == 0
        assert asyncio.run(scheduler.run_once()) == 0
    skipped = [r.getMessage() for r in caplog.records if "cannot fire" in r.getMessage()]
    assert skipped == [
        "schedule 'last' cannot fire, skipped: cron expression '* * * * *' has no tick after "
        "9999-12-31T23:59:30+00:00 before the year 10000"
    ]
    assert _live(app) == []


def _scheduler(app: App, clock: FixedClock) -> Scheduler:
    return Scheduler(app.producer, BackendCalls(app.backend, Counters()), clock)


def _ticks(app: App) -> list[str]:
    return sorted(json.loads(r.headers)["tick"] for r in _live(app))


def test_after_a_day_down_the_latest_missed_tick_fires(app: App) -> None:
    """The one job fired for a day of missed ticks said it was the oldest tick's (24 hours old); then
    the job said the latest, but last_run_at still held the oldest (the stored tick fired on)."""

    @app.periodic("*/5 * * * *", name="five")
    def five() -> None:
        pass

    start = app.schedules["five"].next_run_at
    clock = FixedClock(start + timedelta(days=1, minutes=7))
    scheduler = _scheduler(app, clock)
    assert asyncio.run(scheduler.run_once()) == 1
    assert asyncio.run(scheduler.run_once()) == 0
    assert _ticks(app) == [(start + timedelta(days=1, minutes=5)).isoformat()]
    schedule = app.backend.schedules_list()[0]
    assert (schedule.next_run_at, schedule.last_run_at) == (
        start + timedelta(days=1, minutes=10),
        start + timedelta(days=1, minutes=5),
    )


def test_a_stored_schedule_this_app_neither_declares_nor_can_run_is_named_at_start(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """A schedule removed from the code kept firing, unnoticed, jobs that died unknown_task. Another
    app sharing the database may still declare it, so it is named, not deleted."""

    @app.periodic("0 * * * *", name="kept")
    def kept() -> None:
        pass

    later = datetime(2100, 1, 1, tzinfo=UTC)
    app.backend.schedules_upsert(
        SchedulesUpsertParams(
            [
                Schedule("removed", "* * * * *", "gone.task", "default", "{}", later),
                Schedule("added-live", "* * * * *", kept.name, "default", "{}", later),  # its task runs here
            ]
        )
    )
    scheduler = _scheduler(app, FixedClock(later - timedelta(hours=1)))
    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        asyncio.run(scheduler.run_once())
        asyncio.run(scheduler.run_once())
    warnings = [r.getMessage() for r in caplog.records if "not declared by this app" in r.getMessage()]
    assert warnings == [
        "1 stored schedule(s) are not declared by this app, and their tasks are not registered in it: "
        "'removed' (task 'gone.task'); if no app declares one any more, remove it with "
        "`conveyor schedules remove NAME` (app.admin.remove_schedule), or it keeps enqueueing jobs on every tick"
    ]
    assert {s.name for s in app.admin.schedules()} == {"kept", "removed", "added-live"}
