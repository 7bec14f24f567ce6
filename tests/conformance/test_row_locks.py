"""A row another transaction holds locked (an operator's session, an application's open transaction, the
completer counting a start) holds up no other job's lease, start, outcome or acquire, on a nearly empty
table too. SQLite locks the whole file, not rows: these are the server engines' tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from _factory import T0, acquire, at, complete, insert, make_dead, new_job
from tests.conftest import driver_connection

from conveyor._ids import uuid7
from conveyor.backends import open_backend
from conveyor.backends.base import (
    ArchivePruneParams,
    Backend,
    DeadPurgeParams,
    DeadReplayParams,
    JobGetParams,
    JobsInsertParams,
    JobsRescueParams,
    JobsStartParams,
    LeaseRef,
    LeasesExtendParams,
)

_T = TypeVar("_T")

#: Long enough for a statement that does not wait; far below the servers' lock wait timeouts (30 s).
_AT_ONCE = 5.0


@contextmanager
def _row_locked(database_url: str, job_id: Any, table: str = "jobs") -> Iterator[Any]:
    """Another session holds the row of ``table`` (jobs or archive) locked until the block ends; yields
    the release (a rollback), which the block may call earlier."""
    with driver_connection(database_url) as conn:
        if database_url.startswith("mysql"):
            conn.cursor().execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", (str(job_id),))
        else:
            conn.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", (job_id,))
        try:
            yield conn.rollback
        finally:
            conn.rollback()


def _without_waiting(release: Callable[[], None], call: Callable[[], _T]) -> _T:
    """``call``'s answer, which must come while another session still holds its row: if it waits, the row is
    released (so that the call ends rather than wait out a lock timeout, which PostgreSQL has none of) and the
    test fails."""
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(call)
        try:
            return answer.result(timeout=_AT_ONCE)
        except FutureTimeout:
            release()
            answer.result(timeout=60)
            pytest.fail(f"the call waited for a row another transaction held (more than {_AT_ONCE:g} s)")


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


def test_a_locked_dead_letter_holds_up_no_replay_or_purge_of_another(server: Backend, database_url: str) -> None:
    # Before (MySQL): replay and purge joined their JSON ids to the archive, which MariaDB scanned whole while
    # it held fewer rows than its estimate of the JSON (40), locking every dead letter: one an operator's
    # session (or another replay) held stalled every other replay and purge until the lock wait timeout.
    # (Named by a secondary index, the dead letters of a small archive were read whole as well.)
    held, *replayed, purged, purged_too = make_dead(server, 5, queue="q")
    pairs = [(dead_id, uuid7()) for dead_id in replayed]
    with _row_locked(database_url, held, table="archive") as release:
        replay = DeadReplayParams(replays=pairs, actor="ops", reason="fixed", now=at(10))
        assert _without_waiting(release, lambda: server.dead_replay_many(replay)) == pairs
        purge = DeadPurgeParams(ids=[purged, purged_too], actor="ops", reason="junk", now=at(11))
        assert _without_waiting(release, lambda: server.dead_purge_many(purge)) == 2
    assert server.job_get(JobGetParams(id=purged)) is None
    assert [server.job_get(JobGetParams(id=new)) is not None for _, new in pairs] == [True, True]


def test_a_locked_archived_row_holds_up_no_prune(server: Backend, database_url: str) -> None:
    # Before (MySQL): the prune deleted the rows it picked through a join of their JSON ids to the archive,
    # which MariaDB scanned whole on a small archive, waiting for a recent row an operator's session held.
    # Before (PostgreSQL): the old daily partitions (migrate's, around today, all before T0) are dropped
    # first, and the first drop waited out its 1 s lock timeout behind the held row and raised
    # BackendUnavailable: nothing was deleted. Now the drops are left for a later prune and the rows still go.
    insert(server, new_job("q"), new_job("q"))
    first, second = acquire(server, queue="q", limit=2)
    assert complete(server, first, now=at(1)) == 1
    assert complete(server, second, now=at(3600)) == 1
    with _row_locked(database_url, second.id, table="archive") as release:
        prune = ArchivePruneParams(now=at(4000), default_before=at(60), default_dead_before=at(60))
        assert _without_waiting(release, lambda: server.archive_prune(prune)) == 1
    assert server.job_get(JobGetParams(id=first.id)) is None
    assert server.job_get(JobGetParams(id=second.id)) is not None


def test_a_locked_archived_row_holds_up_no_prune_of_a_thousand(server: Backend, database_url: str) -> None:
    # Before (MariaDB): an IN list of 1,000 ids or more became a subquery over a VALUES table
    # (in_predicate_conversion_threshold), and the delete scanned the archive whole again, waiting for the row.
    insert(server, *[new_job("q") for _ in range(1000)], new_job("r"))
    assert complete(server, *acquire(server, queue="q", limit=1000), now=at(1)) == 1000
    (recent,) = acquire(server, queue="r", limit=1)
    assert complete(server, recent, now=at(3600)) == 1
    with _row_locked(database_url, recent.id, table="archive") as release:
        prune = ArchivePruneParams(now=at(4000), default_before=at(60), default_dead_before=at(60))
        assert _without_waiting(release, lambda: server.archive_prune(prune)) == 1000


def test_a_locked_archived_row_past_retention_is_left_for_a_later_prune(server: Backend, database_url: str) -> None:
    # Before: the prune picked the held row among its victims and waited for it (PostgreSQL: with no timeout,
    # until the holder ended; MySQL: the lock wait timeout, then failed), deleting nothing meanwhile.
    insert(server, new_job("q"), new_job("q"), new_job("q"))
    held, *others = acquire(server, queue="q", limit=3)
    assert complete(server, held, *others, now=at(1)) == 3
    prune = ArchivePruneParams(now=at(4000), default_before=at(60), default_dead_before=at(60))
    with _row_locked(database_url, held.id, table="archive") as release:
        assert _without_waiting(release, lambda: server.archive_prune(prune)) == 2
        # A caller pruning "until 0" is not kept calling by the row it cannot take.
        assert _without_waiting(release, lambda: server.archive_prune(prune)) == 0
    assert server.job_get(JobGetParams(id=held.id)) is not None
    assert server.archive_prune(prune) == 1
    assert server.job_get(JobGetParams(id=held.id)) is None


def test_a_locked_lease_holds_up_no_rescue_of_another(server: Backend, database_url: str) -> None:
    # Before (MySQL): the rescue was one UPDATE ... ORDER BY lease_expires_at LIMIT, which waits for every
    # expired lease it reads: one another transaction held (a worker finishing it late, an operator's session)
    # stalled every rescue for the lock wait timeout. PostgreSQL's rescue skips it (SKIP LOCKED), as MySQL's now
    # does; the live lease past the expired ones, held too, is not waited for either.
    insert(server, new_job("q"), new_job("q"))
    insert(server, new_job("q"), now=at(100))
    held, free = acquire(server, queue="q", limit=2, visibility_timeout=10)
    (live,) = acquire(server, queue="q", limit=1, now=at(100), visibility_timeout=3600)
    with _row_locked(database_url, held.id) as release, _row_locked(database_url, live.id):
        rescue = JobsRescueParams(now=at(200), limit=100)
        assert _without_waiting(release, lambda: server.jobs_rescue_expired(rescue)) == 1
    assert server.job_get(JobGetParams(id=free.id)).state == "pending"  # type: ignore[union-attr]
    assert server.job_get(JobGetParams(id=held.id)).state == "processing"  # type: ignore[union-attr]
    # Let go, the skipped lease is rescued by the next call.
    assert server.jobs_rescue_expired(JobsRescueParams(now=at(201), limit=100)) == 1
