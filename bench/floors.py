"""The floors of the independent harness (bench/independent.py): the same work with no queue at all.

``python -m bench.floors KIND [options]`` prints one ``BENCH-RESULT`` line:

- ``body_async``: the handlers' body run ``--n`` times, 10 at a time in one asyncio process: the
  most an ``async def`` worker with 10 slots could do. The body is what every library's handler
  runs (bench/apps): the side channel's stamp (bench._common.record, a ``write`` to a file) and
  the job body (one Redis ``INCR``, bench._common.body_async). ``--bare``: the ``INCR`` alone
  (the floor before session 23, ~7 % higher in asyncio and ~12 % in threads: docs/benchmarks.md).
- ``body_threads``: the same with the sync client in 10 threads: the most a ``def`` worker could do.
- ``queue_async`` / ``queue_threads``: the least a Python worker could add to those bodies, on
  ``--db``: ``--n`` ready jobs (bench.fill, not timed), then Conveyor's own ``jobs_acquire``
  (``--batch`` jobs, refilled at half) and ``jobs_finish_many`` (every 5 ms) on two psycopg
  connections, and 10 slots that take a row, decode its JSON payload and call the handler every
  library runs (the stamp, then the body) — no admission, registry, outcome or observer. Async:
  one event loop, two ``AsyncConnection`` objects, coroutine slots; threads: 10 slot threads and one plain
  feeder thread. Not a target: it says how much of a body floor a worker of this shape can reach
  on this machine at all (docs/benchmarks.md, session 24).
- ``queue_split``: ``queue_async`` with its database work in a second process (since session 37): a
  feeder process acquires and finishes on two blocking psycopg connections and hands the handler
  process each batch as one pickled list of ``(id, receipt, payload)`` over a pipe; the handler
  process runs the 10 coroutine slots and sends its acks back every 5 ms; the feeder keeps at most
  ``3 × --batch`` jobs handed out and not acked. Not a target either: it says how far an execution
  model that takes the lease and the ack off the handlers' process gets (docs/benchmarks.md,
  session 37). Its result adds the feeder's CPU per job (``feeder_cpu_us_per_job``).
- ``pickup``: a producer commits one row + ``NOTIFY`` (one durable transaction), a listener thread
  wakes on the notification and claims the row with one ``UPDATE ... SKIP LOCKED RETURNING``;
  latency from the producer's stamp (taken right before its one statement) to the claim's return.
  Paced like the queue figure (5 warm-ups, 1 s idle, ``--n`` sends ``--interval`` apart).
- ``pgbench``: Conveyor's own ``jobs_acquire`` and ``jobs_finish_many`` statements (read from the
  backend's queries.sql, their parameters filled in by pgbench) driven by ``pgbench`` with
  ``--clients`` connections, ``--batch`` jobs per acquire, on ``--n`` ready jobs: no Python in
  the loop. jobs/s = pgbench's transactions/s (without connection time) × batch. Sessions commit
  with the server's default (``synchronous_commit = on``).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import math
import os
import re
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from bench._common import QUEUE, emit, percentile, record

T = TypeVar("T", int, float)


async def bodies_async(n: int, stamp: bool = True) -> float:
    """Seconds that ``n`` bodies take, 10 at a time on the running loop (connected before timing);
    ``stamp``: each stamps the side channel first, as the handlers do."""
    from bench._common import body_async as body

    await body()
    left = n

    async def slot() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if stamp:
                record(0.0)
            await body()

    t0 = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(10)))
    return time.perf_counter() - t0


def body_async(n: int, stamp: bool = True) -> dict[str, Any]:
    os.environ["BENCH_BODY"] = "redis"
    seconds = asyncio.run(bodies_async(n, stamp))
    return {"ok": True, "n": n, "seconds": round(seconds, 4), "rate": round(n / seconds, 1), "stamp": stamp}


def body_threads(n: int, stamp: bool = True) -> dict[str, Any]:
    os.environ["BENCH_BODY"] = "redis"
    from bench._common import body_sync as body

    body()
    left = [n]
    lock = threading.Lock()

    def slot() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            if stamp:
                record(0.0)
            body()

    threads = [threading.Thread(target=slot) for _ in range(10)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return {"ok": True, "n": n, "seconds": round(seconds, 4), "rate": round(n / seconds, 1), "stamp": stamp}


def setup_jobs(db: str, n: int) -> dict[str, str]:
    """Migrate ``db`` and fill it with ``n`` ready jobs of the bench queue (bench.fill, no Python per
    row; due a second ago, so that the last of a large fill is due when the floor starts); return
    Conveyor's statements."""
    from bench.fill import fill
    from conveyor import App
    from conveyor.backends._sql import load_queries

    app = App(db)
    app.backend.migrate()
    app.close()
    fill(db, "jobs", n, offset=-1.0)
    return load_queries("conveyor.backends.postgres")


