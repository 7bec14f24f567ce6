"""Cron schedules: declaring, listing, pausing, and firing each tick exactly once."""

from __future__ import annotations

import threading
from dataclasses import replace

from _factory import acquire, at, ids, new_job

from conveyor._cron import Cron
from conveyor.backends.base import (
    Backend,
    Schedule,
    ScheduleFireParams,
    ScheduleMoveParams,
    SchedulesDeleteParams,
    SchedulesUpdateParams,
    SchedulesUpsertParams,
)


def _schedule(name: str = "nightly", cron: str = "0 3 * * *", next_s: float = 60, **kw: object) -> Schedule:
    defined: dict[str, object] = {"task": "reports.build", "queue": "cron", "payload": '{"kind": "daily"}', **kw}
    return Schedule(name=name, cron=cron, next_run_at=at(next_s), **defined)  # type: ignore[arg-type]


def _by_name(backend: Backend) -> dict[str, Schedule]:
    return {s.name: s for s in backend.schedules_list()}


def _read(backend: Backend, name: str, due_s: float) -> Schedule:
    """``name`` as a scheduler reads it, with ``due_s`` as its next tick (a missing one as declared)."""
    stored = _by_name(backend).get(name)
    return _schedule(name) if stored is None else replace(stored, next_run_at=at(due_s))


def _fire(
    backend: Backend, name: str, due_s: float, after_s: float, fired_s: float | None = None
) -> tuple[bool, object]:
    job = new_job("cron", task="reports.build", run_at=at(due_s))
    fired_at = None if fired_s is None else at(fired_s)
    read = _read(backend, name, due_s)
    fired = backend.schedule_fire(
        ScheduleFireParams(schedule=read, next_run_at_after=at(after_s), job=job, now=at(due_s), fired_at=fired_at)
    )
    return fired, job.id


def _move(backend: Backend, name: str, due_s: float, to_s: float) -> bool:
    return backend.schedule_move(ScheduleMoveParams(_read(backend, name, due_s), at(to_s)))


def test_upsert_creates_and_list_returns_schedules_by_name(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("b"), _schedule("a", priority=5)]))

    listed = backend.schedules_list()

    assert [s.name for s in listed] == ["a", "b"]
    a = listed[0]
    assert (a.cron, a.task, a.queue, a.payload) == ("0 3 * * *", "reports.build", "cron", '{"kind": "daily"}')
    assert (a.next_run_at, a.paused, a.priority, a.last_run_at) == (at(60), False, 5, None)


def test_redeclaring_keeps_the_next_tick_unless_the_cron_changed(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("same", next_s=60), _schedule("changed", next_s=60)]))
    backend.schedules_update(SchedulesUpdateParams(name="same", paused=True))

    backend.schedules_upsert(
        SchedulesUpsertParams(
            [
                _schedule("same", next_s=999, priority=2),
                _schedule("changed", cron="*/5 * * * *", next_s=300),
            ]
        )
    )

    stored = _by_name(backend)
    assert stored["same"].next_run_at == at(60)
    assert stored["same"].paused is True  # pause state survives a re-declaration
    assert stored["same"].priority == 2
    assert (stored["changed"].cron, stored["changed"].next_run_at) == ("*/5 * * * *", at(300))


def test_update_pauses_resumes_and_reschedules(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("s")]))

    assert backend.schedules_update(SchedulesUpdateParams(name="s", paused=True)) is True
    assert _by_name(backend)["s"].paused is True
    assert backend.schedules_update(SchedulesUpdateParams(name="s", paused=False)) is True
    assert backend.schedules_update(SchedulesUpdateParams(name="s", cron="0 * * * *", next_run_at=at(3600))) is True
    s = _by_name(backend)["s"]
    assert (s.paused, s.cron, s.next_run_at) == (False, "0 * * * *", at(3600))
    assert backend.schedules_update(SchedulesUpdateParams(name="missing", paused=True)) is False


