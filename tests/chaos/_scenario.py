"""One chaos run, end to end: cluster, proxy, workers, producer, faults, drain, check.

::

    report = run(Scenario(...), workdir)
    assert report.problems() == [], report.format()

Everything it starts is stopped in ``finally`` blocks: worker process groups are killed, stopped
processes resumed first, the proxy closed and the throwaway cluster removed, also when a check or
the run itself fails.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

import psycopg

from conveyor import App, BackendUnavailable, JobNotFoundError, Message

from . import mix_app as mix
from ._checker import POLICIES, Checker, Report, Row, decode_result, read_run_log
from ._cluster import ChaosCluster
from ._faults import Fault, Injector
from ._fleet import Events, Fleet
from ._proxy import TcpProxy

APP_PATH = "tests.chaos.mix_app:app"
DB_NAME = "chaos"


@dataclass
class Scenario:
    """What one run does."""

    name: str
    #: Jobs sent before the workers start, by task.
    upfront: Mapping[str, int]
    #: Jobs a producer sends while the faults run, by task, spread over ``produce_seconds``.
    paced: Mapping[str, int] = field(default_factory=dict)
    produce_seconds: float = 30.0
    #: Bursts of fast jobs sent at once: (seconds into the run, jobs). How fast each drains is the
    #: queue's spare capacity at that moment (the long form's probe of degradation).
    bursts: Sequence[tuple[float, int]] = ()
    faults: Sequence[Fault] = ()
    mix: mix.MixConfig = field(default_factory=mix.MixConfig)
    plain_workers: int = 2
    plain_concurrency: int = 4
    prefork_trees: int = 1
    prefork_processes: int = 2
    prefork_concurrency: int = 4
    #: How long a SIGSTOPped worker stays stopped (past its lease: visibility timeout x 2.5 default).
    stop_seconds: float | None = None
    blocker_seconds: float = 60.0
    #: Seconds the jobs get to drain once the faults and the producer are done.
    drain_timeout: float = 120.0
    seed: int = 14
    window: float = 5.0


def _retrying(fn: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    """What a producer does while its database restarts: retry on BackendUnavailable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: the database stayed unavailable for {timeout}s") from None
            time.sleep(0.1)


def _messages(tasks: Mapping[str, int], first: int, rng: random.Random, keyed: bool) -> list[Message]:
    kinds = [task for task, n in tasks.items() for _ in range(n)]
    rng.shuffle(kinds)
    return [
        Message(task=task, payload={"n": first + i}, idempotency_key=f"chaos-{first + i}" if keyed else None)
        for i, task in enumerate(kinds)
    ]


@dataclass
class Send:
    """One planned send: ``messages`` at ``at`` seconds into the run; ``burst`` sends are measured."""

    at: float
    messages: list[Message]
    burst: bool = False
    sent_at: float | None = None
    ids: list[UUID] = field(default_factory=list)


