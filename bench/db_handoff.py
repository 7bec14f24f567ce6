"""What database calls on threads cost an event loop that runs handlers: ``python -m bench.db_handoff``.

On a default-configured cluster of its own (bench/_cluster.py), the asyncio body floor (10 coroutines,
one Redis ``INCR`` each, as ``bench.floors body_async``) runs three ways in one process: alone; while a
background task sends ``--rate`` statements per second to a pool of 3 threads, each a blocking psycopg
query returning 25 rows (the worker's way: ``worker/_calls.py``); and while the same statements run on
3 psycopg ``AsyncConnection``s on the loop itself. Prints bodies/s and the process CPU per body for each,
``--rounds`` times, the three ways interleaved.

The question it answers (issue 13): how much of the gap between Conveyor's async drain and its floor
is the hand-off of the worker's acquire and finish statements to database threads (GIL contention:
every wake-up of a database thread takes the GIL from the loop) rather than Conveyor's own Python.
A 30,000-job drain issues ~250 statements per second (364 acquires of ~80 jobs, ~1,200 finishes of
~25; counted on 2026-11-24), the default ``--rate``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench._cluster import Cluster

_ROWS = (
    "SELECT gen_random_uuid() AS id, 'bench' AS queue, 'bench.noop' AS task, '{\"i\": 1}'::jsonb AS payload,"
    " now() AS run_at, 1 AS attempts FROM generate_series(1, 25)"
)
_MODES = ("alone", "threads", "async")


def run(url: str, mode: str, n: int, rate: float) -> tuple[float, float]:
    """Bodies/s and CPU µs per body of ``n`` bodies with the database calls of ``mode``."""
    import psycopg

    from bench.floors import bodies_async

    async def main() -> tuple[float, float]:
        done = False

        async def on_threads() -> None:
            pool = ThreadPoolExecutor(3)
            conns = [psycopg.connect(url, autocommit=True) for _ in range(3)]
            loop = asyncio.get_running_loop()

            def one(conn: psycopg.Connection[Any]) -> None:
                conn.execute(_ROWS, prepare=True).fetchall()

            i = 0
            while not done:
                loop.run_in_executor(pool, one, conns[i % 3])
                i += 1
                await asyncio.sleep(1 / rate)
            pool.shutdown(wait=True)
            for conn in conns:
                conn.close()

        async def on_loop() -> None:
            conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(3)]
            running: set[asyncio.Future[Any]] = set()

            async def one(conn: psycopg.AsyncConnection[Any]) -> None:
                await (await conn.execute(_ROWS, prepare=True)).fetchall()

            i = 0
            while not done:
                task = asyncio.ensure_future(one(conns[i % 3]))
                running.add(task)
                task.add_done_callback(running.discard)
                i += 1
                await asyncio.sleep(1 / rate)
            await asyncio.gather(*running)
            for conn in conns:
                await conn.close()

        background = {"threads": on_threads, "async": on_loop}.get(mode)
        side = asyncio.ensure_future(background()) if background is not None else None
        await asyncio.sleep(0.2)
        c0 = time.process_time()
        seconds = await bodies_async(n, stamp=False)
        cpu = time.process_time() - c0
        done = True
        if side is not None:
            await side
        return n / seconds, 1e6 * cpu / n

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=250.0, help="statements per second beside the bodies")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["BENCH_BODY"] = "redis"
    cluster = Cluster()
    try:
        url = cluster.database("db_handoff")
        for _ in range(args.rounds):
            figures = [(mode, *run(url, mode, args.n, args.rate)) for mode in _MODES]
            print("  ".join(f"{mode} {rate:,.0f} bodies/s {cpu:.0f} µs" for mode, rate, cpu in figures), flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
