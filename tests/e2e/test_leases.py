"""Heartbeats: a handler running for several visibility timeouts keeps its lease the whole time
(DESIGN §2: extended every visibility_timeout / 3), so it is neither rescued nor run twice."""

from __future__ import annotations

import json
import time
from pathlib import Path
from uuid import UUID

from conveyor import App, Message
from conveyor.backends.base import JobGetParams

from . import e2e_app
from ._support import Db, Procs, iter_lines, now, wait_until, worker_argv

RUN_SECONDS = 3 * e2e_app.VISIBILITY_TIMEOUT


def test_long_handler_keeps_its_lease(database_url: str, procs: Procs, tmp_path: Path) -> None:
    producer = App(database_url, migrate=True)
    e2e_app.register(producer)
    run_log = tmp_path / "runs.log"
    db = Db(database_url)
    try:
        job = producer.send_many([Message(task=e2e_app.SLOW, payload={"seconds": RUN_SECONDS})])[0]
        # Two workers: if the lease ever lapsed, the other one's rescue + acquire would run it again.
        worker_env = {"E2E_RUN_LOG": str(run_log)}
        for i in range(2):
            procs.start(
                f"worker{i}", worker_argv(database_url, "--queues", "slow", "--concurrency", "1"), env=worker_env
            )
        wait_until(lambda: any(f[0] == "start" for f in iter_lines(run_log)), 60, "the job started")
        leases = []
        while (record := db.backend.job_get(JobGetParams(job.id))) is not None and record.state == "processing":
            at = now()
            assert record.lease_expires_at is not None and record.lease_expires_at > at, (record.lease_expires_at, at)
            leases.append(record.lease_expires_at)
            time.sleep(0.1)
        record = db.backend.job_get(JobGetParams(job.id))
        assert record is not None
        assert (record.state, record.attempts, record.deliveries) == ("completed", 1, 1), record
        assert record.result is not None and json.loads(record.result) == {"slept": RUN_SECONDS}
        assert len(set(leases)) >= 3, "the lease was not extended while the handler ran"
        assert [(f[0], UUID(f[1])) for f in iter_lines(run_log)] == [("start", job.id), ("end", job.id)]
    finally:
        db.close()
        producer.close()
