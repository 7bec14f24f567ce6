"""The scheduler loop: fires periodic schedules, each tick exactly once however many workers run."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime

from conveyor._cron import Cron
from conveyor._errors import ConveyorError
from conveyor._limits import preview
from conveyor._message import Message
from conveyor._producer import Producer
from conveyor.backends.base import Schedule, ScheduleFireParams, SchedulesUpsertParams
from conveyor.worker._calls import BackendCalls
from conveyor.worker._service import Service

log = logging.getLogger("conveyor.worker")


class Scheduler(Service):
    """Every ``interval`` seconds, fires the schedules whose next tick is due.

    Correctness lives in the database, not in leadership: firing is a compare-and-set on the
    schedule's ``next_run_at`` in the same transaction as the job insert, so two schedulers that
    see the same due tick fire it once. After downtime only the latest missed tick fires (once),
    and the next tick is computed from now, so a backlog of missed ticks is never replayed. The
    producer builds each tick's job exactly as a send would (task defaults, limits)."""

    name = "scheduler"
    run_first = True

    def __init__(
        self, producer: Producer, calls: BackendCalls, clock: Callable[[], datetime], interval: float = 1.0
    ) -> None:
        super().__init__()
        self.producer = producer
        self.calls = calls
        self.clock = clock
        self.interval = interval
        self._declared = False
        self._skipped: dict[str, datetime] = {}

    async def declare(self) -> None:
        """Store the app's declared schedules (existing ones keep their pause state and next tick)."""
        declared = self.producer.catalogue.schedules
        if declared:
            params = SchedulesUpsertParams(list(declared.values()))
            await self.calls.call(self.calls.backend.schedules_upsert, params, what="schedules")
        self._declared = True

    async def run_once(self) -> int:
        """Fire every due tick; return how many this scheduler fired."""
        if not self._declared:
            await self.declare()
        now = self.clock()
        fired = 0
        backend = self.calls.backend
        schedules = await self.calls.call(lambda _: backend.schedules_list(), None, what="schedules")
        for schedule in schedules:
            if schedule.paused or schedule.next_run_at > now:
                continue
            # One schedule that cannot fire (a bad cron, a name or payload past a limit, a statement
            # the database refuses) is logged and skipped: it must not block the schedules after it.
            # An unreachable database is not its fault: calls.call waits that out.
            try:
                fired += await self._fire(schedule, now)
            except (ConveyorError, ValueError) as exc:
                if self._skipped.get(schedule.name) != schedule.next_run_at:  # once per tick, not per second
                    self._skipped[schedule.name] = schedule.next_run_at
                    log.error("schedule %s cannot fire, skipped: %s", preview(schedule.name), exc)
        return fired

    async def _fire(self, schedule: Schedule, now: datetime) -> int:
        following = Cron.parse(schedule.cron).next_after(now)
        due = schedule.next_run_at
        message = Message(
            task=schedule.task,
            payload=json.loads(schedule.payload),
            queue=schedule.queue,
            priority=schedule.priority,
            headers={"schedule": schedule.name, "tick": due.isoformat()},
        )
        job = self.producer.new_job(message, now)
        params = ScheduleFireParams(schedule.name, due, following, job, now)
        if await self.calls.call(self.calls.backend.schedule_fire, params, what="schedule fire"):
            log.info("schedule %s fired tick %s as job %s", schedule.name, due.isoformat(), job.id)
            return 1
        return 0
