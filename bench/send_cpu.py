"""The producer's CPU per ``delay()`` and the connections its pool used: ``python -m bench.send_cpu``.

On a default-configured cluster of its own (bench/_cluster.py): 50 sends to warm up, then ``--n``
sends one after another; prints the process CPU time per send, the median wall time of a send and
how many connections the App's insert pool holds. Run it with and without a change (an environment
switch, say) to compare what a send costs the producer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench._cluster import Cluster


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    cluster = Cluster()
    try:
        from conveyor import App

        app = App(cluster.database("send_cpu"))
        app.backend.migrate()

        def noop(sent: float = 0.0, i: int = 0) -> None:
            return None

        task = app.task(name="bench.noop", queue="bench")(noop)
        for i in range(50):
            task.delay(sent=0.0, i=i)
        walls = []
        cpu0 = time.process_time()
        for i in range(args.n):
            t0 = time.perf_counter()
            task.delay(sent=0.0, i=i)
            walls.append(time.perf_counter() - t0)
        cpu = (time.process_time() - cpu0) / args.n
        stats = app.backend._pool.get_stats()  # type: ignore[attr-defined]
        print(
            f"{os.environ.get('CONVEYOR_AB', '-')}: {1e6 * cpu:.0f} µs of CPU per send, wall p50 "
            f"{1000 * statistics.median(walls):.3f} ms, insert pool of {stats.get('pool_size')} connections"
        )
        app.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