def acquire_params(limit: int, worker_id: str) -> dict[str, Any]:
    """``jobs_acquire``'s parameters: up to ``limit`` jobs of the bench queue, leased for 30 s."""
    from datetime import UTC, datetime

    return {
        "queue": QUEUE,
        "limit": limit,
        "visibility_timeout": 30.0,
        "worker_id": worker_id,
        "now": datetime.now(UTC),
    }


def finish_params(acks: Sequence[tuple[Any, str]]) -> dict[str, Any]:
    """``jobs_finish_many``'s parameters completing the acquired ``(id, receipt)`` pairs."""
    import uuid
    from datetime import UTC, datetime

    n = len(acks)
    return {
        "ids": [job_id for job_id, _ in acks],
        "receipts": [uuid.UUID(receipt) for _, receipt in acks],
        "states": ["completed"] * n,
        "results": [None] * n,
        "reasons": [None] * n,
        "error_types": [None] * n,
        "error_messages": [None] * n,
        "tracebacks": [None] * n,
        "ran": [True] * n,
        "counted": [False] * n,
        "now": datetime.now(UTC),
    }


def column(name: str) -> int:
    """Where field ``name`` is in a row of ``jobs_acquire`` (its select list is Delivery's fields)."""
    from dataclasses import fields

    from conveyor.backends.base import Delivery

    return [f.name for f in fields(Delivery)].index(name)


async def _queue_async(db: str, n: int, batch: int, timeout: float) -> tuple[int, float]:
    """Jobs completed and the seconds taken (see the module docs)."""
    import json
    from collections import deque

    import psycopg

    from bench._common import body_async as body

    q = setup_jobs(db, n)
    id_at, payload_at, receipt_at = column("id"), column("payload"), column("receipt")

    async def handler(sent: float = 0.0, i: int = 0) -> None:
        record(sent)
        await body()

    acquirer = await psycopg.AsyncConnection.connect(db, autocommit=True)
    finisher = await psycopg.AsyncConnection.connect(db, autocommit=True)
    for conn in (acquirer, finisher):
        await conn.execute(q["session_setup"])
    await body()  # connected before timing, as in the body floor
    ready: deque[Any] = deque()
    acks: list[tuple[Any, str]] = []
    has_rows, low = asyncio.Event(), asyncio.Event()
    exhausted, stopped, done = False, False, 0

    async def fetch() -> None:
        nonlocal exhausted
        while not exhausted and not stopped:
            if len(ready) > batch // 2:
                low.clear()
                await low.wait()
                continue
            cursor = await acquirer.execute(q["jobs_acquire"], acquire_params(batch, "floor"), prepare=True)
            rows = await cursor.fetchall()
            ready.extend(rows)
            exhausted = not rows
            has_rows.set()

    async def slot() -> None:
        while not stopped:
            while not ready:
                if exhausted or stopped:
                    return
                has_rows.clear()
                await has_rows.wait()
            row = ready.popleft()
            if len(ready) <= batch // 2:
                low.set()
            await handler(**json.loads(row[payload_at]))
            acks.append((row[id_at], row[receipt_at]))

    async def flush() -> None:
        nonlocal done, stopped
        deadline = time.monotonic() + timeout
        while done < n and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            if acks:
                taken = acks[:]
                del acks[:]
                await finisher.execute(q["jobs_finish_many"], finish_params(taken), prepare=True)
                done += len(taken)
        stopped = True  # past the deadline (not ok: fewer than n done), or every job done
        has_rows.set()
        low.set()

    t0 = time.perf_counter()
    await asyncio.gather(fetch(), flush(), *(slot() for _ in range(10)))
    seconds = time.perf_counter() - t0
    await acquirer.close()
    await finisher.close()
    return done, seconds


