"""Statements the MySQL server interrupted (KILL QUERY, max_statement_time) are StatementCancelled: retried,
a batch split first, never an error of the items nor one that stops a worker."""

from __future__ import annotations

import threading
import time

import pytest
from tests.conftest import mysql_connect

from conveyor._errors import StatementCancelled
from conveyor.backends.mysql._connection import Cursor, Pool
from conveyor.backends.mysql._url import connect_kwargs

# A statement that runs for seconds on any server.
SLOW = (
    "SET STATEMENT max_recursive_iterations = 1000000000{} FOR "
    "WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000) SELECT count(*) FROM n"
)


def _run(pool: Pool, statement: str) -> None:
    def work(cur: Cursor) -> None:
        cur.execute(statement)

    pool.write("slow", work)


def _answers(pool: Pool) -> bool:
    def work(cur: Cursor) -> bool:
        cur.execute("SELECT 1 AS one")
        return cur.fetchone() == {"one": 1}

    return pool.read("probe", work)


def test_a_statement_past_max_statement_time_is_cancelled(mysql_database: str) -> None:
    pool = Pool(connect_kwargs(mysql_database))
    try:
        with pytest.raises(StatementCancelled, match="max_statement_time"):
            _run(pool, SLOW.format(", max_statement_time = 0.05"))
        assert _answers(pool)
    finally:
        pool.close()


def test_a_statement_an_operator_killed_is_cancelled(mysql_database: str) -> None:
    pool = Pool(connect_kwargs(mysql_database))
    database = mysql_database.rpartition("/")[2]

    def kill_it() -> None:
        with mysql_connect(mysql_database) as conn, conn.cursor() as cur:
            for _ in range(100):
                cur.execute(
                    "SELECT id FROM information_schema.PROCESSLIST"
                    " WHERE db = %s AND info LIKE %s AND id <> CONNECTION_ID()",
                    (database, "%RECURSIVE%"),
                )
                row = cur.fetchone()
                if row is not None:
                    cur.execute("KILL QUERY %s", (row[0],))
                    return
                time.sleep(0.05)

    killer = threading.Thread(target=kill_it)
    killer.start()
    try:
        with pytest.raises(StatementCancelled, match="interrupted"):
            _run(pool, SLOW.format(""))
        assert _answers(pool)
    finally:
        killer.join()
        pool.close()
