"""The worker's acquire and finish on its event loop (PostgresLoopStatements): the same outcomes as the
pooled methods, a server that dropped the connections is reconnected to unnoticed, a failure or a
cancellation mid-statement costs the connection and not the next call."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from _pg import T0, insert, make_job
from tests.conftest import terminate_other_sessions

from conveyor._errors import BackendUnavailable
from conveyor.backends.base import Finish, JobGetParams, JobsAcquireParams, JobsFinishParams
from conveyor.backends.postgres import PostgresBackend


def _acquire(limit: int = 10, worker: str = "w") -> JobsAcquireParams:
    return JobsAcquireParams("default", limit, 30.0, worker, T0)


def test_acquire_and_finish_on_the_loop_do_what_the_pooled_calls_do(pg: PostgresBackend) -> None:
    ids = insert(pg, make_job(), make_job(), make_job())
    statements = pg.loop_statements()

    async def scenario() -> tuple[int, int, int]:
        got = await statements.jobs_acquire(_acquire(limit=2))
        assert [d.id for d in got] == ids[:2]  # delivery order, as the pooled acquire
        assert all(d.receipt and d.deliveries == 0 for d in got)  # a first delivery
        assert [d.id for d in await asyncio.to_thread(pg.jobs_acquire, _acquire(worker="other"))] == ids[2:]
        done = await statements.jobs_finish_many(
            JobsFinishParams([Finish(d.id, d.receipt, "completed", result="1") for d in got], T0)
        )
        stale = await statements.jobs_finish_many(
            JobsFinishParams([Finish(got[0].id, got[0].receipt, "completed")], T0)
        )
        bad_receipt = await statements.jobs_finish_many(JobsFinishParams([Finish(ids[2], "not-a-uuid", "dead")], T0))
        assert await statements.jobs_acquire(_acquire()) == []  # the third is the other worker's
        return done, stale, bad_receipt

    try:
        assert asyncio.run(scenario()) == (2, 0, 0)
    finally:
        statements.close()
    first = pg.job_get(JobGetParams(ids[0]))
    assert first is not None and first.state == "completed" and first.result == "1"
    third = pg.job_get(JobGetParams(ids[2]))
    assert third is not None and third.state == "processing"  # a malformed receipt is stale, never an error


def test_connections_the_server_dropped_are_replaced_before_use(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    insert(pg, make_job(), make_job())
    statements = pg.loop_statements()

    async def scenario() -> int:
        first = await statements.jobs_acquire(_acquire(limit=1))
        await statements.jobs_finish_many(JobsFinishParams([Finish(first[0].id, first[0].receipt, "completed")], T0))
        # A restart, as the server shows it: every session ends with a FATAL message.
        assert await asyncio.to_thread(terminate_other_sessions, admin) >= 2
        await asyncio.sleep(0.2)
        second = await statements.jobs_acquire(_acquire(limit=1))
        return await statements.jobs_finish_many(
            JobsFinishParams([Finish(second[0].id, second[0].receipt, "completed")], T0)
        )

    try:
        assert asyncio.run(scenario()) == 1
    finally:
        statements.close()


def test_a_cancelled_statement_costs_its_connection_not_the_next_call(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    insert(pg, make_job())
    statements = pg.loop_statements()

    async def scenario() -> int:
        # Hold the table so that the acquire blocks, then cancel the task awaiting it.
        await asyncio.to_thread(admin.execute, "BEGIN")
        await asyncio.to_thread(admin.execute, "LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        blocked = asyncio.ensure_future(statements.jobs_acquire(_acquire()))
        await asyncio.sleep(0.3)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        await asyncio.to_thread(admin.execute, "ROLLBACK")
        return len(await statements.jobs_acquire(_acquire()))

    try:
        assert asyncio.run(asyncio.wait_for(scenario(), 30)) == 1
    finally:
        statements.close()


def test_an_unreachable_server_is_backend_unavailable(pg: PostgresBackend) -> None:
    statements = PostgresBackend("postgresql://postgres@127.0.0.1:1/nowhere", connect_timeout=2.0).loop_statements()
    with pytest.raises(BackendUnavailable):
        asyncio.run(statements.jobs_acquire(_acquire()))
    statements.close()


def test_a_closed_one_opens_anew_on_another_loop(pg: PostgresBackend) -> None:
    # close() works from outside the loop that opened the connections (the worker's shutdown), and
    # a later run on a new loop connects again.
    insert(pg, make_job(), make_job())
    statements = pg.loop_statements()
    assert len(asyncio.run(statements.jobs_acquire(_acquire(limit=1)))) == 1
    statements.close()
    later = JobsAcquireParams("default", 1, 30.0, "w", T0 + timedelta(seconds=1))
    assert len(asyncio.run(statements.jobs_acquire(later))) == 1
    statements.close()
