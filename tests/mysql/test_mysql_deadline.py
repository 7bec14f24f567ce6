"""A MySQL server that stops answering without closing its connections is a lost server after
``statement_deadline`` (see tests/postgres/test_pg_deadline.py): a call raises BackendUnavailable saying
so, and a worker goes on once the server answers again. Before, each waited on its socket for ever."""

from __future__ import annotations

import time
from functools import partial

import pytest
from tests.chaos._lapse import through_proxy, worker_goes_on_after_a_lapse

from conveyor import App
from conveyor._errors import BackendUnavailable
from conveyor.backends.mysql import MysqlBackend

DEADLINE = 2.0


def test_a_call_with_no_answer_raises_backend_unavailable_after_the_deadline(mysql_database: str) -> None:
    with App(mysql_database, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    with (
        through_proxy(mysql_database, 3306) as (proxy, url),
        App(url, backend=MysqlBackend(url, statement_deadline=DEADLINE)) as app,
    ):
        assert app.admin.queues() == []
        proxy.strand()  # the pool's idle connection: its server gone without a word
        proxy.swallowing = True  # and no new connection answers either, for now
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match=r"no answer to \w+ within 2s \(statement_deadline\)"):
            app.admin.queues()
        assert DEADLINE - 0.1 < time.monotonic() - started < DEADLINE + 15
        proxy.swallowing = False
        assert app.admin.queues() == []  # the cut connection was dropped; a new one is answered


def test_a_worker_goes_on_after_its_server_stopped_answering(mysql_database: str) -> None:
    # Before (statement_deadline=None): the last five jobs never ran.
    done = worker_goes_on_after_a_lapse(mysql_database, partial(MysqlBackend, statement_deadline=DEADLINE), 3.0)
    assert sorted(set(done)) == list(range(10))