def queue_async(db: str, n: int, batch: int, timeout: float) -> dict[str, Any]:
    os.environ.setdefault("BENCH_BODY", "redis")  # the tests run the plumbing with BENCH_BODY=noop
    done, seconds = asyncio.run(_queue_async(db, n, batch, timeout))
    return _queue_result(n, done, batch, seconds)


def _queue_result(n: int, done: int, batch: int, seconds: float) -> dict[str, Any]:
    """A queue floor's result: ok only if every one of the ``n`` jobs was finished."""
    return {
        "ok": done == n,
        "n": n,
        "done": done,
        "batch": batch,
        "seconds": round(seconds, 4),
        "rate": round(done / seconds, 1),
    }


def _split_feeder(db: str, n: int, batch: int, deadline: float, pipe: Any) -> None:
    """queue_split's feeder process: acquire while at most ``3 × batch`` jobs are handed out and not
    acked, finish each list of acks the handler process sends; at the end send ``(done, cpu)``."""
    import pickle
    import uuid

    import psycopg

    from conveyor.backends._sql import load_queries

    q = load_queries("conveyor.backends.postgres")
    id_at, payload_at, receipt_at = column("id"), column("payload"), column("receipt")
    with psycopg.connect(db, autocommit=True) as acquirer, psycopg.connect(db, autocommit=True) as finisher:
        for conn in (acquirer, finisher):
            conn.execute(q["session_setup"])
        pipe.send_bytes(b"ready")
        pipe.recv_bytes()  # go
        cpu = time.process_time()
        handed = done = 0
        exhausted = False
        while done < n and time.monotonic() < deadline:
            if not exhausted and handed <= 2 * batch:
                rows = acquirer.execute(q["jobs_acquire"], acquire_params(batch, "floor"), prepare=True).fetchall()
                exhausted = not rows
                if rows:
                    pipe.send_bytes(pickle.dumps([(r[id_at].bytes, r[receipt_at], r[payload_at]) for r in rows]))
                    handed += len(rows)
                continue
            if pipe.poll(0.05):
                acks = [(uuid.UUID(bytes=i), receipt) for i, receipt in pickle.loads(pipe.recv_bytes())]
                finisher.execute(q["jobs_finish_many"], finish_params(acks), prepare=True)
                done += len(acks)
                handed -= len(acks)
        pipe.send_bytes(pickle.dumps((done, time.process_time() - cpu)))


async def _queue_split(db: str, n: int, batch: int, timeout: float) -> tuple[int, float, float]:
    """Jobs completed, the seconds taken and the feeder's CPU seconds (see the module docs)."""
    import json
    import multiprocessing
    import pickle
    from collections import deque

    from bench._common import body_async as body

    setup_jobs(db, n)
    here, there = multiprocessing.Pipe()
    feeder = multiprocessing.get_context("spawn").Process(
        target=_split_feeder, args=(db, n, batch, time.monotonic() + timeout, there), daemon=True
    )
    feeder.start()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, here.recv_bytes)  # its connections are open

    async def handler(sent: float = 0.0, i: int = 0) -> None:
        record(sent)
        await body()

    await body()  # connected before timing, as in the body floor
    ready: deque[Any] = deque()
    acks: list[tuple[bytes, str]] = []
    has_rows = asyncio.Event()
    ended: asyncio.Future[tuple[int, float]] = loop.create_future()

    def received() -> None:
        message = pickle.loads(here.recv_bytes())
        if isinstance(message, tuple):
            loop.remove_reader(here.fileno())
            ended.set_result(message)
        else:
            ready.extend(message)
        has_rows.set()

    async def slot() -> None:
        while True:
            while not ready:
                if ended.done():
                    return
                has_rows.clear()
                await has_rows.wait()
            job_id, receipt, payload = ready.popleft()
            await handler(**json.loads(payload))
            acks.append((job_id, receipt))

    async def flush() -> None:
        while not ended.done():
            await asyncio.sleep(0.005)
            if acks:
                here.send_bytes(pickle.dumps(acks))
                del acks[:]

    loop.add_reader(here.fileno(), received)
    t0 = time.perf_counter()
    here.send_bytes(b"go")
    await asyncio.gather(flush(), *(slot() for _ in range(10)))
    seconds = time.perf_counter() - t0
    feeder.join(10)
    done, feeder_cpu = ended.result()
    return done, seconds, feeder_cpu


