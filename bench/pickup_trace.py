"""Where a pickup's milliseconds go: ``python -m bench.pickup_trace [--n 100]``.

On a default-configured cluster of its own (bench/_cluster.py), a worker in this process (10 slots, one
``async def`` task) drains 20,000 jobs, idles 1 s, then a producer (another process) sends
``--n`` jobs 20 ms apart with ``delay()``. The listener's wake-ups and the backend's single-job acquires
are stamped by wrapping them; the handler stamps its start. Prints the p50 of each step of a pickup:
the producer's ``delay()`` call (its statement and durable commit), the listener's wake-up after the
producer's commit returned (negative: the notification arrives before the commit's answer), the
listener thread's acquire, and the hop from the acquire's return to the handler's first statement.
Then the server's side of the two claims, each after 20 ms idle on the table the drain left: the
execution time (``EXPLAIN ANALYZE`` of the prepared statement, its generic plan as the worker's
connections use it) of Conveyor's acquire of one job and of the pickup floor's one-row claim.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench._cluster import Cluster

Stamps = dict[str, list[Any]]

_PRODUCER = """
import sys, time
from conveyor import App
producer = App(sys.argv[1])
sender = producer.task(name="bench.traced", queue="bench")(lambda sent=0.0, i=0: None)
for i in range(int(sys.argv[2])):
    t0 = time.time()
    sender.delay(sent=t0, i=i)
    print(t0, time.time())
    time.sleep(0.02)
producer.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--drain", type=int, default=20_000)
    args = parser.parse_args()
    cluster = Cluster()
    try:
        trace(cluster.database("pickup_trace"), args.n, args.drain)
    finally:
        cluster.stop()


def trace(db: str, n: int, drain: int) -> None:
    from conveyor import App, Message
    from conveyor.backends.base import Delivery, JobsAcquireParams
    from conveyor.backends.postgres import _backend, _listener
    from conveyor.worker._worker import Worker

    stamps: Stamps = {"woke": [], "acquired": []}
    wait0 = _listener.PostgresListener.wait
    acquire0 = _backend.PostgresBackend.jobs_acquire

    def wait(self: _listener.PostgresListener, timeout: float) -> bool:
        woken = wait0(self, timeout)
        if woken:
            stamps["woke"].append(time.time())
        return woken

    def acquire(self: _backend.PostgresBackend, params: JobsAcquireParams) -> list[Delivery]:
        t0 = time.time()
        got = acquire0(self, params)
        if len(got) == 1:
            stamps["acquired"].append((t0, time.time()))
        return got

    _listener.PostgresListener.wait = wait  # type: ignore[method-assign]
    _backend.PostgresBackend.jobs_acquire = acquire  # type: ignore[method-assign]

    app = App(db)
    app.backend.migrate()
    starts: list[tuple[float, float]] = []

    async def traced(sent: float = 0.0, i: int = 0) -> None:
        starts.append((sent, time.time()))

    task = app.task(name="bench.traced", queue="bench")(traced)
    for start in range(0, drain, 5000):
        count = min(5000, drain - start)
        app.send_many([Message(task=task.name, payload={"sent": 0.0, "i": i}) for i in range(count)])
    worker = Worker(app, ["bench"], concurrency=10)
    thread = threading.Thread(target=lambda: worker.run_sync(install_signals=False), daemon=True)
    thread.start()
    while len(starts) < drain:
        time.sleep(0.05)
    time.sleep(1.0)
    starts.clear()
    stamps["woke"].clear()
    stamps["acquired"].clear()

    # The producer is a process of its own, as in the harness: in this one it would contend with the
    # worker's loop for the GIL while its commit returns.
    produced = subprocess.run(
        [sys.executable, "-c", _PRODUCER, db, str(n)], capture_output=True, text=True, check=True, timeout=600
    )
    sends = [(float(a), float(b)) for a, b in (line.split() for line in produced.stdout.split("\n") if line)]
    time.sleep(0.5)
    worker.stop()
    thread.join(10)
    app.close()

    rows = []
    for (sent, returned), (_, started) in zip(sends, sorted(starts), strict=False):
        woke = min((w for w in stamps["woke"] if w >= sent), default=None)
        acq = min((a for a in stamps["acquired"] if a[0] >= sent), default=None)
        if woke is not None and acq is not None:
            rows.append((returned - sent, woke - returned, acq[0] - woke, acq[1] - acq[0], started - acq[1]))
    latencies = [started - sent for sent, started in starts]
    print(f"pickup p50 {1000 * statistics.median(latencies):.3f} ms over {len(latencies)} jobs ({len(rows)} traced)")
    names = ["delay() call", "commit answer -> woken", "woken -> acquire", "acquire", "acquired -> handler"]
    for k, name in enumerate(names):
        if rows:
            print(f"  {name:<24} p50 {1000 * statistics.median(r[k] for r in rows):7.3f} ms")
    print(f"  load average {os.getloadavg()[0]:.2f}")
    server_side(db, task.name)


# The pickup floor's table and claim (bench/floors.py), on the same database.
_FLOOR_TABLE = "CREATE TABLE IF NOT EXISTS pickup_floor (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT "
_FLOOR_TABLE += "'pending', sent float8 NOT NULL)"
_FLOOR_CLAIM = """UPDATE pickup_floor SET state = 'processing'
WHERE id = (SELECT id FROM pickup_floor WHERE state = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING sent"""


def server_side(db: str, task: str, rounds: int = 20) -> None:
    """Print the median execution time of Conveyor's acquire of one job and of the floor's claim."""
    import psycopg

    from conveyor import App

    app = App(db)
    acquire = app.backend._q["jobs_acquire"]  # type: ignore[attr-defined]
    for number, name in enumerate(("queue", "limit", "now", "visibility_timeout", "worker_id"), 1):
        acquire = acquire.replace(f"%({name})s", f"${number}")
    times: dict[str, list[float]] = {"acquire": [], "floor": []}
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")  # as the worker's outcome connections
        conn.execute("SET plan_cache_mode = force_generic_plan")  # what they use after 5 runs
        conn.execute(f"PREPARE acquire (text, int, timestamptz, float8, text) AS {acquire}")
        conn.execute(_FLOOR_TABLE)
        conn.execute(f"PREPARE claim AS {_FLOOR_CLAIM}")
        for _ in range(rounds):
            app.send(task, {"sent": 0.0, "i": 0}, queue="bench")
            conn.execute("INSERT INTO pickup_floor (sent) VALUES (0)")
            for name, statement in (
                ("acquire", "EXECUTE acquire('bench', 10, now(), 30, 'w')"),
                ("floor", "EXECUTE claim"),
            ):
                time.sleep(0.02)
                plan = conn.execute(f"EXPLAIN (ANALYZE, TIMING OFF) {statement}").fetchall()
                line = next(row[0] for row in plan if row[0].startswith("Execution Time"))
                times[name].append(float(line.split()[2]))
    app.close()
    for name, values in times.items():
        print(f"  server: {name:<8} execution p50 {statistics.median(values):.3f} ms over {len(values)}")


if __name__ == "__main__":
    main()
