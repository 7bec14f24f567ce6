"""The pruner loop: archive retention per queue, in bounded batches."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from _clock import FixedClock

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
