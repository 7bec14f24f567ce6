"""Rows as records (``_rows.record_row``): positionally when a statement's columns are the record's
fields in order, by name otherwise; either way the same record."""

from __future__ import annotations

from dataclasses import dataclass, fields

import psycopg
from _pg import T0, insert, make_job

from conveyor.backends.base import Delivery, JobsAcquireParams
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres._args import acquire_args
from conveyor.backends.postgres._rows import record_row


@dataclass(frozen=True, slots=True)
class Pair:
    a: str
    b: int


def test_columns_in_another_order_are_mapped_by_name(postgres_database: str) -> None:
    with psycopg.connect(postgres_database) as conn:
        in_order = conn.cursor(row_factory=record_row(Pair)).execute("SELECT 'x' AS a, 1 AS b").fetchall()
        swapped = conn.cursor(row_factory=record_row(Pair)).execute("SELECT 2 AS b, 'y' AS a").fetchall()
    assert in_order == [Pair("x", 1)]
    assert swapped == [Pair("y", 2)]


def test_the_acquire_returns_deliverys_fields_in_order(pg: PostgresBackend, postgres_database: str) -> None:
    # The worker's hottest rows take the positional path: were a column added out of order, they
    # would still be right (by name) but slower, and this test says so.
    ids = insert(pg, make_job(), make_job())
    with psycopg.connect(postgres_database) as conn:
        cur = conn.execute(pg._q["jobs_acquire"], acquire_args(JobsAcquireParams("default", 5, 30.0, "w", T0)))
        assert cur.description is not None
        assert [c.name for c in cur.description] == [f.name for f in fields(Delivery)]
        conn.rollback()
    got = pg.jobs_acquire(JobsAcquireParams("default", 5, 30.0, "w", T0))
    assert [d.id for d in got] == ids and all(isinstance(d, Delivery) and d.receipt for d in got)