def queue_split(db: str, n: int, batch: int, timeout: float) -> dict[str, Any]:
    os.environ.setdefault("BENCH_BODY", "redis")  # as in queue_async
    done, seconds, feeder_cpu = asyncio.run(_queue_split(db, n, batch, timeout))
    return {**_queue_result(n, done, batch, seconds), "feeder_cpu_us_per_job": round(1e6 * feeder_cpu / n, 1)}


def queue_threads(db: str, n: int, batch: int, timeout: float) -> dict[str, Any]:
    import json
    from collections import deque

    import psycopg

    os.environ.setdefault("BENCH_BODY", "redis")  # as in queue_async
    from bench._common import body_sync as body

    q = setup_jobs(db, n)
    id_at, payload_at, receipt_at = column("id"), column("payload"), column("receipt")

    def handler(sent: float = 0.0, i: int = 0) -> None:
        record(sent)
        body()

    body()  # connected before timing, as in the body floor
    lock = threading.Lock()
    has_rows, low = threading.Condition(lock), threading.Condition(lock)
    ready: deque[Any] = deque()
    acks: list[tuple[Any, str]] = []
    exhausted = False

    def slot() -> None:
        while True:
            with lock:
                while not ready:
                    if exhausted:
                        return
                    has_rows.wait()
                row = ready.popleft()
                if len(ready) == batch // 2:
                    low.notify()
            handler(**json.loads(row[payload_at]))
            with lock:
                acks.append((row[id_at], row[receipt_at]))

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(10)]
    done = 0
    with psycopg.connect(db, autocommit=True) as acquirer, psycopg.connect(db, autocommit=True) as finisher:
        for conn in (acquirer, finisher):
            conn.execute(q["session_setup"])
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.start()
        # The feeder: acquire when the rows fall to half a batch, finish every 5 ms, else wait.
        next_flush = time.monotonic()
        while done < n and time.monotonic() < deadline:
            with lock:
                fetch = not exhausted and len(ready) <= batch // 2
            if fetch:
                rows = acquirer.execute(q["jobs_acquire"], acquire_params(batch, "floor"), prepare=True).fetchall()
                with lock:
                    ready.extend(rows)
                    exhausted = not rows
                    has_rows.notify_all()
            now = time.monotonic()
            if now >= next_flush:
                next_flush = now + 0.005
                with lock:
                    taken = acks[:]
                    del acks[:]
                if taken:
                    finisher.execute(q["jobs_finish_many"], finish_params(taken), prepare=True)
                    done += len(taken)
                continue
            with lock:
                if exhausted or len(ready) > batch // 2:
                    low.wait(next_flush - now)
        seconds = time.perf_counter() - t0
    return _queue_result(n, done, batch, seconds)


_TABLE = """
DROP TABLE IF EXISTS pickup_floor;
CREATE TABLE pickup_floor (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'pending', sent float8 NOT NULL)
"""
_SEND = """
WITH inserted AS (INSERT INTO pickup_floor (sent) VALUES (%s) RETURNING id)
SELECT pg_notify('pickup_floor', '') FROM inserted
"""
_CLAIM = """
UPDATE pickup_floor SET state = 'processing'
WHERE id = (SELECT id FROM pickup_floor WHERE state = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING sent
"""


