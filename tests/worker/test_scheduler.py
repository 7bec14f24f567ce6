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
from conveyor._cron import Cron
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


def test_a_clock_stepped_ahead_and_back_leaves_no_schedule_silent(app: App, caplog: pytest.LogCaptureFixture) -> None:
    """The clock stepped a day ahead fired that day's tick and stored the next after it; once the clock
    was back, the schedule stayed silent for the day (until that stored tick)."""

    @app.periodic("*/5 * * * *", name="five")
    def five() -> None:
        pass

    start = app.schedules["five"].next_run_at
    clock = FixedClock(start + timedelta(days=1, seconds=1))  # stepped a day ahead
    scheduler = _scheduler(app, clock)
    assert asyncio.run(scheduler.run_once()) == 1
    clock.now = start + timedelta(seconds=30)  # and back
    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        assert asyncio.run(scheduler.run_once()) == 0
    assert (app.backend.schedules_list()[0].next_run_at) == start + timedelta(minutes=5)
    assert [r.getMessage() for r in caplog.records if "moved back" in r.getMessage()] == [
        f"schedule 'five': its next tick {(start + timedelta(days=1, minutes=5)).isoformat()} was stored by a clock "
        f"ahead of this one ({clock.now.isoformat()}); moved back to {(start + timedelta(minutes=5)).isoformat()}"
    ]
    clock.now = start + timedelta(minutes=5, seconds=1)
    assert asyncio.run(scheduler.run_once()) == 1
    assert _ticks(app) == [(start + timedelta(minutes=5)).isoformat(), (start + timedelta(days=1)).isoformat()]


def test_a_next_tick_stored_by_a_host_clock_ahead_is_moved_back_and_fires_on_time(app: App) -> None:
    # A schedule declared (or added) on a host whose clock is 3 hours ahead stores its first tick 3 hours late.
    now = datetime(2030, 5, 1, 12, 0, 30, tzinfo=UTC)
    ahead = Schedule("hourly", "0 * * * *", "t", "q", "{}", datetime(2030, 5, 1, 16, 0, tzinfo=UTC))
    app.backend.schedules_upsert(SchedulesUpsertParams([ahead]))
    clock = FixedClock(now)
    scheduler = _scheduler(app, clock)
    assert asyncio.run(scheduler.run_once()) == 0
    assert app.backend.schedules_list()[0].next_run_at == datetime(2030, 5, 1, 13, 0, tzinfo=UTC)
    clock.now = datetime(2030, 5, 1, 13, 0, 5, tzinfo=UTC)
    assert asyncio.run(scheduler.run_once()) == 1
    assert _ticks(app) == ["2030-05-01T13:00:00+00:00"]


def test_a_clock_a_little_behind_neither_moves_nor_fires_a_tick_again(app: App) -> None:
    # A last tick fired less than CLOCK_STEP_LIMIT ahead is believed: an NTP step back of a minute, or
    # a scheduler whose clock is behind the one that fired, does not fire that tick again.
    @app.periodic("* * * * *", name="minute")
    def minute() -> None:
        pass

    start = app.schedules["minute"].next_run_at
    fast = FixedClock(start + timedelta(seconds=50))
    assert asyncio.run(_scheduler(app, fast).run_once()) == 1
    stored = app.backend.schedules_list()[0]
    slow = FixedClock(start - timedelta(seconds=40))
    for clock in (slow, FixedClock(start - timedelta(minutes=50))):
        assert asyncio.run(_scheduler(app, clock).run_once()) == 0
        assert app.backend.schedules_list()[0] == stored
    assert _ticks(app) == [start.isoformat()]


def test_two_schedulers_on_own_clocks_hours_apart_do_not_fire_a_tick_again_at_every_pass(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """Two schedulers without a referee clock (SQLite; a worker given a clock), 2 hours apart: the one
    behind disbelieved the tick the one ahead fired and moved the next tick back, the one ahead fired
    the same tick again, and so at every pass (session 37's failure), with a warning each time. Now the
    one ahead does not fire again the tick it fired last, and the one behind believes that tick once it
    finds it stored again: one move back, no tick fired twice."""
    start = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)
    app.backend.schedules_upsert(SchedulesUpsertParams([Schedule("m", "* * * * *", "t", "q", "{}", start)]))
    behind = _scheduler(app, FixedClock(start + timedelta(seconds=5)))
    ahead = _scheduler(app, FixedClock(start + timedelta(hours=2, seconds=5)))

    async def passes() -> int:
        fired = 0
        for _ in range(5):
            fired += await behind.run_once()
            fired += await ahead.run_once()
        return fired

    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        assert asyncio.run(passes()) == 2
    assert _ticks(app) == ["2030-05-01T12:00:00+00:00", "2030-05-01T14:00:00+00:00"]
    assert len([r for r in caplog.records if "moved back" in r.getMessage()]) == 1
    assert app.backend.schedules_list()[0].next_run_at == datetime(2030, 5, 1, 14, 1, tzinfo=UTC)


