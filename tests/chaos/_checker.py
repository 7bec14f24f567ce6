"""The checker: reads the whole history of a chaos run and says what went wrong, if anything.

Its inputs are three independent records of the same run:

- the handlers' own run log (``mix_app``): every run that started, where, when, and how it ended;
- Conveyor's tables, read at the end: every job's final state, attempts, reason, error and result
  (SQL on the throwaway cluster; the hostile jobs also through the public ``App.job``);
- the harness's events: the faults it injected and every worker process it saw start and exit.

It establishes:

- **lost**: an accepted job (the producer got its id back) that is in neither table;
- **stuck**: an accepted job still live once the run had drained;
- **policy**: every job ended as its task's policy says (``POLICIES``), and no good job is dead;
- **extra runs explained**: a job ran more often than its recorded attempts (``runs > attempts``)
  only if enough of its runs are tied to a fault: the worker running it was SIGKILLed or crashed
  during the run, it was SIGSTOPped past its lease, or the run was in flight around a database
  restart or a connection cut (an outcome lost in the crash, or a lease that expired meanwhile);
- **no double execution**: two runs of one job overlap in time only if one of them had lost its
  lease to a fault (or is a timed-out handler whose thread was abandoned);
- **no worker died on its own**: every worker process exit is a fault or a crashing job, and every
  worker stopped with exit code 0 at the end.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from . import mix_app as mix

#: A run that ended this long before its worker died may still have lost its outcome: it sat in
#: the worker's completer, unflushed, when the worker died (or stopped).
FLUSH_MARGIN = 2.0
#: Outcomes commit asynchronously (``synchronous_commit=off`` on Conveyor's outcome connections):
#: an immediate restart forgets the ones committed in about the last 3 x wal_writer_delay (600 ms).
ASYNC_COMMIT_MARGIN = 1.5
#: After a fault, how long a worker may go on starting jobs whose lease it has lost without
#: knowing it: a buffered job rescued elsewhere is started before the next heartbeat notices, and
#: after an outage the heartbeat's retries back off up to 5 s.
LEASE_LAG = 8.0

CAUSES = {
    "kill_worker": "worker SIGKILLed",
    "kill_child": "prefork child SIGKILLed",
    "kill_tree": "prefork tree SIGKILLed",
    "crash": "worker crashed (os._exit in a poison job)",
    "stop_worker": "worker SIGSTOPped past its lease",
    "pg_restart": "PostgreSQL restart (outcome lost / lease expired)",
    "proxy_cut": "connections cut (outcome lost / lease expired)",
    "stuck": "worker stopped itself: every slot's thread hung past its timeout",
    "exit": "worker exited on its own (unexpected)",
}
#: Causes under which a worker may run a job whose lease it no longer holds (so another worker
#: may run it at the same time).
LEASE_LOSS = {"stop_worker", "pg_restart", "proxy_cut", "exit"}
#: A crashing handler records its start, then calls os._exit: the process is gone within this much.
CRASH_LAG = 0.5
#: A worker that exits on its own may have stopped flushing outcomes long before it exits (a dead
#: completer, then a graceful stop of up to --graceful-timeout, 10 s in these runs).
EXIT_MARGIN = 15.0


@dataclass(frozen=True)
class Policy:
    """How a job of one task must end."""

    state: str
    reason: str | None
    attempts: int
    error_type: str | None
    #: A good job: it must never be dead-lettered.
    good: bool
    #: Where the handler put a NUL character that the stored text must not hold: result or error.
    nul: str | None = None


POLICIES: dict[str, Policy] = {
    mix.FAST: Policy("completed", None, 1, None, good=True),
    mix.LONG: Policy("completed", None, 1, None, good=True),
    mix.FLAKY: Policy("completed", None, mix.FLAKY_FAILURES + 1, "TransientError", good=True),
    mix.DOOMED: Policy("dead", "max_attempts_exceeded", mix.MAX_ATTEMPTS, "TransientError", good=False),
    mix.PERMANENT: Policy("dead", "permanent_error", 1, "ValueError", good=False),
    mix.NUL_RESULT: Policy("completed", None, 1, None, good=True, nul="result"),
    mix.NUL_ERROR: Policy("dead", "permanent_error", 1, "ValueError", good=False, nul="error"),
    mix.NUL_FLAKY: Policy("completed", None, 2, "TransientError", good=True, nul="error"),
    mix.SYSTEM_EXIT: Policy("completed", None, 2, "SystemExit", good=True),
    mix.KEYBOARD: Policy("completed", None, 2, "KeyboardInterrupt", good=True),
    mix.CRASH: Policy("dead", "max_deliveries_exceeded", 0, "PoisonJob", good=False),
    mix.HANG: Policy("completed", None, 2, "HandlerTimeout", good=True),
}


@dataclass
class Run:
    """One handler run, from the run log."""

    job: UUID
    task: str
    deliveries: int
    attempt: int
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None


@dataclass(frozen=True)
class Row:
    """A job as Conveyor's tables hold it at the end."""

    id: UUID
    task: str
    state: str
    attempts: int
    deliveries: int
    reason: str | None
    error_type: str | None
    error_message: str | None
    result: Any
    finished_at: float | None
    worker_id: str | None


