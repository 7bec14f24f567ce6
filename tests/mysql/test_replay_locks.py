"""A replay on MySQL and the idempotency keys other transactions hold: it waits for no key it does not hand
over, and the one wait it cannot avoid (its own dead letter's key) is bounded and loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.conftest import driver_connection

from conveyor._ids import uuid7
from conveyor.backends import open_backend
from conveyor.backends.base import (
    Backend,
    DeadReplayParams,
    Finish,
    JobGetParams,
    JobsAcquireParams,
    JobsFinishParams,
    JobsInsertParams,
    NewJob,
)
from conveyor.backends.mysql._connection import LOCK_WAIT_TIMEOUT_S

T0 = datetime(2030, 1, 1, tzinfo=UTC)
_AT_ONCE = 5.0


@pytest.fixture
def server(mysql_database: str) -> Iterator[Backend]:
    backend = open_backend(mysql_database)
    backend.migrate()
    try:
        yield backend
    finally:
        backend.close()


def _job(key: str | None) -> NewJob:
    return NewJob(
        id=uuid7(),
        queue="q",
        task="t",
        payload="{}",
        headers="{}",
        priority=0,
        run_at=T0,
        max_attempts=1,
        max_deliveries=5,
        idempotency_key=key,
        dedup_until=None if key is None else T0 + timedelta(days=1),
    )


def _dead_letters(server: Backend, *keys: str) -> list[NewJob]:
    jobs = [_job(key) for key in keys]
    server.jobs_insert_many(JobsInsertParams(jobs=jobs, now=T0))
    deliveries = server.jobs_acquire(JobsAcquireParams("q", len(jobs), 60.0, "w", T0))
    outcomes = [Finish(d.id, d.receipt, "dead", reason="max_attempts_exceeded") for d in deliveries]
    assert server.jobs_finish_many(JobsFinishParams(outcomes, T0 + timedelta(seconds=1))) == len(jobs)
    return jobs


def _hold_key(conn: Any, key: str) -> None:
    """``conn``'s transaction holds the key's row, as an operator's session or an open send(conn=...) would."""
    conn.cursor().execute("SELECT job_id FROM idempotency_keys WHERE queue = 'q' AND `key` = %s FOR UPDATE", (key,))


def test_a_held_key_of_a_live_job_holds_up_no_replay(server: Backend, mysql_database: str) -> None:
    # Before: with an IN list of dead letters as long as the keys table (3 dead letters, 4 keys), MariaDB
    # read idempotency_keys whole to hand the keys over (EXPLAIN: k ALL, then archive by k.job_id), and an
    # UPDATE locks every row it reads: a live job's key another session held stalled the replay for the
    # lock wait timeout, then failed it as unavailable.
    dead = _dead_letters(server, "a", "b", "c")
    live = _job("live")
    server.jobs_insert_many(JobsInsertParams(jobs=[live], now=T0))
    pairs = [(job.id, uuid7()) for job in dead]
    with driver_connection(mysql_database) as conn, ThreadPoolExecutor(1) as pool:
        _hold_key(conn, "live")
        replay = pool.submit(
            server.dead_replay_many, DeadReplayParams(pairs, "ops", "fixed", T0 + timedelta(seconds=10))
        )
        try:
            assert replay.result(timeout=_AT_ONCE) == pairs
        except FutureTimeout:
            conn.rollback()
            replay.exception(timeout=60)
            pytest.fail(f"the replay waited for a key it does not hand over (more than {_AT_ONCE:g} s)")
        conn.rollback()
    # The keys went to the replays: a resend of key "a" is answered with its replay.
    resend = server.jobs_insert_many(JobsInsertParams(jobs=[_job("a")], now=T0 + timedelta(seconds=20)))
    assert resend == [pairs[0][1]]


def test_a_replay_whose_own_key_is_held_fails_within_the_lock_wait_and_loses_nothing(
    server: Backend, mysql_database: str
) -> None:
    # The replay must hand its dead letter's key to the new job, so it waits for that key's row (inherent):
    # bounded by the lock wait timeout, then one line from the CLI, nothing written, and a retry passes.
    (dead,) = _dead_letters(server, "mine")
    env = {**os.environ, "CONVEYOR_DATABASE_URL": mysql_database}
    command = [sys.executable, "-m", "conveyor", "dlq", "replay", str(dead.id), "--reason", "fixed"]
    with driver_connection(mysql_database) as conn:
        _hold_key(conn, "mine")
        began = time.monotonic()
        refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=LOCK_WAIT_TIMEOUT_S + 60)
        waited = time.monotonic() - began
        conn.rollback()
    assert refused.returncode != 0
    assert refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("conveyor: error: MySQL unavailable (dead_replay_many): another transaction held a row")
    assert "nothing was written" in line
    assert LOCK_WAIT_TIMEOUT_S <= waited < LOCK_WAIT_TIMEOUT_S + 20
    # Nothing lost and nothing half-done: still an unreplayed dead letter holding its key, no new job.
    record = server.job_get(JobGetParams(id=dead.id))
    assert record is not None and record.state == "dead" and record.replayed_by is None
    with driver_connection(mysql_database, autocommit=True) as check, check.cursor() as cur:
        cur.execute("SELECT count(*) FROM jobs")
        assert cur.fetchone()[0] == 0
        cur.execute("SELECT job_id FROM idempotency_keys WHERE `key` = 'mine'")
        assert cur.fetchone()[0] == str(dead.id)
    # Once the session let go, the same command replays it.
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "replayed 1 of 1 dead letter(s)"
    record = server.job_get(JobGetParams(id=dead.id))
    assert record is not None and record.replayed_by is not None
