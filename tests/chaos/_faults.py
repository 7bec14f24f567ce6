"""The fault injector: a fixed schedule of faults, bounded in count and in time.

Each fault is recorded in the run's :class:`~tests.chaos._fleet.Events` as a ``fault`` event with
its kind, when it began (``t``) and ended (``t_end``), and the worker pids it hit, so that the
checker can tie every extra handler run to the fault that caused it.

=================  ===========================================================================
``pg_restart``     ``pg_ctl restart -m immediate`` of the throwaway cluster
``kill_worker``    SIGKILL of one plain worker process (its supervisor starts it again)
``kill_child``     SIGKILL of one prefork child (the prefork supervisor replaces it)
``kill_tree``      SIGKILL of a whole prefork tree: supervisor and children at once
``stop_worker``    SIGSTOP of a worker process past its leases, then SIGCONT
``proxy_cut``      every connection between workers and PostgreSQL aborted by the TCP proxy
``vacuum_blocker`` a transaction held open (vacuum can remove nothing deleted after it began)
=================  ===========================================================================
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from ._cluster import ChaosCluster, VacuumBlocker
from ._fleet import Events, Fleet, Member
from ._proxy import TcpProxy

FAULT_KINDS = (
    "pg_restart",
    "kill_worker",
    "kill_child",
    "kill_tree",
    "stop_worker",
    "proxy_cut",
    "vacuum_blocker",
)


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``kind`` at ``at`` seconds after the run started."""

    at: float
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.kind!r}")


class Injector:
    """Runs a schedule of faults in a thread, one after the other."""

    def __init__(
        self,
        schedule: Sequence[Fault],
        *,
        cluster: ChaosCluster,
        proxy: TcpProxy,
        fleet: Fleet,
        events: Events,
        database_url: str,
        stop_seconds: float,
        blocker_seconds: float,
    ) -> None:
        self.schedule = sorted(schedule, key=lambda f: f.at)
        self.cluster = cluster
        self.proxy = proxy
        self.fleet = fleet
        self.events = events
        self.database_url = database_url
        self.stop_seconds = stop_seconds
        self.blocker_seconds = blocker_seconds
        self.error: BaseException | None = None
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._turn = itertools.count()
        self._stopped: set[int] = set()
        self._blockers: list[VacuumBlocker] = []
        self._timers: list[threading.Thread] = []

    def start(self, t0: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(t0,), name="chaos-injector", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise AssertionError(f"the fault injector did not finish within {timeout}s")
        if self.error is not None:
            raise AssertionError(f"the fault injector failed: {self.error!r}") from self.error

    def abort(self) -> None:
        """Stop injecting; resume stopped workers and end held transactions."""
        self._abort.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._undo()

    def _undo(self) -> None:
        for pid in list(self._stopped):
            self._stopped.discard(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for blocker in self._blockers:
            blocker.release()
        self._blockers.clear()

    def _run(self, t0: float) -> None:
        try:
            for fault in self.schedule:
                if self._abort.wait(max(0.0, t0 + fault.at - time.time())):
                    return
                getattr(self, f"_{fault.kind}")()
            for timer in self._timers:
                timer.join()
        except BaseException as exc:
            self.error = exc
        finally:
            self._undo()

    # -- targets -------------------------------------------------------------------------------

    def _leases_by_worker(self) -> dict[str, int]:
        try:
            with psycopg.connect(self.database_url, connect_timeout=2) as conn:
                rows = conn.execute(
                    "SELECT worker_id, count(*) FROM jobs WHERE state = 'processing' GROUP BY worker_id"
                ).fetchall()
            return {str(w): int(n) for w, n in rows}
        except psycopg.Error:
            return {}

    def _pick(self, prefork: bool | None, wait: float = 3.0) -> tuple[int, Member]:
        """A worker process to hit: plain (``prefork`` False), a prefork child (True) or either
        (None), preferring one that holds leases now (waiting up to ``wait`` s for one), in turn."""
        host = socket.gethostname()
        deadline = time.monotonic() + wait
        turn = next(self._turn)
        while True:
            pids = sorted(
                (pid, m)
                for pid, m in self.fleet.worker_pids().items()
                if (prefork is None or m.prefork == prefork) and pid not in self._stopped
            )
            if pids:
                held = self._leases_by_worker()
                holding = [(pid, m) for pid, m in pids if held.get(f"{host}:{pid}", 0) > 0]
                if holding or time.monotonic() > deadline:
                    choice = holding or pids
                    return choice[turn % len(choice)]
            elif time.monotonic() > deadline + 30:
                raise AssertionError("no worker process to inject a fault into")
            time.sleep(0.05)

    # -- faults --------------------------------------------------------------------------------

    def _pg_restart(self) -> None:
        t = time.time()
        self.cluster.restart_immediate()
        self.events.add("fault", t=t, fault="pg_restart", t_end=time.time(), pids=[])

    def _kill(self, fault: str, prefork: bool) -> None:
        pid, member = self._pick(prefork)
        t = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.events.add("fault", t=t, fault=fault, t_end=t, pids=[pid], member=member.name)

    def _kill_worker(self) -> None:
        self._kill("kill_worker", prefork=False)

    def _kill_child(self) -> None:
        self._kill("kill_child", prefork=True)

    def _kill_tree(self) -> None:
        trees = [m for m in self.fleet.members if m.prefork and m.alive()]
        if not trees:
            raise AssertionError("no prefork tree to kill")
        member = trees[next(self._turn) % len(trees)]
        t = time.time()
        pids = self.fleet.kill_group(member)
        self.events.add("fault", t=t, fault="kill_tree", t_end=t, pids=pids, member=member.name)

    def _stop_worker(self) -> None:
        """SIGSTOP now, SIGCONT ``stop_seconds`` later from a timer (the schedule goes on meanwhile;
        no other fault picks a stopped process)."""
        pid, member = self._pick(None)
        t = time.time()
        os.kill(pid, signal.SIGSTOP)
        self._stopped.add(pid)

        def resume() -> None:
            if self._abort.wait(self.stop_seconds) or pid not in self._stopped:
                return  # _undo resumed it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self._stopped.discard(pid)
            self.events.add("fault", t=t, fault="stop_worker", t_end=time.time(), pids=[pid], member=member.name)

        timer = threading.Thread(target=resume, name=f"chaos-resume-{pid}", daemon=True)
        self._timers.append(timer)
        timer.start()

    def _proxy_cut(self) -> None:
        t = time.time()
        cut = self.proxy.cut()
        self.events.add("fault", t=t, fault="proxy_cut", t_end=t, pids=[], connections=cut)

    def _vacuum_blocker(self) -> None:
        blocker = VacuumBlocker(self.database_url)
        self._blockers.append(blocker)
        t = time.time()
        blocker.start()
        self._abort.wait(self.blocker_seconds)
        blocker.release()
        self._blockers.remove(blocker)
        error = repr(blocker.error) if blocker.error is not None else None
        self.events.add("fault", t=t, fault="vacuum_blocker", t_end=time.time(), pids=[], error=error)
