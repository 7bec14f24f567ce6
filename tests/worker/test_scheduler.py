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


def _every_minute(app: App) -> datetime:
    """Declare an every-minute schedule; return its first tick."""

    @app.periodic("* * * * *", name="every-minute")
    def every_minute() -> None:
        pass

    return app.schedules["every-minute"].next_run_at


def _minutes(start: datetime, first: int, last: int) -> list[str]:
    return [(start + timedelta(minutes=m)).isoformat() for m in range(first, last + 1)]


def test_a_next_tick_stored_by_a_clock_a_day_ahead_is_moved_back_and_fires_within_a_minute(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """A scheduler whose clock was a day ahead stored next_run_at a day away; with its clock right
    again the every-minute schedule stayed silent for that day."""
    start = _every_minute(app)
    ahead = FixedClock(start + timedelta(days=1, seconds=5))
    assert asyncio.run(_scheduler(app, ahead).run_once()) == 1
    assert app.backend.schedules_list()[0].next_run_at == start + timedelta(days=1, minutes=1)

    right = FixedClock(start + timedelta(seconds=20))
    scheduler = _scheduler(app, right)
    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        assert asyncio.run(scheduler.run_once()) == 0
        assert asyncio.run(scheduler.run_once()) == 0
    assert app.backend.schedules_list()[0].next_run_at == start + timedelta(minutes=1)
    moved = [r.getMessage() for r in caplog.records if "moved back" in r.getMessage()]
    assert moved == [
        f"schedule 'every-minute': its next tick {(start + timedelta(days=1, minutes=1)).isoformat()} was stored "
        f"by a clock more than 60 minutes ahead of this one ({right.now.isoformat()}); "
        f"moved back to {(start + timedelta(minutes=1)).isoformat()}"
    ]
    fired = []
    for minute in (1, 2, 3):
        right.now = start + timedelta(minutes=minute, seconds=1)
        fired.append(asyncio.run(scheduler.run_once()))
    assert fired == [1, 1, 1]
    assert _ticks(app) == [*_minutes(start, 1, 3), (start + timedelta(days=1)).isoformat()]


@pytest.mark.parametrize("skew", [timedelta(seconds=20), timedelta(seconds=90), timedelta(minutes=50)])
def test_schedulers_whose_clocks_differ_fire_each_tick_once(app: App, skew: timedelta) -> None:
    """Moving back a next tick further ahead than the cron allows from now, with no margin (session
    36), made a scheduler 90 s behind (20 s after downtime) take the tick the other stored for one
    too far ahead and fire the tick it had fired again. Each clock here is half the skew off."""
    start = _every_minute(app)
    real = start + timedelta(minutes=30, seconds=5)  # after 30 ticks of downtime
    ahead, behind = FixedClock(real + skew / 2), FixedClock(real - skew / 2)
    schedulers = [_scheduler(app, ahead), _scheduler(app, behind)]
    for step in range(60):  # 10 minutes, 10 s a step, both schedulers each step in turn
        ahead.now, behind.now = real + skew / 2, real - skew / 2
        for scheduler in schedulers if step % 2 else reversed(schedulers):
            asyncio.run(scheduler.run_once())
        real += timedelta(seconds=10)
    ticks = _ticks(app)
    assert len(ticks) == len(set(ticks))  # each tick once
    # After the downtime's one fire (by the scheduler behind, a tick the other is past, when it ran
    # first), none is skipped: the one ahead fires every tick.
    second = (datetime.fromisoformat(ticks[1]) - start) // timedelta(minutes=1)
    assert ticks[1:] == _minutes(start, second, second + len(ticks) - 2)
    assert len(ticks) >= 10


def test_a_scheduler_still_a_day_ahead_beside_one_on_time_fires_no_tick_twice(app: App) -> None:
    """The one on time moves back the next tick the other stored a day away, and the other, still a
    day ahead, fired its latest tick again each time: a job every second, not every minute."""
    start = _every_minute(app)
    real = start + timedelta(seconds=1)
    right, ahead = FixedClock(real), FixedClock(real + timedelta(days=1))
    schedulers = [_scheduler(app, right), _scheduler(app, ahead)]
    for _ in range(36):  # 3 minutes, 5 s a step
        right.now, ahead.now = real, real + timedelta(days=1)
        for scheduler in schedulers:
            asyncio.run(scheduler.run_once())
        real += timedelta(seconds=5)
    # Each fires a tick a minute while the one ahead runs on: today's and tomorrow's, each once.
    assert _ticks(app) == _minutes(start, 0, 2) + _minutes(start + timedelta(days=1), 0, 2)


def test_a_tick_fired_by_a_clock_a_little_ahead_is_not_fired_again_once_moved_back(app: App) -> None:
    """A next tick written back to one that fired (a resume by a clock behind the one that fired)
    fired it again."""
    start = _every_minute(app)
    assert asyncio.run(_scheduler(app, FixedClock(start + timedelta(seconds=20))).run_once()) == 1
    assert app.backend.schedules_update(SchedulesUpdateParams("every-minute", next_run_at=start))
    right = FixedClock(start + timedelta(seconds=1))
    scheduler = _scheduler(app, right)
    assert asyncio.run(scheduler.run_once()) == 0
    right.now = start + timedelta(minutes=1, seconds=1)
    assert asyncio.run(scheduler.run_once()) == 1
    assert _ticks(app) == _minutes(start, 0, 1)


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
