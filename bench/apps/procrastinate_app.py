"""Procrastinate's bench app: ``python -m bench.apps.procrastinate_app`` runs
``app.run_worker(queues=["bench"], concurrency=10)`` (what ``procrastinate worker --concurrency 10``
does); LISTEN/NOTIFY on, other settings default."""

from __future__ import annotations

import os

import procrastinate

from bench._common import QUEUE, body_async, record

# Its documented production settings (procrastinate.readthedocs.io, "Limit the number of opened
# connections" and "Delete finished jobs"): a connection pool as large as the concurrency plus the
# LISTEN connection (psycopg_pool's default of 4 connections left 6 of the 10 slots waiting for
# one), and finished jobs deleted so that the jobs table stays small. BENCH_PROCRASTINATE_DEFAULTS=1
# selects the library's defaults instead.
_DEFAULTS = os.environ.get("BENCH_PROCRASTINATE_DEFAULTS") == "1"
_POOL = {} if _DEFAULTS else {"min_size": 12, "max_size": 12}
app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DATABASE_URL", ""), **_POOL)
)


@app.task(name="noop", queue=QUEUE)
async def noop(sent: float = 0.0, i: int = 0) -> None:
    record(sent)
    await body_async()


if __name__ == "__main__":
    extra = {} if _DEFAULTS else {"delete_jobs": "successful"}
    app.run_worker(queues=[QUEUE], concurrency=10, install_signal_handlers=True, **extra)
