"""PgQueuer's bench worker: ``python -m bench.apps.pgqueuer_app`` (what ``pgq run`` does, without
the CLI's factory loading): a QueueManager on one psycopg async connection, ``run(batch_size=10)``,
one ``async def`` entrypoint, other settings default.

Ten concurrent slots: an ``asyncio.Semaphore(10)`` around the handler. PgQueuer's own
``concurrency_limit=10`` on the entrypoint is enforced in SQL against jobs still marked picked, and
the finished jobs' statuses are written by a buffer in the background, so after the first 10 jobs
the dequeue finds no capacity and the loop sleeps until ``dequeue_timeout`` (30 s): 300 jobs took
58 s here (5 jobs/s). ``BENCH_PGQ_LIMIT=1`` selects that configuration anyway."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import psycopg
from pgqueuer import PsycopgDriver, Queries, QueueManager

from bench._common import body_async, record


async def main() -> None:
    conn = await psycopg.AsyncConnection.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))
    sql_limit = os.environ.get("BENCH_PGQ_LIMIT") == "1"
    slots = asyncio.Semaphore(10)

    @qm.entrypoint("noop", concurrency_limit=10 if sql_limit else 0)
    async def noop(job) -> None:  # type: ignore[no-untyped-def]
        async with slots:
            record(json.loads(job.payload)["sent"])
            await body_async()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    await qm.run(batch_size=10)
    await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
