"""Procrastinate's bench app: ``python -m bench.apps.procrastinate_app`` runs
``app.run_worker(queues=["bench"], concurrency=10)`` (what ``procrastinate worker --concurrency 10``
does); LISTEN/NOTIFY on, other settings default."""

from __future__ import annotations

import os

import procrastinate

from bench._common import QUEUE, record

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DATABASE_URL", "")))


@app.task(name="noop", queue=QUEUE)
async def noop(sent: float = 0.0, i: int = 0) -> None:
    record(sent)


if __name__ == "__main__":
    app.run_worker(queues=[QUEUE], concurrency=10, install_signal_handlers=True)
