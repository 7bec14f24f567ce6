"""PgQueuer's bench worker: ``python -m bench.apps.pgqueuer_app`` (what ``pgq run`` does, without
the CLI's factory indirection): a QueueManager on one psycopg async connection, one entrypoint
with ``concurrency_limit=10``, ``run(batch_size=10)``; other settings default."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import psycopg
from pgqueuer import PsycopgDriver, QueueManager

from bench._common import record


async def main() -> None:
    conn = await psycopg.AsyncConnection.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)
    qm = QueueManager(PsycopgDriver(conn))

    @qm.entrypoint("noop", concurrency_limit=10)
    async def noop(job) -> None:  # type: ignore[no-untyped-def]
        record(json.loads(job.payload)["sent"])

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    await qm.run(batch_size=10)
    await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