def test_delete_removes_a_schedule(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("s"), _schedule("t")]))

    assert backend.schedules_delete(SchedulesDeleteParams(name="s")) is True
    assert backend.schedules_delete(SchedulesDeleteParams(name="s")) is False
    assert list(_by_name(backend)) == ["t"]


def test_a_tick_fires_once_and_enqueues_its_job(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("s", next_s=60)]))

    fired, job_id = _fire(backend, "s", due_s=60, after_s=120)
    again, other_id = _fire(backend, "s", due_s=60, after_s=120)

    assert (fired, again) == (True, False)
    s = _by_name(backend)["s"]
    assert (s.next_run_at, s.last_run_at) == (at(120), at(60))
    assert ids(acquire(backend, queue="cron", now=at(60))) == [job_id]
    assert other_id != job_id


def test_last_run_at_is_the_tick_fired_not_the_stored_one(backend: Backend) -> None:
    """After downtime the scheduler fires the latest missed tick on the compare-and-set of the stored
    (oldest) one: last_run_at was that stored tick, not the one the job is for."""
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("s", next_s=60)]))

    fired, _ = _fire(backend, "s", due_s=60, after_s=300, fired_s=240)
    again, _ = _fire(backend, "s", due_s=60, after_s=300, fired_s=240)

    assert (fired, again) == (True, False)
    s = _by_name(backend)["s"]
    assert (s.next_run_at, s.last_run_at) == (at(300), at(240))


def test_a_paused_changed_or_missing_schedule_does_not_fire(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("paused", next_s=60), _schedule("moved", next_s=60)]))
    backend.schedules_update(SchedulesUpdateParams(name="paused", paused=True))
    backend.schedules_update(SchedulesUpdateParams(name="moved", next_run_at=at(90)))

    assert _fire(backend, "paused", due_s=60, after_s=120)[0] is False
    assert _fire(backend, "moved", due_s=60, after_s=120)[0] is False
    assert _fire(backend, "missing", due_s=60, after_s=120)[0] is False
    assert acquire(backend, queue="cron", now=at(1000)) == []