def read_run_log(path: Path) -> tuple[list[Run], int]:
    """The runs in a run log, and how many lines did not parse."""
    runs: list[Run] = []
    open_runs: dict[tuple[UUID, int, int], list[Run]] = defaultdict(list)
    malformed = 0
    if not path.exists():
        return runs, 0
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) != 8 or parts[0] not in ("start", "end"):
                malformed += 1
                continue
            try:
                job, task, deliveries, attempt = UUID(parts[1]), parts[2], int(parts[3]), int(parts[4])
                pid, t = int(parts[5]), float(parts[6])
            except ValueError:
                malformed += 1
                continue
            key = (job, pid, attempt)
            if parts[0] == "start":
                run = Run(job, task, deliveries, attempt, pid, t)
                runs.append(run)
                open_runs[key].append(run)
            elif open_runs[key]:
                # Oldest first: the same attempt may run twice in one process only when the first
                # run's thread was abandoned (a timed-out handler) and its outcome was then lost.
                run = open_runs[key].pop(0)
                run.end, run.outcome = t, parts[7]
            else:
                malformed += 1
    return runs, malformed


@dataclass
class Death:
    """How and when a worker process ended."""

    t: float
    cause: str
    detail: str = ""


@dataclass
class Report:
    """What the checker found; :meth:`problems` is empty when the run kept every promise."""

    accepted: int = 0
    terminal: int = 0
    lost: list[UUID] = field(default_factory=list)
    stuck: list[UUID] = field(default_factory=list)
    archived_twice: list[UUID] = field(default_factory=list)
    live_and_archived: list[UUID] = field(default_factory=list)
    unacknowledged: int = 0
    policy_violations: list[str] = field(default_factory=list)
    good_dead: list[str] = field(default_factory=list)
    outcomes: Counter[tuple[str, str, str | None]] = field(default_factory=Counter)
    runs: int = 0
    expected_runs: int = 0
    extra_by_cause: Counter[str] = field(default_factory=Counter)
    unexplained: list[str] = field(default_factory=list)
    missing_runs: list[str] = field(default_factory=list)
    #: Counted starts of poison jobs that another process death cut before the handler logged them.
    cut_starts: int = 0
    overlaps: list[str] = field(default_factory=list)
    malformed_lines: int = 0
    faults: list[dict[str, Any]] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    crashes: int = 0
    stuck_exits: int = 0
    final_codes: dict[str, int | None] = field(default_factory=dict)
    orphan_runs: list[str] = field(default_factory=list)
    t_start: float = 0.0
    t_end: float = 0.0
    window: float = 5.0
    throughput: list[tuple[float, float]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def problems(self) -> list[str]:
        out: list[str] = []

        def some(items: Sequence[Any], limit: int = 10) -> str:
            shown = ", ".join(str(i) for i in items[:limit])
            return shown + (f" ... ({len(items)} in all)" if len(items) > limit else "")

        if self.lost:
            out.append(f"{len(self.lost)} accepted job(s) lost: {some(self.lost)}")
        if self.stuck:
            out.append(f"{len(self.stuck)} job(s) stuck (still live after the drain): {some(self.stuck)}")
        if self.archived_twice:
            out.append(f"{len(self.archived_twice)} job(s) archived twice: {some(self.archived_twice)}")
        if self.live_and_archived:
            out.append(f"{len(self.live_and_archived)} job(s) both live and archived: {some(self.live_and_archived)}")
        if self.good_dead:
            out.append(f"{len(self.good_dead)} good job(s) dead-lettered: {some(self.good_dead, 5)}")
        if self.policy_violations:
            out.append(f"{len(self.policy_violations)} outcome(s) not as policy: {some(self.policy_violations, 8)}")
        if self.unexplained:
            out.append(f"{len(self.unexplained)} unexplained extra run(s): {some(self.unexplained, 5)}")
        if self.missing_runs:
            out.append(f"{len(self.missing_runs)} job(s) with fewer runs than recorded: {some(self.missing_runs, 5)}")
        if self.overlaps:
            out.append(f"{len(self.overlaps)} job(s) ran twice at once under one lease: {some(self.overlaps, 5)}")
        if self.orphan_runs:
            out.append(f"{len(self.orphan_runs)} run(s) of jobs the queue does not know: {some(self.orphan_runs)}")
        if self.unexpected_exits:
            out.append(f"{len(self.unexpected_exits)} worker exit(s) without a fault: {some(self.unexpected_exits, 5)}")
        bad_codes = {k: v for k, v in self.final_codes.items() if v != 0}
        if bad_codes:
            out.append(f"workers did not stop cleanly at the end (exit codes): {bad_codes}")
        if self.malformed_lines:
            out.append(f"{self.malformed_lines} malformed run-log line(s)")
        return out

    # -- presentation ----------------------------------------------------------------------------

    def fault_counts(self) -> Counter[str]:
        return Counter(f["fault"] for f in self.faults)

    def format(self) -> str:
        lines: list[str] = []
        add = lines.append
        extra_total = sum(self.extra_by_cause.values()) + len(self.unexplained)
        add(
            f"jobs: {self.accepted:,} accepted, {self.terminal:,} terminal, lost {len(self.lost)}, "
            f"stuck {len(self.stuck)}, archived twice {len(self.archived_twice)}, "
            f"unacknowledged sends {self.unacknowledged}"
        )
        add(
            f"handler runs: {self.runs:,} ({self.expected_runs:,} recorded attempts or poison starts, "
            f"{extra_total:,} extra, {self.cut_starts} poison start(s) cut by another death); "
            f"worker crashes by poison jobs: {self.crashes}; "
            f"workers stopped by hung threads: {self.stuck_exits}"
        )
        add("")
        add(f"{'fault injected':<22}{'count':>6}  detail")
        counts = self.fault_counts()
        for kind, n in sorted(counts.items()):
            add(f"{kind:<22}{n:>6}  {self._fault_detail(kind)}")
        add("")
        add(f"{'extra runs by cause':<52}{'runs':>6}")
        for cause, n in self.extra_by_cause.most_common():
            add(f"{cause:<52}{n:>6}")
        add(f"{'unexplained':<52}{len(self.unexplained):>6}")
        add("")
        add(f"{'task':<26}{'state':<11}{'reason':<25}{'jobs':>8}")
        for (task, state, reason), n in sorted(self.outcomes.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            add(f"{task:<26}{state:<11}{reason or '-':<25}{n:>8}")
        problems = self.problems()
        add("")
        add("problems: " + ("none" if not problems else ""))
        lines.extend(f"  - {p}" for p in problems)
        return "\n".join(lines)

    def _fault_detail(self, kind: str) -> str:
        items = [f for f in self.faults if f["fault"] == kind]
        if kind == "pg_restart":
            downs = [f["t_end"] - f["t"] for f in items]
            return f"restart took {min(downs):.1f}-{max(downs):.1f} s"
        if kind == "stop_worker":
            spans = [f["t_end"] - f["t"] for f in items]
            return f"stopped {min(spans):.1f}-{max(spans):.1f} s"
        if kind == "proxy_cut":
            return "connections cut: " + ", ".join(str(f.get("connections", 0)) for f in items)
        if kind == "vacuum_blocker":
            return "held " + ", ".join(f"{f['t_end'] - f['t']:.0f} s" for f in items)
        pids = [len(f.get("pids", [])) for f in items]
        return f"{sum(pids)} process(es)"

    def format_throughput(self) -> str:
        """Jobs finished per second in each window, with the faults active in it."""
        lines = [f"{'window (s)':<14}{'jobs/s':>9}  faults"]
        for start, rate in self.throughput:
            t0, t1 = self.t_start + start, self.t_start + start + self.window
            active = sorted({f["fault"] for f in self.faults if f["t"] < t1 and max(f["t_end"], f["t"]) >= t0})
            lines.append(f"{start:>5.0f}-{start + self.window:<7.0f}{rate:>9.0f}  {', '.join(active)}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "terminal": self.terminal,
            "lost": len(self.lost),
            "stuck": len(self.stuck),
            "archived_twice": len(self.archived_twice),
            "unacknowledged": self.unacknowledged,
            "policy_violations": len(self.policy_violations),
            "good_dead": len(self.good_dead),
            "runs": self.runs,
            "expected_runs": self.expected_runs,
            "extra_by_cause": dict(self.extra_by_cause),
            "unexplained": len(self.unexplained),
            "overlaps": len(self.overlaps),
            "unexpected_exits": self.unexpected_exits,
            "cut_starts": self.cut_starts,
            "crashes": self.crashes,
            "stuck_exits": self.stuck_exits,
            "final_codes": self.final_codes,
            "faults": dict(self.fault_counts()),
            "outcomes": [[t, s, r, n] for (t, s, r), n in sorted(self.outcomes.items(), key=str)],
            "throughput": self.throughput,
            "recoveries": self.recoveries,
            "problems": self.problems(),
            **self.extra,
        }


def _text_of(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _nul_problem(text: str | None, n: int) -> str | None:
    """Why ``text`` is not the handler's ``head-N<NUL>tail-N`` made storable (None if it is)."""
    if text is None:
        return "no text stored"
    if "\x00" in text:
        return "NUL stored"
    if f"head-{n}" not in text or f"tail-{n}" not in text:
        return f"text not kept whole: {text[:80]!r}"
    return None


def check_policy(row: Row, payload_n: int | None, runs: Sequence[Run]) -> list[str]:
    """Where one terminal job differs from its task's policy."""
    policy = POLICIES.get(row.task)
    if policy is None:
        return [f"{row.id} {row.task}: unknown task"]
    got = (row.state, row.reason, row.attempts, row.error_type)
    want = (policy.state, policy.reason, policy.attempts, policy.error_type)
    out = []
    if got != want:
        out.append(f"{row.id} {row.task}: (state, reason, attempts, error) {got}, expected {want}")
    if policy.nul is not None and payload_n is not None:
        text = _text_of(row.result) if policy.nul == "result" else row.error_message
        why = _nul_problem(text, payload_n)
        if why is not None:
            out.append(f"{row.id} {row.task}: {policy.nul} {why}")
    if row.task != mix.CRASH and runs:
        top = max(r.attempt for r in runs)
        if top != row.attempts:
            out.append(f"{row.id} {row.task}: handlers saw attempt {top} but {row.attempts} attempt(s) recorded")
    return out


class Checker:
    """Cross-checks one run's three histories (see the module docstring)."""

    def __init__(
        self,
        *,
        runs: Sequence[Run],
        accepted: Mapping[UUID, tuple[str, int]],
        archive: Sequence[Row],
        live: Sequence[Row],
        events: Iterable[dict[str, Any]],
        final_codes: Mapping[str, int | None],
        t_start: float,
        t_end: float,
        malformed_lines: int = 0,
        worker_logs: str = "",
        window: float = 5.0,
        concurrency: Mapping[str, int] | None = None,
    ) -> None:
        self.runs = list(runs)
        self.accepted = dict(accepted)
        self.archive = list(archive)
        self.live = list(live)
        self.events = list(events)
        self.final_codes = dict(final_codes)
        self.t_start = t_start
        self.t_end = t_end
        self.malformed_lines = malformed_lines
        self.worker_logs = worker_logs
        self.window = window
        #: Handler slots of each worker process, by fleet member name.
        self.concurrency = dict(concurrency or {})
        self.faults = sorted((e for e in self.events if e["kind"] == "fault"), key=lambda e: e["t"])
        self.deaths: dict[int, Death] = {}

    def check(self) -> Report:
        report = Report(
            t_start=self.t_start,
            t_end=self.t_end,
            malformed_lines=self.malformed_lines,
            final_codes=self.final_codes,
            faults=self.faults,
            window=self.window,
        )
        self._deaths(report)
        rows = self._jobs(report)
        self._runs(report, rows)
        self._series(report)
        return report

    # -- worker processes ----------------------------------------------------------------------

    def _deaths(self, report: Report) -> None:
        for fault in self.faults:
            if fault["fault"] in ("kill_worker", "kill_child", "kill_tree"):
                for pid in fault.get("pids", []):
                    self.deaths.setdefault(pid, Death(fault["t"], fault["fault"]))
        for run in self.runs:
            if run.task == mix.CRASH:
                report.crashes += 1
                self.deaths.setdefault(run.pid, Death(run.start, "crash", str(run.job)))
        child_codes = {
            int(m.group(1)): m.group(2)
            for m in re.finditer(r"worker process (\d+) exited with (-?\d+); restarting it", self.worker_logs)
        }
        for event in self.events:
            if event["kind"] != "process_exit" or event.get("role") == "final":
                continue
            pid = event["pid"]
            if pid in self.deaths:
                continue
            rc = event.get("rc")
            if rc is None:
                rc = child_codes.get(pid)
            if self._stuck(pid, event["t"], self.concurrency.get(event["member"], 4)):
                self.deaths[pid] = Death(event["t"], "stuck", f"rc {rc}")
                report.stuck_exits += 1
                continue
            self.deaths[pid] = Death(event["t"], "exit", f"rc {rc}")
            report.unexpected_exits.append(f"pid {pid} ({event['member']}, {event['role']}) exited with {rc}")

    def _stuck(self, pid: int, t_exit: float, concurrency: int) -> bool:
        """Whether, before ``t_exit``, as many handler threads of ``pid`` hung past their timeout at
        once as it has slots: the worker then stops itself (non-zero) for its supervisor to restart."""
        edges: list[tuple[float, int]] = []
        for run in self.runs:
            if run.pid != pid or run.task != mix.HANG or run.attempt != 1:
                continue
            stuck_from = run.start + mix.HANG_TIMEOUT
            if stuck_from > t_exit:
                continue
            edges += [(stuck_from, 1), (min(run.end if run.end is not None else t_exit, t_exit), -1)]
        level = 0
        for _t, step in sorted(edges, key=lambda e: (e[0], -e[1])):
            level += step
            if level >= concurrency:
                return True
        return False

    # -- jobs ------------------------------------------------------------------------------------

    def _jobs(self, report: Report) -> dict[UUID, Row]:
        archived = Counter(r.id for r in self.archive)
        report.archived_twice = sorted(i for i, n in archived.items() if n > 1)
        live_ids = {r.id for r in self.live}
        rows = {r.id: r for r in self.archive}
        report.live_and_archived = sorted(live_ids & set(rows))
        report.accepted = len(self.accepted)
        report.terminal = sum(1 for i in self.accepted if i in rows and i not in live_ids)
        report.lost = sorted(i for i in self.accepted if i not in rows and i not in live_ids)
        report.stuck = sorted(i for i in self.accepted if i in live_ids)
        report.unacknowledged = len((set(rows) | live_ids) - set(self.accepted))
        return rows

    # -- runs ------------------------------------------------------------------------------------

    def causes(self, run: Run) -> list[str]:
        """The faults that can explain this run having been wasted (its outcome never recorded)."""
        out: list[str] = []
        death = self.deaths.get(run.pid)
        margin = EXIT_MARGIN if death is not None and death.cause in ("exit", "stuck") else FLUSH_MARGIN
        # A crash is stamped when the crashing handler starts; the process dies a moment later, so
        # another slot may still start (and finish, unflushed) a job in between.
        grace = CRASH_LAG if death is not None and death.cause == "crash" else 0.0
        if death is not None and run.start <= death.t + grace and (run.end is None or run.end >= death.t - margin):
            is_own_crash = death.cause == "crash" and run.task == mix.CRASH
            if not is_own_crash:
                out.append(death.cause)
        for fault in self.faults:
            kind, t0, t1 = fault["fault"], fault["t"], fault["t_end"]
            if kind == "stop_worker":
                if run.pid in fault.get("pids", []) and self._in_flight(run, t0 - FLUSH_MARGIN, t1 + LEASE_LAG):
                    out.append(kind)
            elif kind == "pg_restart":
                if self._in_flight(run, t0 - ASYNC_COMMIT_MARGIN, t1 + LEASE_LAG):
                    out.append(kind)
            elif kind == "proxy_cut" and self._in_flight(run, t0 - ASYNC_COMMIT_MARGIN, t1 + LEASE_LAG):
                out.append(kind)
        return out

    def _end_of(self, run: Run) -> float:
        if run.end is not None:
            return run.end
        if run.task == mix.HANG and run.attempt == 1:
            return run.start + mix.HANG_TIMEOUT
        death = self.deaths.get(run.pid)
        return death.t if death is not None and death.t >= run.start else self.t_end

    def _in_flight(self, run: Run, t0: float, t1: float) -> bool:
        """Whether the run (from its start until its outcome could have been flushed) meets [t0, t1]."""
        return run.start <= t1 and self._end_of(run) >= t0

    def _runs(self, report: Report, rows: Mapping[UUID, Row]) -> None:
        by_job: dict[UUID, list[Run]] = defaultdict(list)
        for run in self.runs:
            by_job[run.job].append(run)
        report.runs = len(self.runs)
        known = set(rows) | {r.id for r in self.live}
        for job, runs in by_job.items():
            if job not in known:
                report.orphan_runs.extend(f"{job} {r.task} pid {r.pid}" for r in runs)
        priority = list(CAUSES)
        for job_id, row in rows.items():
            runs = sorted(by_job.get(job_id, []), key=lambda r: r.start)
            payload_n = self.accepted.get(job_id, (row.task, None))[1]
            violations = check_policy(row, payload_n, runs)
            report.policy_violations.extend(violations)
            report.outcomes[(row.task, row.state, row.reason)] += 1
            policy = POLICIES.get(row.task)
            if policy is not None and policy.good and row.state == "dead":
                report.good_dead.append(f"{job_id} {row.task} ({row.reason}, {row.error_type})")
            # A poison job's first crash is not counted (nothing suspects it until rescue returns it);
            # every later start is, before it runs: it starts max_deliveries + 1 times in all.
            expected = mix.CRASH_MAX_DELIVERIES + 1 if row.task == mix.CRASH else row.attempts
            report.expected_runs += min(expected, len(runs))
            extra = len(runs) - expected
            if extra < 0 and row.task == mix.CRASH and -extra <= len(self._cutters(row, runs)):
                report.cut_starts += -extra
                continue
            if extra < 0:
                report.missing_runs.append(f"{job_id} {row.task}: {len(runs)} run(s), expected {expected}")
                continue
            explained = [(r, self.causes(r)) for r in runs]
            if extra > 0:
                usable = sorted(
                    (min(causes, key=priority.index) for _r, causes in explained if causes), key=priority.index
                )
                for cause in usable[:extra]:
                    report.extra_by_cause[CAUSES[cause]] += 1
                if len(usable) < extra:
                    detail = "; ".join(
                        f"pid {r.pid} {r.start - self.t_start:.2f}-"
                        f"{'?' if r.end is None else f'{r.end - self.t_start:.2f}'} {r.outcome}"
                        for r in runs
                    )
                    report.unexplained.append(
                        f"{job_id} {row.task}: {len(runs)} runs, {expected} expected, "
                        f"{len(usable)} explained [{detail}]"
                    )
            self._overlaps(report, job_id, row, explained)

    def _cutters(self, row: Row, runs: Sequence[Run]) -> list[int]:
        """The processes, none of them running this poison job, that died (killed, or crashed by another
        poison job) while it was alive: each may have held one of its counted starts. A suspect is counted
        before its handler's first statement, and slots start together (their counts share a statement),
        so another slot's crash can end the process between the count and the run it never logged."""
        own = {r.pid for r in runs}
        t0 = runs[0].start if runs else self.t_start
        t1 = row.finished_at if row.finished_at is not None else self.t_end
        return [
            pid
            for pid, death in self.deaths.items()
            if pid not in own and death.cause != "exit" and t0 <= death.t <= t1
        ]

    def _overlaps(self, report: Report, job_id: UUID, row: Row, explained: list[tuple[Run, list[str]]]) -> None:
        for i, (a, a_causes) in enumerate(explained):
            for b, b_causes in explained[i + 1 :]:
                if b.start >= self._end_of(a):
                    continue
                if LEASE_LOSS & (set(a_causes) | set(b_causes)):
                    continue
                timed_out = a.task == mix.HANG and a.attempt == 1 and b.start >= a.start + mix.HANG_TIMEOUT
                if timed_out:
                    continue
                report.overlaps.append(
                    f"{job_id} {row.task}: pid {a.pid} from {a.start - self.t_start:.2f} and "
                    f"pid {b.pid} from {b.start - self.t_start:.2f}"
                )

    # -- throughput ------------------------------------------------------------------------------

    def _series(self, report: Report) -> None:
        finished = sorted(r.finished_at for r in self.archive if r.finished_at is not None)
        if not finished:
            return
        last = finished[-1]
        buckets = Counter(int((t - self.t_start) // self.window) for t in finished if t >= self.t_start)
        n = int((last - self.t_start) // self.window) + 1
        report.throughput = [(i * self.window, buckets.get(i, 0) / self.window) for i in range(n)]
        per_second = Counter(int(t - self.t_start) for t in finished if t >= self.t_start)
        for fault in self.faults:
            if fault["fault"] != "pg_restart":
                continue
            report.recoveries.append(recovery(fault, finished, per_second, self.t_start))


def recovery(
    fault: Mapping[str, Any], finished: Sequence[float], per_second: Counter[int], t0: float
) -> dict[str, Any]:
    """How a restart hurt: downtime, the first job finished after it, and when the per-second
    finish rate was back to half the median of the 10 s before it."""
    t, t_end = fault["t"], fault["t_end"]
    before = [per_second.get(s, 0) for s in range(int(t - t0) - 10, int(t - t0))]
    baseline = statistics.median(before) if before else 0.0
    first_after = next((f for f in finished if f >= t_end), None)
    back = None
    for s in range(int(t_end - t0), int(t_end - t0) + 120):
        if baseline and per_second.get(s, 0) >= baseline / 2:
            back = t0 + s + 1 - t  # the end of the first second that made it
            break
    return {
        "at": round(t - t0, 1),
        "restart_s": round(t_end - t, 2),
        "first_finish_s": None if first_after is None else round(first_after - t, 2),
        "rate_before": baseline,
        "half_rate_back_s": None if back is None else round(back, 1),
    }


def decode_result(text: str | None) -> Any:
    """A stored result (JSON text) as the handler returned it."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
