"""A row another transaction holds locked (an operator's session, an application's open transaction, the
completer counting a start) holds up no other job's lease, start, outcome or acquire, on a nearly empty
table too. SQLite locks the whole file, not rows: these are the server engines' tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from _factory import T0, acquire, at, complete, insert, new_job
from tests.conftest import driver_connection

from conveyor.backends import open_backend
from conveyor.backends.base import Backend, JobsInsertParams, JobsStartParams, LeaseRef, LeasesExtendParams

#: Long enough for a statement that does not wait; far below the servers' lock wait timeouts (30 s).
_AT_ONCE = 5.0


@contextmanager
def _row_locked(database_url: str, job_id: Any) -> Iterator[None]:
    """Another session holds the job's row locked until the block ends."""
    with driver_connection(database_url) as conn:
        if database_url.startswith("mysql"):
            conn.cursor().execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", (str(job_id),))
        else:
            conn.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", (job_id,))
        try:
            yield
        finally:
            conn.rollback()


@pytest.fixture(params=["postgres", "mysql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh database of a server engine (SQLite locks its file, not rows)."""
    return str(request.getfixturevalue(f"{request.param}_database"))


@pytest.fixture
def server(database_url: str) -> Iterator[Backend]:
    backend = open_backend(database_url)
    backend.migrate()
    try:
        yield backend
    finally:
        backend.close()


def test_a_locked_row_holds_up_no_other_jobs_lease_start_or_outcome(server: Backend, database_url: str) -> None:
    # Before (MySQL): a batch statement joined its JSON items to the jobs table, which MariaDB scanned whole
    # while it held fewer rows than its estimate of the JSON (40), locking every row: the other job's
    # extend, start and finish each waited out the lock wait timeout, then failed as "unavailable".
    insert(server, new_job("q"), new_job("q"))
    locked, free = acquire(server, queue="q", limit=2)
    refs = [LeaseRef(d.id, d.receipt) for d in (locked, free)]
    with _row_locked(database_url, locked.id):
        began = time.monotonic()
        held = server.leases_extend_many(LeasesExtendParams(refs, 60.0, at(1), wait=False))
        # The locked row is skipped, not waited for, and still held by its delivery: the heartbeat must not
        # take its job for lost (before, on MySQL, it was left out, and the job ran a second time).
        assert held == [locked.id, free.id]
        assert server.jobs_start_many(JobsStartParams([refs[1]], at(1), wait=False)) == [free.id]
        assert complete(server, free, now=at(2)) == 1
        assert time.monotonic() - began < _AT_ONCE


def test_an_open_transactions_scheduled_job_holds_up_no_acquire(server: Backend, database_url: str) -> None:
    # Before (MySQL): the promotion of due scheduled jobs waited for a row an application had inserted in a
    # transaction still open (send(conn=...) with a delay): every acquire of the queue waited 30 s and failed.
    ready = new_job("q")
    insert(server, ready)
    with driver_connection(database_url) as conn:
        later = new_job("q", run_at=T0 + timedelta(seconds=5))
        server.jobs_insert_many(JobsInsertParams(jobs=[later], now=T0, conn=conn))
        began = time.monotonic()
        assert [d.id for d in acquire(server, queue="q", limit=10, now=at(10))] == [ready.id]
        assert time.monotonic() - began < _AT_ONCE
        conn.rollback()
