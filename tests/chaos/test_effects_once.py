"""Effects once: a worker SIGKILLed after its side effect committed and before the ack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from conveyor import App

REPO = Path(__file__).resolve().parents[2]


def _run_worker(db: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CONVEYOR_DATABASE_URL": db, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "conveyor", "worker", "tests.chaos.chaos_app:app", "--burst", "--concurrency", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("task, rows", [("chaos.effect", 1), ("chaos.unguarded", 2)])
def test_redelivery_after_kill_skips_the_committed_effect(postgres_database: str, task: str, rows: int) -> None:
    app = App(postgres_database, migrate=True)
    try:
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            conn.execute("CREATE TABLE effects (job_id uuid NOT NULL, delivery int NOT NULL)")
        job = app.send(task, {}, queue="chaos")

        first = _run_worker(postgres_database)
        assert first.returncode == -9, first.stderr.decode()[-2000:]  # killed itself after the commit
        assert job.status().state == "processing"  # the ack never happened

        second = _run_worker(postgres_database)  # rescues the expired lease and redelivers
        assert second.returncode == 0, second.stderr.decode()[-2000:]
        status = job.status()
        # Rescue made the job a suspect, so its second start was counted before it ran; the first,
        # cut short by the kill before anything counted it, shows as the rescue.
        assert (status.state, status.deliveries, status.rescues, status.result) == ("completed", 1, 1, "done")
        with psycopg.connect(postgres_database) as conn:
            effects = conn.execute("SELECT delivery FROM effects WHERE job_id = %s", (job.id,)).fetchall()
        # Guarded: the effect happened exactly once (on delivery 1). Unguarded (the control): twice.
        assert sorted(d for (d,) in effects) == [1, 2][:rows]
    finally:
        app.close()
