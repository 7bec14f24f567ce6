"""``jobs_vacuum`` on PostgreSQL: it reclaims the row versions finished jobs left, within its bound,
and hands its connection back to the pool as it found it."""

from __future__ import annotations

import psycopg
from _pg import T0, insert, make_job
from tests.conftest import jobs_vacuums

from conveyor.backends.base import Finish, JobsAcquireParams, JobsFinishParams
from conveyor.backends.postgres import PostgresBackend


def _pages_to_find_the_next_job(url: str) -> int:
    """Index and heap pages the acquire's scan reads to find the one pending job (EXPLAIN's buffers)."""
    with psycopg.connect(url, autocommit=True) as conn:
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM jobs WHERE queue = 'q' AND state = 'pending'"
            " ORDER BY priority DESC, run_at, id LIMIT 1"
        ).fetchone()
    assert plan is not None
    return int(plan[0][0]["Plan"]["Shared Hit Blocks"]) + int(plan[0][0]["Plan"]["Shared Read Blocks"])


def test_a_vacuum_reclaims_finished_jobs_and_leaves_no_timeout_on_the_pool(
    pg: PostgresBackend, postgres_database: str
) -> None:
    insert(pg, *(make_job("q") for _ in range(5_000)))
    leased = pg.jobs_acquire(JobsAcquireParams("q", 5_000, 30.0, "w", T0))
    items = [Finish(d.id, d.receipt, "completed") for d in leased]
    assert pg.jobs_finish_many(JobsFinishParams(items, T0)) == 5_000
    insert(pg, make_job("q"))
    stepping_over_the_finished = _pages_to_find_the_next_job(postgres_database)
    vacuums = jobs_vacuums(postgres_database)

    pg.jobs_vacuum()

    assert jobs_vacuums(postgres_database) == vacuums + 1
    after = _pages_to_find_the_next_job(postgres_database)
    assert after * 4 <= stepping_over_the_finished, (after, stepping_over_the_finished)
    # The statement timeout that bounds the vacuum was for it alone: the pool's connections run
    # every other statement without one.
    with pg._connection("test") as conn:
        row = conn.execute("SHOW statement_timeout").fetchone()
    assert row is not None and row[0] == "0"
