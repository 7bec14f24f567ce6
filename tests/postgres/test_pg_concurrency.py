"""Races that only a real server can stage: dedup under concurrent sends, SKIP LOCKED among
competing workers, per-key FIFO under concurrency, and the plans the hot statements use."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from uuid import UUID

import psycopg
from _pg import T0, acquire, at, complete, insert, live_ids, make_job

from conveyor.backends.base import Delivery
from conveyor.backends.postgres import PostgresBackend


def _race(count: int, work: Callable[[int], None]) -> None:
    """Run ``work(i)`` on ``count`` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]


def test_eight_concurrent_sends_of_one_key_make_exactly_one_job(pg: PostgresBackend) -> None:
    for round_ in range(5):
        key = f"order-{round_}"
        returned: list[UUID] = []

        def send(i: int, key: str = key, returned: list[UUID] = returned) -> None:
            job = make_job("billing", idempotency_key=key, dedup_until=at(3600))
            returned.extend(insert(pg, job))

        _race(8, send)

        assert len(set(returned)) == 1, returned
        assert returned[0] in live_ids(pg, "billing")
    assert len(live_ids(pg, "billing")) == 5


def test_concurrent_sends_from_separate_backends_dedup_too(pg: PostgresBackend, postgres_database: str) -> None:
    backends = [PostgresBackend(postgres_database) for _ in range(4)]
    returned: list[UUID] = []
    try:

        def send(i: int) -> None:
            # Each batch also carries its own unkeyed job and the keys in a different order,
            # which must neither deadlock nor duplicate.
            keys = ["a", "b", "c"] if i % 2 else ["c", "b", "a"]
            jobs = [make_job("q", idempotency_key=k, dedup_until=at(60)) for k in keys]
            ids = insert(backends[i], *jobs, make_job("q"))
            returned.extend(ids[:3])

        _race(4, send)
    finally:
        for backend in backends:
            backend.close()
    assert len(set(returned)) == 3
    assert len(live_ids(pg, "q")) == 3 + 4


def test_an_expired_key_is_taken_over_by_exactly_one_concurrent_send(pg: PostgresBackend) -> None:
    first = make_job("q", idempotency_key="k", dedup_until=at(10))
    insert(pg, first)
    returned: list[UUID] = []

    def send(i: int) -> None:
        returned.extend(insert(pg, make_job("q", idempotency_key="k", dedup_until=at(100)), now=at(20)))

    _race(8, send)
    assert len(set(returned)) == 1 and returned[0] != first.id
    assert sorted(live_ids(pg, "q")) == sorted([first.id, returned[0]])


def test_competing_workers_never_receive_the_same_job(pg: PostgresBackend) -> None:
    total = 3000
    for start in range(0, total, 1000):
        insert(pg, *[make_job("work", priority=n % 3) for n in range(start, start + 1000)])
    delivered: list[UUID] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        while True:
            batch = acquire(pg, "work", limit=25, worker_id=f"w{i}")
            if not batch:
                return
            with lock:
                delivered.extend(d.id for d in batch)
            assert complete(pg, *batch) == len(batch)

    _race(6, worker)

    counts = Counter(delivered)
    assert len(counts) == total
    assert counts.most_common(1)[0][1] == 1
    assert live_ids(pg, "work") == []


def test_per_key_fifo_holds_under_competing_workers(pg: PostgresBackend) -> None:
    keys = [f"account-{k}" for k in range(5)]
    jobs = [make_job("fifo", ordering_key=keys[n % 5]) for n in range(100)]
    insert(pg, *jobs)
    order = {job.id: n for n, job in enumerate(jobs)}
    in_flight: dict[str, UUID] = {}
    finished: dict[str, list[int]] = {k: [] for k in keys}
    lock = threading.Lock()

    def worker(i: int) -> None:
        idle = 0
        while idle < 50:
            batch = acquire(pg, "fifo", limit=3, worker_id=f"w{i}")
            if not batch:
                idle += 1
                if not live_ids(pg, "fifo"):
                    return
                continue
            with lock:
                for d in batch:
                    assert d.ordering_key is not None
                    assert d.ordering_key not in in_flight, "two jobs of one key in flight"
                    in_flight[d.ordering_key] = d.id
            with lock:
                for d in batch:
                    assert d.ordering_key is not None
                    del in_flight[d.ordering_key]
                    finished[d.ordering_key].append(order[d.id])
            assert complete(pg, *batch) == len(batch)

    _race(4, worker)
    for key in keys:
        assert len(finished[key]) == 20
        assert finished[key] == sorted(finished[key]), f"{key} ran out of order"


def _plan(conn: psycopg.Connection[tuple[object, ...]], query: str, params: dict[str, object]) -> str:
    with conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + query, params).fetchall()
    return "\n".join(str(row[0]) for row in rows)


def test_the_hot_statements_use_their_indexes(pg: PostgresBackend, postgres_database: str) -> None:
    for _ in range(5):
        insert(pg, *[make_job("plans") for _ in range(2000)])
    deliveries: list[Delivery] = acquire(pg, "plans", limit=500)
    complete(pg, *deliveries[:400])
    held = deliveries[400:]
    queries = pg._q
    with psycopg.connect(postgres_database) as conn:
        conn.execute("ANALYZE jobs")
        acquire_plan = _plan(
            conn,
            queries["jobs_acquire"],
            {"queue": "plans", "limit": 100, "visibility_timeout": 30.0, "worker_id": "x", "now": T0, "start": 10},
        )
        finish_plan = _plan(
            conn,
            queries["jobs_finish_many"],
            {
                "ids": [d.id for d in held],
                "receipts": [UUID(d.receipt) for d in held],
                "states": ["completed"] * len(held),
                "results": [None] * len(held),
                "reasons": [None] * len(held),
                "error_types": [None] * len(held),
                "error_messages": [None] * len(held),
                "tracebacks": [None] * len(held),
                "ran": [True] * len(held),
                "now": T0 + timedelta(seconds=1),
            },
        )
    assert "jobs_ready_idx" in acquire_plan, acquire_plan
    assert "Seq Scan" not in acquire_plan, acquire_plan
    # Outcomes find deliveries by primary key, never through the lease index, whose entries
    # for recently finished rows are dead until vacuum.
    assert "jobs_pkey" in finish_plan, finish_plan
    assert "jobs_lease_idx" not in finish_plan, finish_plan
