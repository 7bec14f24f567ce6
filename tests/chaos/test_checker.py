"""The chaos checker on hand-made histories: it must catch each kind of broken promise, and accept
extra runs only when a fault explains them. (A checker that passes everything would make the chaos
runs assert nothing.)"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from . import mix_app as mix
from ._checker import Checker, Report, Row, Run, read_run_log

T0 = 1_000_000.0


def row(job: UUID, task: str = mix.FAST, **changes: Any) -> Row:
    fields: dict[str, Any] = {
        "id": job, "task": task, "state": "completed", "attempts": 1, "deliveries": 1, "reason": None,
        "error_type": None, "error_message": None, "result": {"n": 0}, "finished_at": T0 + 1, "worker_id": "h:1",
    }  # fmt: skip
    fields.update(changes)
    return Row(**fields)


def run(job: UUID, pid: int, start: float, end: float | None, task: str = mix.FAST, attempt: int = 1) -> Run:
    return Run(job, task, 1, attempt, pid, T0 + start, None if end is None else T0 + end, None if end is None else "ok")


def check(
    runs: Sequence[Run],
    rows: Sequence[Row],
    *,
    accepted: Sequence[UUID] | None = None,
    live: Sequence[Row] = (),
    events: Sequence[dict[str, Any]] = (),
    codes: dict[str, int | None] | None = None,
) -> Report:
    ids = accepted if accepted is not None else [r.id for r in rows]
    tasks = {r.id: r.task for r in rows}
    return Checker(
        runs=runs,
        accepted={i: (tasks.get(i, mix.FAST), 0) for i in ids},
        archive=rows,
        live=live,
        events=events,
        final_codes=codes if codes is not None else {"plain0": 0},
        t_start=T0,
        t_end=T0 + 100,
    ).check()


def fault(kind: str, t: float, t_end: float | None = None, pids: Sequence[int] = ()) -> dict[str, Any]:
    return {"kind": "fault", "fault": kind, "t": T0 + t, "t_end": T0 + (t if t_end is None else t_end), "pids": pids}


def test_a_clean_history_has_no_problems() -> None:
    a, b = uuid4(), uuid4()
    report = check([run(a, 1, 1, 1.1), run(b, 2, 1, 1.2)], [row(a), row(b)])
    assert report.problems() == []
    assert (report.accepted, report.terminal, report.runs, report.expected_runs) == (2, 2, 2, 2)


def test_lost_stuck_and_archived_twice() -> None:
    lost, stuck, twice = uuid4(), uuid4(), uuid4()
    report = check(
        [run(twice, 1, 1, 1.1)],
        [row(twice), row(twice)],
        accepted=[lost, stuck, twice],
        live=[row(stuck, state="processing")],
    )
    assert report.lost == [lost]
    assert report.stuck == [stuck]
    assert report.archived_twice == [twice]
    assert len(report.problems()) == 3


def test_an_extra_run_without_a_fault_is_unexplained() -> None:
    job = uuid4()
    report = check([run(job, 1, 1, 1.1), run(job, 2, 5, 5.1)], [row(job)])
    assert len(report.unexplained) == 1
    assert any("unexplained extra run" in p for p in report.problems())


def test_a_run_cut_short_by_a_kill_explains_the_extra_run() -> None:
    job = uuid4()
    runs = [run(job, 1, 1, None), run(job, 2, 6, 6.1)]
    report = check(runs, [row(job)], events=[fault("kill_worker", 2, pids=[1])])
    assert report.problems() == []
    assert report.extra_by_cause == {"worker SIGKILLed": 1}


def test_a_kill_of_another_worker_explains_nothing() -> None:
    job = uuid4()
    runs = [run(job, 1, 1, None), run(job, 2, 6, 6.1)]
    report = check(runs, [row(job)], events=[fault("kill_worker", 2, pids=[3])])
    assert len(report.unexplained) == 1


def test_a_crash_by_a_poison_job_explains_the_runs_it_took_down() -> None:
    job, poison = uuid4(), uuid4()
    runs = [run(job, 1, 1, None), run(poison, 1, 1.5, None, task=mix.CRASH), run(job, 2, 6, 6.1)]
    runs += [run(poison, 2, 7, None, task=mix.CRASH), run(poison, 3, 12, None, task=mix.CRASH)]
    rows = [
        row(job),
        row(poison, mix.CRASH, state="dead", attempts=0, reason="max_deliveries_exceeded", error_type="PoisonJob"),
    ]
    events = [{"kind": "process_exit", "t": T0 + 1.6, "pid": 1, "member": "plain0", "role": "worker", "rc": 1}]
    report = check(runs, rows, events=events)
    assert report.problems() == []
    assert report.crashes == 3
    assert report.extra_by_cause == {"worker crashed (os._exit in a poison job)": 1}


def test_a_worker_that_exits_on_its_own_is_a_problem() -> None:
    job = uuid4()
    events = [{"kind": "process_exit", "t": T0 + 2, "pid": 1, "member": "plain0", "role": "worker", "rc": 0}]
    report = check([run(job, 1, 1, 1.1)], [row(job)], events=events, codes={"plain0": 0, "prefork0": 1})
    assert report.unexpected_exits == ["pid 1 (plain0, worker) exited with 0"]
    problems = report.problems()
    assert any("without a fault" in p for p in problems)
    assert any("did not stop cleanly" in p and "prefork0" in p for p in problems)


def test_two_runs_at_once_are_allowed_only_after_a_lease_was_lost() -> None:
    job = uuid4()
    runs = [run(job, 1, 1, 8), run(job, 2, 5, 5.1)]
    assert len(check(runs, [row(job)]).overlaps) == 1
    stopped = check(runs, [row(job)], events=[fault("stop_worker", 2, 7, pids=[1])])
    assert stopped.problems() == []
    assert stopped.extra_by_cause == {"worker SIGSTOPped past its lease": 1}


def test_a_restart_explains_runs_in_flight_around_it_only() -> None:
    near, far = uuid4(), uuid4()
    runs = [run(near, 1, 9.5, 9.6), run(near, 2, 14, 14.1), run(far, 1, 1, 1.1), run(far, 2, 40, 40.1)]
    report = check(runs, [row(near), row(far)], events=[fault("pg_restart", 10, 10.5)])
    assert report.extra_by_cause == {"PostgreSQL restart (outcome lost / lease expired)": 1}
    assert len(report.unexplained) == 1 and str(far) in report.unexplained[0]


def test_outcomes_against_policy() -> None:
    good_dead, nul, flaky = uuid4(), uuid4(), uuid4()
    rows = [
        row(good_dead, state="dead", attempts=0, reason="max_deliveries_exceeded", error_type="PoisonJob"),
        row(nul, mix.NUL_RESULT, result="head-0\x00tail-0"),
        row(flaky, mix.FLAKY, attempts=3, error_type="TransientError"),
    ]
    runs = [
        run(good_dead, 1, 1, None),
        run(nul, 1, 1, 1.1, task=mix.NUL_RESULT),
        *(run(flaky, 1, 1 + k, 1.1 + k, task=mix.FLAKY, attempt=k + 1) for k in range(3)),
    ]
    report = check(runs, rows)
    assert len(report.good_dead) == 1
    assert any("NUL stored" in v for v in report.policy_violations)
    assert not any(str(flaky) in v for v in report.policy_violations)
    assert report.outcomes[(mix.FAST, "dead", "max_deliveries_exceeded")] == 1


def test_nul_text_must_be_kept_whole() -> None:
    cut, kept = uuid4(), uuid4()
    rows = [
        row(cut, mix.NUL_ERROR, state="dead", reason="permanent_error", error_type="ValueError",
            error_message="head-0", result=None),
        row(kept, mix.NUL_ERROR, state="dead", reason="permanent_error", error_type="ValueError",
            error_message="head-0\ufffdtail-0", result=None),
    ]  # fmt: skip
    runs = [run(cut, 1, 1, 1.1, task=mix.NUL_ERROR), run(kept, 1, 1, 1.1, task=mix.NUL_ERROR)]
    report = check(runs, rows)
    assert [v.split()[0] for v in report.policy_violations] == [str(cut)]


def test_a_poison_job_must_start_max_deliveries_plus_one_times() -> None:
    poison = uuid4()
    rows = [row(poison, mix.CRASH, state="dead", attempts=0, reason="max_deliveries_exceeded", error_type="PoisonJob")]
    runs = [run(poison, n, n * 5, None, task=mix.CRASH) for n in range(1, mix.CRASH_MAX_DELIVERIES + 1)]
    report = check(runs, rows)
    assert len(report.missing_runs) == 1  # dead-lettered before its last start: charged one it never made


def test_a_poison_start_cut_by_another_poison_jobs_crash_is_explained() -> None:
    # Two suspects counted in one statement: the other one's handler kills the process before this
    # one's handler logs its start. A death outside the job's life, or of its own process, explains nothing.
    poison, other = uuid4(), uuid4()
    dead = {"state": "dead", "attempts": 0, "reason": "max_deliveries_exceeded", "error_type": "PoisonJob"}
    rows = [row(poison, mix.CRASH, finished_at=T0 + 30, **dead), row(other, mix.CRASH, finished_at=T0 + 30, **dead)]
    mine = [run(poison, n, n * 5, None, task=mix.CRASH) for n in (1, 2)]
    theirs = [run(other, pid, start, None, task=mix.CRASH) for pid, start in ((7, 3), (8, 12), (9, 20))]
    report = check(mine + theirs, rows)
    assert (report.missing_runs, report.cut_starts) == ([], 1)
    late = [run(other, pid, start, None, task=mix.CRASH) for pid, start in ((7, 40), (8, 41), (9, 42))]
    report = check(mine + late, rows)
    assert len(report.missing_runs) == 1
    assert report.cut_starts == 0


def test_a_job_started_just_after_a_crash_began_lost_its_outcome_to_it() -> None:
    # The crashing handler records its start, then os._exit: another slot can start and finish a job
    # in between; its outcome, not yet flushed, dies with the process.
    job, poison = uuid4(), uuid4()
    runs = [run(poison, n, n * 5, None, task=mix.CRASH) for n in range(1, mix.CRASH_MAX_DELIVERIES + 2)]
    runs += [run(job, 1, 5.0001, 5.0002), run(job, 4, 20, 20.1)]
    rows = [
        row(job),
        row(poison, mix.CRASH, state="dead", attempts=0, reason="max_deliveries_exceeded", error_type="PoisonJob"),
    ]
    report = check(runs, rows)
    assert report.unexplained == []
    assert report.extra_by_cause == {"worker crashed (os._exit in a poison job)": 1}


def test_run_log_parsing(tmp_path: Path) -> None:
    job = uuid4()
    log = tmp_path / "runs.log"
    log.write_text(
        f"start {job} {mix.HANG} 1 1 7 100.5 -\n"
        f"start {job} {mix.HANG} 2 2 7 102.0 -\n"
        f"end {job} {mix.HANG} 2 2 7 102.1 ok\n"
        f"end {job} {mix.HANG} 1 1 7 120.5 ok\n"
        "garbage\n"
    )
    runs, malformed = read_run_log(log)
    assert malformed == 1
    assert [(r.attempt, r.start, r.end) for r in runs] == [(1, 100.5, 120.5), (2, 102.0, 102.1)]


def test_a_worker_whose_every_thread_hung_may_stop_itself() -> None:
    hangs = [uuid4() for _ in range(3)]
    rows = [row(h, mix.HANG, attempts=2, error_type="HandlerTimeout") for h in hangs]
    runs = [r for k, h in enumerate(hangs) for r in (
        run(h, 1, 1 + k, None, task=mix.HANG), run(h, 2, 3 + k, 3.1 + k, task=mix.HANG, attempt=2),
    )]  # fmt: skip
    exit_event = {"kind": "process_exit", "t": T0 + 8, "pid": 1, "member": "plain0", "role": "worker", "rc": 1}
    three_slots = Checker(
        runs=runs, accepted={h: (mix.HANG, 0) for h in hangs}, archive=rows, live=[], events=[exit_event],
        final_codes={"plain0": 0}, t_start=T0, t_end=T0 + 100, concurrency={"plain0": 3},
    ).check()  # fmt: skip
    assert (three_slots.stuck_exits, three_slots.unexpected_exits, three_slots.problems()) == (1, [], [])
    four_slots = check(runs, rows, events=[exit_event])  # 3 hung threads of 4: not stuck, a real exit
    assert four_slots.unexpected_exits == ["pid 1 (plain0, worker) exited with 1"]
