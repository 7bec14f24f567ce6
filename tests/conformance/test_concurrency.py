"""Concurrent consumers never receive the same job twice: threads, backends and processes."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import _procs
import pytest
from _factory import at, complete, insert, new_job

from conveyor.backends import open_backend
from conveyor.backends._sql import load_migrations
from conveyor.backends.base import Backend, Delivery, JobsAcquireParams, JobsListParams

THREADS = 8
JOBS = 400
#: The injected clock of every acquire here: all jobs are ready at T0.
NOW = at(1)


class _Observer:
    """Hooks a draining thread calls around each batch; the default does nothing."""

    def acquired(self, batch: list[Delivery]) -> None:
        pass

    def completing(self, batch: list[Delivery]) -> None:
        pass


def _drain_in_threads(backends: list[Backend], queue: str, observer: _Observer | None = None) -> list[UUID]:
    """Run one draining thread per backend, all released at once; return every id handed out."""
    observer = observer or _Observer()
    barrier = threading.Barrier(len(backends))
    seen: list[list[UUID]] = [[] for _ in backends]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        backend = backends[index]
        try:
            barrier.wait(timeout=30)
            while True:
                batch = backend.jobs_acquire(
                    JobsAcquireParams(
                        queue=queue, limit=3, visibility_timeout=300, worker_id=f"thread-{index}", now=NOW
                    )
                )
                if not batch:
                    return
                observer.acquired(batch)
                seen[index].extend(d.id for d in batch)
                observer.completing(batch)
                assert complete(backend, *batch, now=NOW) == len(batch)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(backends))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return [job_id for ids in seen for job_id in ids]


def _assert_each_job_exactly_once(handed_out: list[UUID], expected: list[UUID]) -> None:
    duplicates = [job_id for job_id, n in Counter(handed_out).items() if n > 1]
    assert duplicates == []
    assert sorted(handed_out) == sorted(expected)


@pytest.fixture
def more_backends(database_url: str) -> Iterator[Callable[[], Backend]]:
    """Opens extra backends on the test's database (separate pools/connections); closes them."""
    opened: list[Backend] = []

    def make() -> Backend:
        backend = open_backend(database_url)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


def test_threads_sharing_one_backend_never_get_the_same_job(backend: Backend) -> None:
    jobs = [new_job("shared") for _ in range(JOBS)]
    insert(backend, *jobs)

    handed_out = _drain_in_threads([backend] * THREADS, "shared")

    _assert_each_job_exactly_once(handed_out, [j.id for j in jobs])
    assert backend.jobs_list(JobsListParams(queue="shared")) == []


def test_threads_on_separate_backends_never_get_the_same_job(
    backend: Backend, more_backends: Callable[[], Backend]
) -> None:
    jobs = [new_job("spread") for _ in range(JOBS)]
    insert(backend, *jobs)
    backends = [more_backends() for _ in range(4)]

    handed_out = _drain_in_threads(backends, "spread")

    _assert_each_job_exactly_once(handed_out, [j.id for j in jobs])


class _KeyWatch(_Observer):
    """Records, per ordering key, the hand-out order, and fails on two jobs of one key in flight.

    A job is marked done *before* its completion is written: the next job of its key can only be
    acquired after that write commits, so any overlap seen here is a real FIFO violation."""

    def __init__(self, key_of: dict[UUID, str | None]) -> None:
        self.key_of = key_of
        self.lock = threading.Lock()
        self.in_flight: set[str] = set()
        self.order: dict[str, list[UUID]] = {}
        self.overlaps: list[UUID] = []

    def acquired(self, batch: list[Delivery]) -> None:
        with self.lock:
            for d in batch:
                key = self.key_of[d.id]
                assert key is not None
                if key in self.in_flight:
                    self.overlaps.append(d.id)
                self.in_flight.add(key)
                self.order.setdefault(key, []).append(d.id)

    def completing(self, batch: list[Delivery]) -> None:
        with self.lock:
            for d in batch:
                key = self.key_of[d.id]
                assert key is not None
                self.in_flight.discard(key)


def test_per_key_fifo_holds_under_concurrency(backend: Backend) -> None:
    jobs = [new_job("fifo", ordering_key=f"k{n % 4}") for n in range(120)]
    insert(backend, *jobs)
    watch = _KeyWatch({j.id: j.ordering_key for j in jobs})

    handed_out = _drain_in_threads([backend] * 6, "fifo", watch)

    _assert_each_job_exactly_once(handed_out, [j.id for j in jobs])
    assert watch.overlaps == []
    for key, order in watch.order.items():
        assert order == [j.id for j in jobs if j.ordering_key == key]


def _run_processes(target: Callable[..., None], args_for: Callable[[str], tuple[Any, ...]], n: int) -> dict[str, Any]:
    """Start ``n`` spawned processes on ``target`` behind one barrier; return their results by id."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(f"proc-{i}"), barrier, results)) for i in range(n)]
    try:
        for proc in procs:
            proc.start()
        collected = dict(results.get(timeout=120) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()
        results.close()
        results.join_thread()
    return collected


def test_processes_on_one_sqlite_file_never_get_the_same_job(sqlite_url: str) -> None:
    producer = open_backend(sqlite_url)
    try:
        producer.migrate()
        jobs = [new_job("procs") for _ in range(600)]
        insert(producer, *jobs)

        results = _run_processes(_procs.drain, lambda wid: (sqlite_url, "procs", NOW, wid), 4)

        handed_out = [UUID(i) for seen in results.values() for i in seen]
        _assert_each_job_exactly_once(handed_out, [j.id for j in jobs])
        assert producer.jobs_list(JobsListParams(queue="procs")) == []
    finally:
        producer.close()


def test_concurrent_migrate_from_processes_applies_once(sqlite_url: str) -> None:
    results = _run_processes(_procs.migrate, lambda wid: (sqlite_url, wid), 4)

    every_migration = tuple(m.name for m in load_migrations("conveyor.backends.sqlite"))
    outcomes = sorted(map(tuple, results.values()))  # type: ignore[arg-type]
    assert outcomes == [(), (), (), every_migration], results
