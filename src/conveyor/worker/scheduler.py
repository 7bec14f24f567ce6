"""The scheduler loop: fires periodic schedules, each tick exactly once however many workers run."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from conveyor._cron import Cron
from conveyor._errors import ConveyorError
from conveyor._limits import preview
from conveyor._message import Message
from conveyor._producer import Producer
from conveyor.backends.base import Schedule, ScheduleFireParams, ScheduleMoveParams, SchedulesUpsertParams
from conveyor.worker._calls import BackendCalls
from conveyor.worker._service import Service

log = logging.getLogger("conveyor.worker")

# A schedule's last_run_at further ahead of the referee clock than this was stored by a clock that has
# since gone back (a host or server clock stepped ahead, then corrected): it is not taken as fired, so
# the schedule's next tick can be moved back from where that clock put it. Nearer ones are believed.
CLOCK_STEP_LIMIT = timedelta(hours=1)

# How many stored schedules the start-up warning names (a database may hold thousands: one line, not a page).
_NAMED_AT_MOST = 10


class Scheduler(Service):
    """Every ``interval`` seconds, fires the schedules whose next tick is due.

    Correctness lives in the database, not in leadership: firing is a compare-and-set on the
    schedule's ``next_run_at`` in the same transaction as the job insert, so two schedulers that
    see the same due tick fire it once. The set also compares the definition read (cron, task,
    queue, payload, priority): a fire worked out from a schedule an operator changed since it was
    read matches nothing, and the next pass reads the schedule again and fires it as changed. After
    downtime only the latest missed tick fires (once, its job's ``tick`` header and the schedule's
    ``last_run_at`` that tick), and the next tick is computed from now, so a backlog of missed ticks
    is never replayed. The producer builds each tick's job exactly as a send would (task defaults,
    limits).

    One clock judges for every scheduler: with ``database_time`` (a worker that keeps the database's
    time), the database's, read at each pass; else ``clock``. A stored next tick later than the first
    tick after that clock's now (and after the last tick fired) was stored by a clock ahead of it (a
    host's clock stepped ahead, then back; a schedule declared on a host whose clock is ahead): it is
    moved back by the same compare-and-set, so the schedule is not silent until then. A last tick
    fired more than ``CLOCK_STEP_LIMIT`` ahead of now is not believed (its clock went back since)."""

    name = "scheduler"
    run_first = True

    def __init__(
        self,
        producer: Producer,
        calls: BackendCalls,
        clock: Callable[[], datetime],
        interval: float = 1.0,
        *,
        database_time: bool = False,
    ) -> None:
        super().__init__()
        self.producer = producer
        self.calls = calls
        self.clock = clock
        self.interval = interval
        self.database_time = database_time
        self._declared = False
        self._skipped: dict[str, datetime] = {}
        #: Per schedule, the stored (next tick, last tick) found right at ``now``: from a later now on it
        #: stays right (the first tick after a later now is no earlier), so it is not worked out again.
        self._checked: dict[str, tuple[datetime, datetime | None, datetime]] = {}
        #: Per schedule, the last tick this scheduler did not believe and moved the next tick back from.
        #: Found stored again, it was fired again by another scheduler's clock ahead of this one (a
        #: clock stepped back does not fire the same tick twice): it is believed from then on, or the
        #: two schedulers would fire it again and move it back at every pass (session 37's failure).
        self._disbelieved: dict[str, datetime] = {}

    async def declare(self) -> None:
        """Store the app's declared schedules (existing ones keep their pause state and next tick),
        and warn of stored schedules that neither this app declares nor its tasks would run."""
        catalogue = self.producer.catalogue
        declared = catalogue.schedules
        if declared:
            params = SchedulesUpsertParams(list(declared.values()))
            await self.calls.call(self.calls.backend.schedules_upsert, params, what="schedules")
        self._declared = True
        # Several apps may share a database, each with its own schedules, so a schedule this app does
        # not declare is not deleted: it is named, for an operator to remove if no app declares it any
        # more (its ticks keep firing jobs, which die unknown_task when no worker has the task).
        backend = self.calls.backend
        stored = await self.calls.call(lambda _: backend.schedules_list(), None, what="schedules")
        strangers = [s for s in stored if s.name not in declared and s.task not in catalogue.tasks]
        if strangers:
            named = ", ".join(
                f"{preview(s.name)} (task {preview(s.task)}{', paused' if s.paused else ''})"
                for s in strangers[:_NAMED_AT_MOST]
            )
            if len(strangers) > _NAMED_AT_MOST:
                named += f" and {len(strangers) - _NAMED_AT_MOST} more (`conveyor schedules list`)"
            log.warning(
                "%d stored schedule(s) are not declared by this app, and their tasks are not registered in it: %s; "
                "if no app declares one any more, remove it with `conveyor schedules remove NAME` "
                "(app.admin.remove_schedule), or it keeps enqueueing jobs on every tick",
                len(strangers),
                named,
            )

    async def run_once(self) -> int:
        """Fire every due tick; return how many this scheduler fired."""
        if not self._declared:
            await self.declare()
        fired = 0
        backend = self.calls.backend
        schedules = await self.calls.call(lambda _: backend.schedules_list(), None, what="schedules")
        if not schedules:
            return 0
        now = await self._now()
        for schedule in schedules:
            if schedule.paused:
                continue
            # One schedule that cannot fire (a bad cron, a name or payload past a limit, a statement
            # the database refuses) is logged and skipped: it must not block the schedules after it.
            # An unreachable database is not its fault: calls.call waits that out.
            try:
                if schedule.next_run_at > now:
                    await self._check_ahead(schedule, now)
                    continue
                fired += await self._fire(schedule, now)
            except (ConveyorError, ValueError) as exc:
                if self._skipped.get(schedule.name) != schedule.next_run_at:  # once per tick, not per second
                    self._skipped[schedule.name] = schedule.next_run_at
                    log.error("schedule %s cannot fire, skipped: %s", preview(schedule.name), exc)
        return fired

    async def _now(self) -> datetime:
        """The referee's time for this pass: the database's (read now) or this scheduler's clock."""
        if self.database_time:
            backend = self.calls.backend
            now = await self.calls.call(lambda _: backend.database_now(), None, what="database clock")
            if now is not None:
                return now
            self.database_time = False  # an engine without a clock of its own (SQLite): the host's is it
        return self.clock()

    async def _check_ahead(self, schedule: Schedule, now: datetime) -> None:
        """Move ``schedule``'s next tick back if a clock ahead of ``now`` stored it (see the class)."""
        stored, last = schedule.next_run_at, schedule.last_run_at
        checked = self._checked.get(schedule.name)
        if checked is not None and checked[:2] == (stored, last) and now >= checked[2]:
            return
        if last is not None and last > now + CLOCK_STEP_LIMIT and self._disbelieved.get(schedule.name) != last:
            last = None
        cron = Cron.parse(schedule.cron, stored=True)
        expected = cron.next_after(now if last is None or last < now else last)
        if stored <= expected:
            self._checked[schedule.name] = (stored, schedule.last_run_at, now)
            return
        params = ScheduleMoveParams(schedule, expected)
        if await self.calls.call(self.calls.backend.schedule_move, params, what="schedule move"):
            log.warning(
                "schedule %s: its next tick %s was stored by a clock ahead of this one (%s); moved back to %s",
                preview(schedule.name),
                stored.isoformat(),
                now.isoformat(),
                expected.isoformat(),
            )
            self._checked[schedule.name] = (expected, schedule.last_run_at, now)
            if schedule.last_run_at is not None and last is None:
                self._disbelieved[schedule.name] = schedule.last_run_at

    async def _fire(self, schedule: Schedule, now: datetime) -> int:
        cron = Cron.parse(schedule.cron, stored=True)
        due = schedule.next_run_at
        # After downtime the latest missed tick fires, for all of them; the compare-and-set is still
        # on the stored next tick, so that of several schedulers only one fires.
        tick = cron.latest_between(due, now) or due
        last = schedule.last_run_at
        if last is not None and tick <= last <= now + CLOCK_STEP_LIMIT:
            # A next tick stored by a clock behind the one that fired last (an operator's resume or cron
            # change from a host whose clock is behind): that tick fired already, so it is not fired
            # again; the next tick is moved on past it by the same compare-and-set.
            params_move = ScheduleMoveParams(schedule, cron.next_after(max(now, last)))
            await self.calls.call(self.calls.backend.schedule_move, params_move, what="schedule move")
            return 0
        message = Message(
            task=schedule.task,
            payload=json.loads(schedule.payload),
            queue=schedule.queue,
            priority=schedule.priority,
            headers={"schedule": schedule.name, "tick": tick.isoformat()},
        )
        job = self.producer.new_job(message, now)
        following = cron.next_after(now)
        params = ScheduleFireParams(schedule, following, job, now, fired_at=tick)
        if await self.calls.call(self.calls.backend.schedule_fire, params, what="schedule fire"):
            log.info("schedule %s fired tick %s as job %s", schedule.name, tick.isoformat(), job.id)
            self._checked[schedule.name] = (following, tick, now)
            return 1
        return 0