def test_a_schedule_resumed_by_a_clock_behind_does_not_fire_its_last_tick_again(app: App) -> None:
    """A schedule paused right after a tick and resumed by an operator whose clock is behind stores a
    next tick at or before the one fired last: it was due, and that tick fired again."""

    @app.periodic("*/5 * * * *", name="five")
    def five() -> None:
        pass

    start = app.schedules["five"].next_run_at
    clock = FixedClock(start + timedelta(seconds=1))
    scheduler = _scheduler(app, clock)
    assert asyncio.run(scheduler.run_once()) == 1
    # Paused, then resumed from a clock 10 minutes behind: its next tick after "now" is the one fired.
    app.backend.schedules_update(SchedulesUpdateParams("five", paused=False, next_run_at=start))
    clock.now = start + timedelta(minutes=2)
    assert asyncio.run(_scheduler(app, clock).run_once()) == 0
    assert app.backend.schedules_list()[0].next_run_at == start + timedelta(minutes=5)
    clock.now = start + timedelta(minutes=5, seconds=1)
    assert asyncio.run(scheduler.run_once()) == 1
    assert _ticks(app) == [start.isoformat(), (start + timedelta(minutes=5)).isoformat()]


def test_the_check_for_ticks_stored_ahead_is_worked_out_once_per_stored_tick(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pass over many schedules whose next tick is far (daily ones, say) must stay cheap on the event
    # loop: each stored tick is checked against the clock once, not at every pass.
    start = datetime(2030, 5, 1, 12, 0, 30, tzinfo=UTC)
    app.backend.schedules_upsert(
        SchedulesUpsertParams(
            [
                Schedule(f"daily-{i}", "0 3 * * *", "t", "q", "{}", datetime(2030, 5, 2, 3, tzinfo=UTC))
                for i in range(50)
            ]
        )
    )
    calls: list[datetime] = []
    next_after = Cron.next_after

    def counted(cron: Cron, after: datetime) -> datetime:
        calls.append(after)
        return next_after(cron, after)

    monkeypatch.setattr(Cron, "next_after", counted)
    clock = FixedClock(start)
    scheduler = _scheduler(app, clock)
    assert asyncio.run(scheduler.run_once()) == 0
    assert len(calls) == 50
    for minutes in (1, 2, 3):
        clock.now = start + timedelta(minutes=minutes)
        assert asyncio.run(scheduler.run_once()) == 0
    assert len(calls) == 50
    clock.now = start - timedelta(minutes=5)  # the clock went back: checked again
    assert asyncio.run(scheduler.run_once()) == 0
    assert len(calls) == 100


def test_schedulers_on_the_database_clock_fire_each_tick_once_whatever_their_hosts_clocks(
    postgres_database: str,
) -> None:
    # Three workers whose host clocks form a chain hours apart: on the database's clock they agree on
    # every tick. (On their own clocks the move-back above would have them fire each other's ticks.)
    app = App(postgres_database, migrate=True)
    try:
        now = app.backend.database_now()
        assert now is not None
        due = now.replace(second=0, microsecond=0)
        app.backend.schedules_upsert(SchedulesUpsertParams([Schedule("minute", "* * * * *", "t", "q", "{}", due)]))
        schedulers = [
            Scheduler(
                app.producer,
                BackendCalls(app.backend, Counters()),
                FixedClock(now + timedelta(hours=h)),
                database_time=True,
            )
            for h in (-2, 0, 2)
        ]

        async def passes() -> int:
            fired = 0
            for _ in range(3):
                fired += sum(await asyncio.gather(*(s.run_once() for s in schedulers)))
            return fired

        assert asyncio.run(passes()) == 1
        stored = app.backend.schedules_list()[0]
        assert stored.next_run_at == due + timedelta(minutes=1)
        assert _ticks(app) == [due.isoformat()]
    finally:
        app.close()


def test_the_warning_of_undeclared_schedules_names_ten_at_most(app: App, caplog: pytest.LogCaptureFixture) -> None:
    # A database holding 1,000 schedules another app declares: the warning was one line naming all 1,000.
    later = datetime(2100, 1, 1, tzinfo=UTC)
    app.backend.schedules_upsert(
        SchedulesUpsertParams([Schedule(f"s{i:04}", "0 3 * * *", "gone", "q", "{}", later) for i in range(1000)])
    )
    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        asyncio.run(_scheduler(app, FixedClock(later - timedelta(days=1))).declare())
    (line,) = [r.getMessage() for r in caplog.records if "not declared by this app" in r.getMessage()]
    named = ", ".join(f"'s{i:04}' (task 'gone')" for i in range(10))
    assert line.startswith(
        "1000 stored schedule(s) are not declared by this app, and their tasks are not registered in it: "
        f"{named} and 990 more (`conveyor schedules list`); "
    )


def test_a_stored_schedule_whose_step_is_now_refused_goes_on_firing_as_before(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    # Session 47 refuses "*/90" minutes for new schedules (cron fires it once an hour, not every 90 minutes); one an
    # earlier version stored must not stop firing on the upgrade: it fires hourly, as it did, and resumes so too.
    start = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    app.backend.schedules_upsert(SchedulesUpsertParams([Schedule("old", "*/90 * * * *", "t", "q", "{}", start)]))
    clock = FixedClock(start + timedelta(seconds=1))
    with caplog.at_level(logging.ERROR, logger="conveyor.worker"):
        assert asyncio.run(_scheduler(app, clock).run_once()) == 1
    assert not [r for r in caplog.records if "cannot fire" in r.getMessage()]
    assert app.backend.schedules_list()[0].next_run_at == start + timedelta(hours=1)
    app.admin.pause_schedule("old", actor="test")
    assert app.admin.resume_schedule("old", actor="test").next_run_at.minute == 0
