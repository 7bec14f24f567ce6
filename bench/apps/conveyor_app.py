"""Conveyor's bench app: one no-op task whose only work is the side channel.

The worker is Conveyor's own CLI: ``python -m conveyor --db URL worker bench.apps.conveyor_app:app
--concurrency 10 --processes 1`` (defaults otherwise: adaptive prefetch, flush every 5 ms)."""

from __future__ import annotations

import os

from bench._common import QUEUE, body_async, body_sync, record
from conveyor import App

_url = os.environ.get("CONVEYOR_DATABASE_URL") or ""
if os.environ.get("BENCH_DURABLE_ACKS") == "1" and _url.startswith("postgres"):
    # Not the default: outcomes (acquire, ack, heartbeat) wait for the WAL flush like inserts do.
    from conveyor.backends.postgres import PostgresBackend

    app = App(_url, backend=PostgresBackend(_url, durable_acks=True))
else:
    app = App(_url or None)


@app.task(name="bench.noop", queue=QUEUE)
async def noop(sent: float = 0.0, i: int = 0) -> None:
    record(sent)
    await body_async()


@app.task(name="bench.noop_sync", queue=QUEUE)
def noop_sync(sent: float = 0.0, i: int = 0) -> None:
    record(sent)
    body_sync()
