"""The backend in an application's own database, whose default character set is not utf8mb4 (MariaDB's
and older MySQL's default is latin1): text written through a batch's JSON keeps every character."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from tests.conftest import _with_db, drop_mysql_database, mysql_connect

from conveyor import App, JobContext
from conveyor.backends.base import ArchivePruneParams, QueueLoadParams
from conveyor.testing import drain

TEXT = "emoji \U0001f600, umlaut \u00fc, cyrillic \u0436"


@pytest.fixture(params=["latin1_swedish_ci", "utf8mb3_general_ci"])
def app(request: pytest.FixtureRequest, mysql_server_url: str) -> Iterator[App]:
    name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
    with mysql_connect(mysql_server_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` COLLATE {request.param}")
    a = App(_with_db(mysql_server_url, name))
    try:
        a.admin.migrate()
        yield a
    finally:
        a.close()
        drop_mysql_database(mysql_server_url, name)


def test_results_and_errors_keep_four_byte_characters(app: App) -> None:
    @app.task(queue=f"q {TEXT}", max_attempts=2, backoff=[0.0])
    def echo(ctx: JobContext, fail: bool) -> str:
        if fail:
            raise RuntimeError(f"attempt {ctx.attempt}: {TEXT}")
        return TEXT

    done, failed = echo.delay(fail=False), echo.delay(fail=True)
    drain(app, [f"q {TEXT}"])
    assert done.status().result == TEXT  # a finish
    error = failed.status().error
    assert error is not None and error.message == f"attempt 2: {TEXT}"  # a retry, then a finish
    assert f"attempt 2: {TEXT}" in error.traceback


def test_keys_and_queue_names_in_a_batch_compare_exactly(app: App) -> None:
    queue = f"q {TEXT}"

    @app.task(queue=queue)
    def t() -> None:
        pass

    app.send(t.name, {}, queue=queue, idempotency_key=TEXT)
    backend, now = app.backend, datetime.now(UTC)
    load = backend.queue_load(QueueLoadParams(queue=queue, now=now, keys=(TEXT, "other")))
    assert load.held == frozenset({TEXT})
    drain(app, [queue])
    # The queue's own retention (everything older than an hour ahead) deletes its row; the default keeps it.
    far_past = now - timedelta(days=3650)
    prune = ArchivePruneParams(
        now=now, default_before=far_past, default_dead_before=far_past, before={queue: now + timedelta(hours=1)}
    )
    assert backend.archive_prune(prune) == 1
