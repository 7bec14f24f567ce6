"""What an idle gap costs code that runs after it: ``python -m bench.cold_path [--rounds 3]``.

A pickup runs its code after the process sat idle (the issue's producer sends every 20 ms), and on some
machines code that ran a moment ago runs several times slower after a few milliseconds of anything else
(caches and branch predictors lost to other work or to the hypervisor). This probe times, back to back
("hot") and each after a ``--gap`` (sleeping, and spinning so that the CPU never idles):

- ``python``: a fixed piece of pure Python (a 200-key dict and its ``json.dumps``);
- ``producer``: Conveyor's ``delay()`` with its database insert left out (the message, its checks, its id,
  its JSON: the Python a send runs before its statement);
- ``floor send`` and ``delay()``: the pickup floor's insert + ``pg_notify`` and Conveyor's ``delay()``, each
  a durable round trip on a default-configured cluster of its own (bench/_cluster.py).

Prints the median µs of each, per round. What it says for the pickup target: the floor's path is a few
lines of Python on each side; every extra line of Conveyor's path pays the gap's penalty too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable

from bench._cluster import Cluster


def _python_probe() -> str:
    return json.dumps({str(i): i * 2 for i in range(200)})


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _median_us(call: Callable[[], object], n: int, gap: float, spin: bool) -> float:
    times = []
    for _ in range(n):
        if gap:
            (_spin if spin else time.sleep)(gap)
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between calls (default: 20 ms)")
    args = parser.parse_args()

    from bench.floors import _SEND, _TABLE
    from conveyor import App

    offline = App(f"sqlite:///{tempfile.mkdtemp(prefix='conveyor-cold-')}/x.db", migrate=True)
    offline.backend.jobs_insert_many = lambda params: [j.id for j in params.jobs]  # type: ignore[method-assign]
    offline_task = offline.task(name="bench.cold", queue="bench")(lambda sent=0.0, i=0: None)

    cluster = Cluster()
    try:
        import psycopg

        db = cluster.database("cold_path")
        app = App(db, migrate=True)
        task = app.task(name="bench.cold", queue="bench")(lambda sent=0.0, i=0: None)
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(_TABLE)
            probes: dict[str, Callable[[], object]] = {
                "python": _python_probe,
                "producer": lambda: offline_task.delay(sent=time.time(), i=1),
                "floor send": lambda: conn.execute(_SEND, (time.time(),), prepare=True),
                "delay()": lambda: task.delay(sent=time.time(), i=1),
            }
            for call in probes.values():
                for _ in range(50):
                    call()
            gap = f"{args.gap * 1000:g} ms"
            modes = [
                ("hot", 0.0, False),
                (f"after {gap} asleep", args.gap, False),
                (f"after {gap} spinning", args.gap, True),
            ]
            for r in range(args.rounds):
                print(f"round {r + 1} (median µs of {args.n} calls)")
                for name, call in probes.items():
                    cells = [f"{_median_us(call, args.n, gap, spin):9.1f} {label}" for label, gap, spin in modes]
                    print(f"  {name:<11}" + "  ".join(cells))
        app.close()
    finally:
        cluster.stop()
        offline.close()


if __name__ == "__main__":
    main()
