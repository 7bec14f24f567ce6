"""Prefork: ``conveyor worker APP --processes 2 --burst`` drains one SQLite file with several worker
processes, every job completed exactly once, exit code 0."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from uuid import UUID

from conveyor import App, Message

from . import e2e_app
from ._support import Db, Procs, iter_lines, worker_argv

JOBS = 600
PROCESSES = 2


def test_prefork_drains_sqlite_exactly_once(sqlite_url: str, procs: Procs, tmp_path: Path) -> None:
    producer = App(sqlite_url)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(sqlite_url)
    try:
        messages = [Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(JOBS)]
        ids = {j.id for j in producer.send_many(messages)}
        supervisor = procs.start(
            "prefork",
            worker_argv(sqlite_url, "--processes", str(PROCESSES), "--concurrency", "4", "--burst"),
            # 10 ms per job keeps both processes busy for a while; long leases rule out any
            # redelivery, so "exactly once" is what must happen here.
            env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "0.01", "E2E_VISIBILITY_TIMEOUT": "30"},
        )
        assert supervisor.wait(timeout=120) == 0, supervisor.output()

        runs = Counter(UUID(f[1]) for f in iter_lines(run_log) if f[0] == "run")
        assert set(runs) == ids
        assert set(runs.values()) == {1}, {i: n for i, n in runs.items() if n != 1}
        # The work was shared by the worker processes (the supervisor itself runs no handler).
        pids = Counter(int(f[4]) for f in iter_lines(run_log))
        assert len(pids) == PROCESSES and supervisor.pid not in pids, pids

        assert db.live() == []
        archived = db.archived()
        assert {r.id for r in archived} == ids
        assert {(r.state, r.attempts, r.deliveries) for r in archived} == {("completed", 1, 1)}
        assert len({r.worker_id for r in archived}) == PROCESSES
        assert "Traceback" not in supervisor.output()
    finally:
        db.close()
        producer.close()
