"""The MySQL fixtures every MySQL test stands on: a reachable server, a fresh database per test."""

from __future__ import annotations

import re
import threading

from tests.conftest import create_mysql_database, drop_mysql_database, mysql_connect


def _databases(server_url: str) -> set[str]:
    with mysql_connect(server_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT schema_name FROM information_schema.SCHEMATA")
        return {row[0] for row in cur.fetchall()}


def test_each_test_gets_a_fresh_empty_database_that_compares_bytes(mysql_database: str) -> None:
    with mysql_connect(mysql_database) as conn, conn.cursor() as cur:
        cur.execute("SELECT DATABASE(), @@character_set_database, @@collation_database")
        name, charset, collation = cur.fetchone()
        assert re.fullmatch(r"conveyor_t_[0-9a-f]{12}", name)
        assert (charset, collation) == ("utf8mb4", "utf8mb4_nopad_bin")
        cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE table_schema = DATABASE()")
        assert cur.fetchone() == (0,)
        # A table takes the database's collation: 'a', 'A' and 'a ' are three names, and 4-byte UTF-8 is stored.
        cur.execute("CREATE TABLE names (name VARCHAR(10) PRIMARY KEY)")
        cur.executemany("INSERT INTO names VALUES (%s)", [("a",), ("A",), ("a ",), ("\U0001f600",)])
        cur.execute("SELECT name FROM names WHERE name = 'a'")
        assert cur.fetchall() == (("a",),)


def test_the_database_is_dropped_even_while_a_session_holds_it_in_a_transaction(mysql_server_url: str) -> None:
    name = create_mysql_database(mysql_server_url)
    url = mysql_server_url.rpartition("/")[0] + "/" + name
    left_open = mysql_connect(url)
    with left_open.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t VALUES (1)")
    # DROP DATABASE waits for the open transaction's metadata lock unless the session is killed first.
    dropping = threading.Thread(target=drop_mysql_database, args=(mysql_server_url, name), daemon=True)
    dropping.start()
    dropping.join(timeout=20)
    try:
        assert not dropping.is_alive(), "DROP DATABASE waited on the session left in a transaction"
        assert name not in _databases(mysql_server_url)
    finally:
        left_open.close()