def test_concurrent_schedulers_fire_each_tick_once(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("s", next_s=60)]))
    barrier = threading.Barrier(6)
    results: list[bool] = []
    lock = threading.Lock()

    def scheduler() -> None:
        barrier.wait(timeout=30)
        fired, _ = _fire(backend, "s", due_s=60, after_s=120)
        with lock:
            results.append(fired)

    threads = [threading.Thread(target=scheduler) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(results) == [False] * 5 + [True]
    assert len(acquire(backend, queue="cron", now=at(60))) == 1


def test_a_move_sets_the_next_tick_back_on_the_same_compare_and_set_as_a_fire(backend: Backend) -> None:
    backend.schedules_upsert(
        SchedulesUpsertParams([_schedule("s", next_s=86_400), _schedule("paused", next_s=86_400), _schedule("other")])
    )
    backend.schedules_update(SchedulesUpdateParams(name="paused", paused=True))

    assert _move(backend, "s", 86_400, 120) is True
    assert _move(backend, "s", 86_400, 60) is False  # that tick is gone
    assert _move(backend, "paused", 86_400, 120) is False
    assert _move(backend, "missing", 86_400, 120) is False

    stored = _by_name(backend)
    assert (stored["s"].next_run_at, stored["s"].last_run_at) == (at(120), None)  # moved, nothing fired
    assert stored["paused"].next_run_at == at(86_400)
    assert stored["other"].next_run_at == at(60)
    assert acquire(backend, queue="cron", now=at(100_000)) == []
    # The moved tick fires as any other; a fire or move of the tick it replaced matches nothing.
    assert _fire(backend, "s", due_s=86_400, after_s=86_460)[0] is False
    assert _fire(backend, "s", due_s=120, after_s=180)[0] is True


def test_concurrent_moves_and_fires_of_one_tick_change_it_once(backend: Backend) -> None:
    backend.schedules_upsert(SchedulesUpsertParams([_schedule("s", next_s=60)]))
    barrier = threading.Barrier(6)
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def scheduler(i: int) -> None:
        barrier.wait(timeout=30)
        if i % 2:
            done = ("fire", _fire(backend, "s", due_s=60, after_s=120)[0])
        else:
            done = ("move", _move(backend, "s", 60, 30))
        with lock:
            results.append(done)

    threads = [threading.Thread(target=scheduler, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert [ok for _, ok in results].count(True) == 1
    winner = next(kind for kind, ok in results if ok)
    stored = _by_name(backend)["s"]
    jobs = acquire(backend, queue="cron", now=at(60))
    if winner == "fire":
        assert (stored.next_run_at, len(jobs)) == (at(120), 1)
    else:
        assert (stored.next_run_at, stored.last_run_at, jobs) == (at(30), None, [])


def test_a_fire_or_move_worked_out_from_a_definition_changed_since_its_read_matches_nothing(backend: Backend) -> None:
    """Before, the compare-and-set was on next_run_at alone (found by a sweep): `* * * * *` due 12:01,
    changed to `1 * * * *` (whose next tick is 12:01 too) between a scheduler's read and its fire, fired
    the old definition's job and stored 12:02, the old cron's next tick, so 12:02 fired as well. A new
    task, queue, payload or priority re-declared with the same cron (its next tick kept) alike."""
    every_minute = "* * * * *"
    changed = ("cron", "task", "queue", "payload", "priority", "moved")
    backend.schedules_upsert(SchedulesUpsertParams([_schedule(name, cron=every_minute) for name in (*changed, "same")]))
    read = _by_name(backend)
    # The operator's changes, between the scheduler's read and its fire or move.
    for name in ("cron", "moved"):
        assert backend.schedules_update(SchedulesUpdateParams(name, cron="1 * * * *", next_run_at=at(60)))
    backend.schedules_upsert(
        SchedulesUpsertParams(
            [
                _schedule("task", cron=every_minute, next_s=999, task="reports.other"),
                _schedule("queue", cron=every_minute, next_s=999, queue="cron-2"),
                _schedule("payload", cron=every_minute, next_s=999, payload='{"kind": "weekly"}'),
                _schedule("priority", cron=every_minute, next_s=999, priority=3),
                _schedule("same", cron=every_minute, next_s=999),  # re-declared as it was: no change
            ]
        )
    )

    def fire(schedule: Schedule) -> bool:
        job = new_job(schedule.queue, task=schedule.task, run_at=at(60))
        following = Cron.parse(schedule.cron).next_after(at(60))
        return backend.schedule_fire(ScheduleFireParams(schedule, following, job, now=at(60)))

    assert {name: fire(read[name]) for name in changed if name != "moved"} == dict.fromkeys(changed[:-1], False)
    assert backend.schedule_move(ScheduleMoveParams(read["moved"], at(30))) is False
    assert fire(read["same"]) is True

    stored = _by_name(backend)
    for name in changed:
        # Nothing fired, and the next tick is still the one the new definition was stored with.
        assert (stored[name].next_run_at, stored[name].last_run_at) == (at(60), None), name
    assert Cron.parse(stored["cron"].cron).next_after(at(0)) == stored["cron"].next_run_at
    assert len(acquire(backend, queue="cron", now=at(60))) == 1  # the unchanged schedule's job
    assert acquire(backend, queue="cron-2", now=at(60)) == []
    # Read again, the tick fires as the schedule now is: its next tick is the new expression's.
    assert fire(stored["cron"]) is True
    assert fire(stored["queue"]) is True
    after = _by_name(backend)
    assert (after["cron"].next_run_at, after["cron"].last_run_at) == (at(3660), at(60))
    assert [j.task for j in acquire(backend, queue="cron-2", now=at(60))] == ["reports.build"]
