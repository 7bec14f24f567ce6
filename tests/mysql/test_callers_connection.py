"""A caller's own connection (``conn=``) that could not carry every character is refused before use."""

from __future__ import annotations

import pymysql
import pytest
from tests.conftest import mysql_connect

from conveyor import App, ConfigurationError
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