def plan(scenario: Scenario, first: int, rng: random.Random) -> list[Send]:
    """The sends made while the run goes on: the paced jobs in a batch every 0.5 s, and the bursts.

    Every one carries an idempotency key: a send that failed mid-commit (a restart) is sent again,
    and the key returns the job that the first try may have created instead of enqueueing it twice."""
    paced = _messages(scenario.paced, first, rng, keyed=True)
    sends: list[Send] = []
    if paced:
        batches = max(1, int(scenario.produce_seconds / 0.5))
        size = max(1, -(-len(paced) // batches))
        for k, i in enumerate(range(0, len(paced), size)):
            sends.append(Send(k * scenario.produce_seconds / batches, paced[i : i + size]))
    n = first + len(paced)
    for at, count in scenario.bursts:
        sends.append(Send(at, _messages({mix.FAST: count}, n, rng, keyed=True), burst=True))
        n += count
    return sorted(sends, key=lambda s: s.at)


class Producer:
    """Sends jobs and remembers what was accepted (the producer got the job's id back)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.accepted: dict[UUID, tuple[str, int]] = {}
        self.sends: list[Send] = []
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._abort = threading.Event()

    def send(self, messages: Sequence[Message], chunk: int = 5000) -> list[UUID]:
        ids: list[UUID] = []
        for i in range(0, len(messages), chunk):
            batch = list(messages[i : i + chunk])
            jobs = _retrying(lambda b=batch: self.app.send_many(b), "send")  # type: ignore[misc]
            for message, job in zip(batch, jobs, strict=True):
                self.accepted[job.id] = (message.task, int(message.payload["n"]))
                ids.append(job.id)
        return ids

    def start(self, sends: Sequence[Send], t0: float) -> None:
        """Make ``sends`` at their times from a thread (a late send goes at once)."""
        self.sends = list(sends)

        def go() -> None:
            try:
                for send in self.sends:
                    if self._abort.wait(max(0.0, t0 + send.at - time.time())):
                        return
                    send.ids = self.send(send.messages)
                    send.sent_at = time.time()
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=go, name="chaos-producer", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise AssertionError(f"the producer did not finish within {timeout}s")
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}") from self.error

    def abort(self) -> None:
        self._abort.set()
        if self._thread is not None:
            self._thread.join(timeout=120)


def burst_drains(sends: Sequence[Send], archive: Sequence[Row], t0: float) -> list[dict[str, Any]]:
    """For each burst: how fast it drained (its jobs / from the end of its send to its last finish),
    the queue's capacity at that moment less what the steady sends took."""
    finished = {r.id: r.finished_at for r in archive if r.finished_at is not None}
    out = []
    for send in sends:
        if not send.burst or send.sent_at is None:
            continue
        last = max((finished[i] for i in send.ids if i in finished), default=None)
        drain_s = None if last is None else max(last - send.sent_at, 1e-3)
        out.append({
            "at": round(send.sent_at - t0, 1),
            "jobs": len(send.ids),
            "drain_s": None if drain_s is None else round(drain_s, 2),
            "jobs_per_s": None if drain_s is None else round(len(send.ids) / drain_s),
        })  # fmt: skip
    return out


def _live_count(url: str) -> int | None:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM jobs").fetchone()
            return int(row[0]) if row else None
    except psycopg.Error:
        return None


def wait_drained(url: str, timeout: float) -> bool:
    """Wait until the jobs table is empty (every job terminal); False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _live_count(url) == 0:
            return True
        time.sleep(0.25)
    return _live_count(url) == 0


_COLUMNS = (
    "id, task, state, attempts, deliveries, reason, error_type, error_message, result::text, "
    "extract(epoch FROM finished_at)::float8, worker_id"
)


def read_tables(url: str) -> tuple[list[Row], list[Row]]:
    """Every archived and every live job, as Conveyor's tables hold them."""

    def row(r: tuple[Any, ...]) -> Row:
        return Row(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], decode_result(r[8]), r[9], r[10])

    with psycopg.connect(url) as conn:
        archive = [row(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM archive")]
        live = [
            row(r)
            for r in conn.execute(
                "SELECT id, task, state, attempts, deliveries, NULL, error_type, error_message, NULL, NULL, "
                "worker_id FROM jobs"
            )
        ]
    return archive, live


def through_public_api(app: App, rows: Sequence[Row]) -> tuple[list[Row], list[str]]:
    """The rows of the jobs whose policy is not the plain one, re-read through ``App.job``; and
    where the public API disagrees with the tables."""
    out: list[Row] = []
    disagree: list[str] = []
    for r in rows:
        if r.task in (mix.FAST, mix.LONG):
            out.append(r)
            continue
        try:
            s = app.job(r.id)
        except JobNotFoundError:
            disagree.append(f"{r.id}: App.job finds no such job")
            out.append(r)
            continue
        api = Row(
            r.id, s.task, s.state, s.attempts, s.deliveries, s.reason,
            s.error.type if s.error else None, s.error.message if s.error else None,
            s.result, r.finished_at, r.worker_id,
        )  # fmt: skip
        if (api.state, api.attempts, api.reason, api.error_type) != (r.state, r.attempts, r.reason, r.error_type):
            disagree.append(f"{r.id}: App.job says {api.state}/{api.attempts}/{api.reason}, the archive {r.state}")
        out.append(api)
    return out, disagree


class Probe(Protocol):
    """Something that watches a run from beside it (the long form's sampler of depth and dead rows)."""

    def start(self, url: str, t0: float) -> None: ...

    def stop(self) -> None: ...

    def finish(self, url: str, t0: float) -> dict[str, Any]:
        """Read what it needs from the database before the cluster goes; kept in the report."""
        ...


def run(
    scenario: Scenario,
    workdir: Path,
    log: Callable[[str], None] = lambda _m: None,
    probe: Probe | None = None,
) -> Report:
    """Run ``scenario`` with its files under ``workdir``; return the checker's report."""
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(scenario.seed)
    run_log = workdir / "runs.log"
    config = mix.MixConfig(
        run_log=str(run_log),
        visibility_timeout=scenario.mix.visibility_timeout,
        fast_sleep=scenario.mix.fast_sleep,
        long_seconds=scenario.mix.long_seconds,
        hang_seconds=scenario.mix.hang_seconds,
    )
    events = Events()
    stop_seconds = scenario.stop_seconds or config.visibility_timeout * 2.5
    with contextlib.ExitStack() as stack:
        cluster = ChaosCluster()
        stack.callback(cluster.destroy)
        cluster.start()
        url = cluster.create_database(DB_NAME)
        proxy = TcpProxy("127.0.0.1", cluster.port)
        stack.callback(proxy.close)
        proxy.start()
        worker_url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{DB_NAME}"
        log(f"cluster on port {cluster.port}, proxy on {proxy.port}, files in {workdir}")

        app = App(url, migrate=True)
        stack.callback(app.close)
        mix.register(app, config)
        producer = Producer(app)
        stack.callback(producer.abort)
        t_send = time.monotonic()
        producer.send(_messages(scenario.upfront, 0, rng, keyed=False))
        log(f"sent {len(producer.accepted):,} jobs in {time.monotonic() - t_send:.1f}s")
        sends = plan(scenario, len(producer.accepted), rng)

        fleet = Fleet(workdir, worker_url, APP_PATH, config.env(), events)
        stack.callback(fleet.cleanup)
        for i in range(scenario.plain_workers):
            fleet.add(f"plain{i}", scenario.plain_concurrency)
        for i in range(scenario.prefork_trees):
            fleet.add(f"prefork{i}", scenario.prefork_concurrency, processes=scenario.prefork_processes)
        fleet.start()
        fleet.wait_running(60)
        t_start = time.time()
        log("workers running")
        if probe is not None:
            stack.callback(probe.stop)
            probe.start(url, t_start)

        injector = Injector(
            scenario.faults,
            cluster=cluster,
            proxy=proxy,
            fleet=fleet,
            events=events,
            database_url=url,
            stop_seconds=stop_seconds,
            blocker_seconds=scenario.blocker_seconds,
        )
        stack.callback(injector.abort)
        injector.start(t_start)
        producer.start(sends, t_start)

        last_fault = max((f.at for f in scenario.faults), default=0.0)
        last_send = max((s.at for s in sends), default=0.0)
        injector.join(last_fault + scenario.blocker_seconds + 600)
        producer.join(last_send + 600)
        log(f"faults done at {time.time() - t_start:.0f}s; draining")
        drained = wait_drained(url, scenario.drain_timeout)
        log(f"drained: {drained} at {time.time() - t_start:.0f}s")
        # A worker killed by the last fault is back before the graceful stop that ends the run. When
        # the jobs drained before that fault, the kill may not have landed yet (a SIGKILLed process
        # still looks alive for a moment): give it, and the fleet's restart, time first.
        time.sleep(fleet.restart_delay + 1.0)
        fleet.wait_running(60)
        codes = fleet.stop_all()
        t_end = time.time()
        probed: dict[str, Any] = {}
        if probe is not None:
            probe.stop()
            probed = probe.finish(url, t_start)

        runs, malformed = read_run_log(run_log)
        archive, live = read_tables(url)
        archive, disagree = through_public_api(app, archive)
        checker = Checker(
            runs=runs,
            accepted=producer.accepted,
            archive=archive,
            live=live,
            events=events.items,
            final_codes=codes,
            t_start=t_start,
            t_end=t_end,
            malformed_lines=malformed,
            worker_logs=fleet.outputs(tail=10**9),
            window=scenario.window,
            concurrency={m.name: m.concurrency for m in fleet.members},
        )
        report = checker.check()
        report.policy_violations.extend(disagree)
        report.extra["duration_s"] = round(t_end - t_start, 1)
        report.extra["drained"] = drained
        report.extra["proxy_connections"] = proxy.connections_total
        report.extra["kinds"] = sorted(POLICIES)
        report.extra.update(probed)
        report.extra["bursts"] = burst_drains(producer.sends, archive, t_start)
        (workdir / "events.json").write_text(json.dumps(events.items, indent=1, default=str))
        (workdir / "report.txt").write_text(report.format() + "\n\n" + report.format_throughput() + "\n")
        return report
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow exceptions
