"""A caller's own connection (``conn=``) that could not carry every character is refused before use."""

from __future__ import annotations

import pymysql
import pytest
from tests.conftest import mysql_connect

from conveyor import App, BackendUnavailable, ConfigurationError
from conveyor.backends.mysql._url import connect_kwargs


@pytest.mark.parametrize("charset", ["utf8", "latin1"])
def test_a_connection_in_another_character_set_is_refused(mysql_database: str, charset: str) -> None:
    # Before: on a 'utf8' (utf8mb3) connection outside strict mode, the emoji was stored as '????'.
    app = App(mysql_database)
    try:
        app.admin.migrate()
        conn = pymysql.connect(**connect_kwargs(mysql_database), charset=charset, sql_mode="")
        try:
            with pytest.raises(ConfigurationError, match="charset='utf8mb4'"):
                app.send("t", {"text": "\U0001f600"}, conn=conn)
            conn.commit()
        finally:
            conn.close()
        assert app.admin.queues() == []
        with mysql_connect(mysql_database) as conn:  # PyMySQL's default, utf8mb4
            job = app.send("t", {"text": "\U0001f600"}, conn=conn)
        assert job.status().payload == {"text": "\U0001f600"}
    finally:
        app.close()


def test_a_lock_wait_on_a_callers_connection_names_its_own_timeout(mysql_database: str) -> None:
    # The caller's session waits its own innodb_lock_wait_timeout (1 s here); the refusal said "for more than
    # 30 s", Conveyor's setting on its own connections, which an operator reading the line then looked for.
    app = App(mysql_database, migrate=True)
    try:
        app.send("t", {}, idempotency_key="k")
        with mysql_connect(mysql_database, autocommit=False) as holder, mysql_connect(mysql_database) as conn:
            with holder.cursor() as cur:
                cur.execute("SELECT * FROM idempotency_keys FOR UPDATE")
            conn.autocommit(False)
            with conn.cursor() as cur:
                cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            with pytest.raises(BackendUnavailable, match="another transaction held a row") as raised:
                app.send("t", {"n": 2}, idempotency_key="k", conn=conn)
            assert "more than its connection's innodb_lock_wait_timeout; nothing was written" in str(raised.value)
            conn.commit()
            holder.rollback()
        assert [q.pending for q in app.admin.queues()] == [1]
    finally:
        app.close()
