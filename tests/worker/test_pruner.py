"""The pruner loop: archive retention per queue, in bounded batches."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from _clock import FixedClock
from tests.conftest import driver_connection

from conveyor import App, Message
from conveyor.backends.base import (
    ArchiveReadParams,
)
from conveyor.testing import drain
from conveyor.worker._calls import BackendCalls
from conveyor.worker._state import Counters
from conveyor.worker.pruner import Pruner


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def test_pruner_enforces_retention_per_queue(app: App) -> None:
    app.queue("short", retention=timedelta(hours=1), dead_retention=timedelta(days=1))

    @app.task(queue="short")
    def ok() -> None:
        pass

    @app.task(queue="short")
    def bad() -> None:
        raise ValueError("x")

    @app.task(queue="long")
    def kept() -> None:
        pass

    app.send_many(
        [Message(ok.name) for _ in range(30)]
        + [Message(bad.name) for _ in range(5)]
        + [Message(kept.name) for _ in range(7)]
    )
    drain(app)
    later = FixedClock(datetime.now(UTC) + timedelta(hours=2))
    pruner = Pruner(app.catalogue, BackendCalls(app.backend, Counters()), later, batch=4, pause=0)
    pruned = asyncio.run(pruner.run_once())
    assert pruned >= 30
    rows = app.backend.archive_read(ArchiveReadParams(None, 1000))
    assert Counter((r.queue, r.state) for r in rows) == {("short", "dead"): 5, ("long", "completed"): 7}
    much_later = FixedClock(datetime.now(UTC) + timedelta(days=15))
    asyncio.run(Pruner(app.catalogue, BackendCalls(app.backend, Counters()), much_later, batch=4, pause=0).run_once())
    assert app.backend.archive_read(ArchiveReadParams(None, 1000)) == []


# PostgreSQL only: on MariaDB, the delete of the picked ids reads a table this small whole (the optimizer's
# choice, FORCE INDEX or not) and waits for the held row (tests/conformance/test_row_locks.py holds the
# engines to the same contract on tables where it does not).
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_held_archive_row_does_not_stall_the_pruner(app: App, database_url: str) -> None:
    # Before: the drop of the archive's daily partitions (today's among them, past retention 15 days on) waited
    # out its 1 s lock timeout behind the held row and raised BackendUnavailable; the pruner retried it for as
    # long as the row was held, deleting nothing and never reaching the expired keys. (Once the drops were
    # skipped, the row delete picked the held row and waited for it, with no timeout.)
    @app.task(queue="q")
    def ok() -> None:
        pass

    app.send_many([Message(ok.name, idempotency_key=f"k{i}") for i in range(10)])
    drain(app)
    rows = app.backend.archive_read(ArchiveReadParams(None, 1000))
    held = rows[0].id
    later = FixedClock(datetime.now(UTC) + timedelta(days=15))  # past retention and every key's window
    pruner = Pruner(app.catalogue, BackendCalls(app.backend, Counters()), later, batch=4, pause=0)
    with driver_connection(database_url) as holder:
        holder.execute("SELECT id FROM archive WHERE id = %s FOR UPDATE", (held,))

        async def bounded() -> int:
            try:
                return await asyncio.wait_for(pruner.run_once(), timeout=20)
            except TimeoutError:
                pruner.stop()
                holder.rollback()
                pytest.fail("the pruner waited for the held archive row")

        assert asyncio.run(bounded()) == 9 + 10  # the nine rows not held, and the ten expired keys
        assert [r.id for r in app.backend.archive_read(ArchiveReadParams(None, 1000))] == [held]
        holder.rollback()
    assert asyncio.run(pruner.run_once()) == 1
    assert app.backend.archive_read(ArchiveReadParams(None, 1000)) == []