def pickup(db: str, n: int, interval: float) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(_TABLE)
    latencies: list[float] = []
    ready = threading.Event()
    stop = threading.Event()

    def listener() -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("LISTEN pickup_floor")
            ready.set()
            while not stop.is_set():
                # The generator holds the connection until it ends: claim after it returned.
                if not list(conn.notifies(timeout=0.2, stop_after=1)):
                    continue
                while True:
                    row = conn.execute(_CLAIM).fetchone()
                    if row is None:
                        break
                    latencies.append(time.time() - row[0])

    thread = threading.Thread(target=listener, daemon=True)
    thread.start()
    ready.wait(10)
    with psycopg.connect(db, autocommit=True) as producer:

        def send() -> None:
            # One statement, one round trip, one durable commit (as Conveyor's delay() sends it).
            producer.execute(_SEND, (time.time(),), prepare=True)

        for _ in range(5):
            send()
        time.sleep(1.0)
        del latencies[:]
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            send()
        deadline = time.monotonic() + 10
        while len(latencies) < n and time.monotonic() < deadline:
            time.sleep(0.01)
    stop.set()
    thread.join(5)
    lat = sorted(x * 1000 for x in latencies)
    return {
        "ok": len(lat) >= n,
        "n": n,
        "done": len(lat),
        "p50_ms": round(percentile(lat, 50), 3),
        "p99_ms": round(percentile(lat, 99), 3),
        "max_ms": round(lat[-1], 3) if lat else None,
    }


def pgbench_script(batch: int) -> str:
    """Conveyor's acquire and finish statements with pgbench's variables for their parameters: the
    acquire's ids and receipts come back as two arrays (``\\gset``) that the finish takes."""
    from conveyor.backends._sql import load_queries

    q = load_queries("conveyor.backends.postgres")
    acquire = q["jobs_acquire"]
    for name, value in {
        "queue": f"'{QUEUE}'",
        "now": "now()",
        "limit": str(batch),
        "visibility_timeout": "30.0",
        "worker_id": "'pgbench'",
    }.items():
        acquire = acquire.replace(f"%({name})s", value)
    # The statement's last SELECT (after the leased CTE) hands the rows out; pgbench needs them as two arrays.
    head, last, _ = acquire.rpartition("\nSELECT ")
    assert last and "FROM leased" in _, "jobs_acquire no longer ends with a SELECT from leased"
    acquire = head + "\nSELECT array_agg(id) AS ids, array_agg(receipt) AS receipts, count(*) AS n FROM leased"
    finish = q["jobs_finish_many"]
    n = "array_length(:ids::uuid[], 1)"
    for name, value in {
        "ids": ":ids::text",
        "receipts": ":receipts::text",
        "states": f"array_fill('completed'::text, ARRAY[{n}])::text",
        "results": f"array_fill(NULL::text, ARRAY[{n}])::text",
        "reasons": f"array_fill(NULL::text, ARRAY[{n}])::text",
        "error_types": f"array_fill(NULL::text, ARRAY[{n}])::text",
        "error_messages": f"array_fill(NULL::text, ARRAY[{n}])::text",
        "tracebacks": f"array_fill(NULL::text, ARRAY[{n}])::text",
        "ran": f"array_fill(true, ARRAY[{n}])::text",
        "counted": f"array_fill(false, ARRAY[{n}])::text",
    }.items():
        finish = finish.replace(f"%({name})b", f"({value})")
    finish = finish.replace("%(now)s", "now()")
    # psycopg's escaped percent sign (the queue counters' shard is pg_backend_pid() %% 8) is pgbench's plain one.
    acquire, finish = acquire.replace("%%", "%"), finish.replace("%%", "%")

    # pgbench reads one statement per line: fold each onto one line, comments dropped.
    def one_line(sql: str) -> str:
        return " ".join(line.split("--", 1)[0].strip() for line in sql.splitlines() if line.split("--", 1)[0].strip())

    return one_line(acquire) + "\n\\gset\n" + one_line(finish) + ";\n"


def pgbench(db: str, n: int, batch: int, clients: int) -> dict[str, Any]:
    setup_jobs(db, n)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)
    binary = found[0] if found else "pgbench"
    per_client = n // (batch * clients)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(pgbench_script(batch))
        script = f.name
    try:
        proc = subprocess.run(
            [binary, "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients), "-t", str(per_client),
             "-f", script, db],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        os.unlink(script)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", proc.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", proc.stdout)
    import psycopg

    with psycopg.connect(db) as conn:
        left = conn.execute("SELECT count(*) FROM jobs").fetchone()
        archived = conn.execute("SELECT count(*) FROM archive").fetchone()
    ok = proc.returncode == 0 and match is not None and left is not None and left[0] == n - per_client * clients * batch
    tps = float(match.group(1)) if match else 0.0
    return {
        "ok": ok,
        "n": n,
        "batch": batch,
        "clients": clients,
        "tps": tps,
        "rate": round(tps * batch, 1),
        "seconds": round(n / (tps * batch), 4) if tps else None,
        "left_in_jobs": left[0] if left else None,
        "archived": archived[0] if archived else None,
        "failed": int(failed.group(1)) if failed else None,
        "error": "" if ok else (proc.stdout + proc.stderr)[-2000:],
    }


def _positive(kind: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type: ``kind`` of the text, finite and > 0 (a batch of 0 would never end a queue floor)."""

    def parse(text: str) -> T:
        value = kind(text)
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse's message for text that is no number: "invalid int value"
    return parse


def pin_here() -> None:
    """Run this process (its one thread so far: every thread started later inherits it) on the CPU it
    is on now, as ``conveyor worker --pin`` does for a lone worker process."""
    with open("/proc/thread-self/stat", "rb") as f:
        cpu = int(f.read().rsplit(b")", 1)[1].split()[36])
    os.sched_setaffinity(0, {cpu})


def usage() -> tuple[int, float]:
    """This process's context switches (voluntary + involuntary) and CPU seconds so far, all its threads."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_nvcsw + u.ru_nivcsw, u.ru_utime + u.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    kinds = ["body_async", "body_threads", "queue_async", "queue_split", "queue_threads", "pickup", "pgbench"]
    parser.add_argument("kind", choices=kinds)
    parser.add_argument("--n", type=_positive(int), default=20_000)
    parser.add_argument("--db", default="")
    parser.add_argument("--interval", type=_positive(float), default=0.020)
    parser.add_argument("--batch", type=_positive(int), default=100)
    parser.add_argument("--clients", type=_positive(int), default=2)
    parser.add_argument("--timeout", type=_positive(float), default=300.0, help="queue floors: give up after (not ok)")
    parser.add_argument("--bare", action="store_true", help="body floors: the INCR without the handlers' stamp")
    parser.add_argument("--pin", action="store_true", help="run on one CPU, as `conveyor worker --pin` does")
    args = parser.parse_args()
    if args.pin:
        pin_here()
    # The body floors write the handlers' stamps too: to a file of their own, removed after.
    switches, cpu = usage()
    with tempfile.TemporaryDirectory(prefix="conveyor-floor-") as side:
        os.environ.setdefault("BENCH_SIDE_FILE", os.path.join(side, "side"))
        if args.kind == "body_async":
            result = body_async(args.n, not args.bare)
        elif args.kind == "body_threads":
            result = body_threads(args.n, not args.bare)
        elif args.kind == "queue_async":
            result = queue_async(args.db, args.n, args.batch, args.timeout)
        elif args.kind == "queue_split":
            result = queue_split(args.db, args.n, args.batch, args.timeout)
        elif args.kind == "queue_threads":
            result = queue_threads(args.db, args.n, args.batch, args.timeout)
        elif args.kind == "pickup":
            result = pickup(args.db, args.n, args.interval)
        else:
            result = pgbench(args.db, args.n, args.batch, args.clients)
    if args.kind not in ("pgbench", "pickup") and args.n:
        # This process's context switches and CPU (all its threads; set-up included) per job or body.
        switches_now, cpu_now = usage()
        result["switches_per_job"] = round((switches_now - switches) / args.n, 2)
        result["cpu_us_per_job"] = round(1e6 * (cpu_now - cpu) / args.n, 1)
    emit({"lib": "floor", "workload": args.kind, **result})


if __name__ == "__main__":
    main()
