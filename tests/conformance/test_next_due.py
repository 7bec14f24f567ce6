"""``Backend.jobs_next_due``: when the earliest scheduled job a backend knows of comes due, from memory.

An idle worker wakes at that time instead of at its next poll (see conveyor.backends._promotion). A backend
knows the scheduled jobs it wrote (inserts, retries' backoffs) and what its last acquire of a queue found
scheduled; a job another process scheduled since is found by the next acquire, never before."""

from __future__ import annotations

from _factory import T0, acquire, at, ids, insert, new_job, retry

from conveyor.backends import open_backend
from conveyor.backends.base import Backend, JobsAcquireParams


def test_nothing_is_known_to_come_due_until_a_job_is_scheduled(backend: Backend) -> None:
    assert backend.jobs_next_due(["default"]) is None
    insert(backend, new_job(), new_job(run_at=T0))
    assert backend.jobs_next_due(["default"]) is None
    assert backend.jobs_next_due([]) is None


def test_the_earliest_scheduled_job_of_the_named_queues_is_known_once_written(backend: Backend) -> None:
    insert(backend, new_job(run_at=at(60)), new_job(run_at=at(45)), new_job("other", run_at=at(30)))
    insert(backend, new_job(run_at=at(90)))

    assert backend.jobs_next_due(["default"]) == at(45)
    assert backend.jobs_next_due(["other"]) == at(30)
    assert backend.jobs_next_due(["default", "other"]) == at(30)
    assert backend.jobs_next_due(["neither"]) is None


def test_an_acquire_learns_what_another_process_scheduled_and_moves_on_as_jobs_come_due(
    backend: Backend, database_url: str
) -> None:
    producer = open_backend(database_url)
    try:
        first, second = new_job(run_at=at(20)), new_job(run_at=at(40))
        insert(producer, first, second, new_job("other", run_at=at(10)))
    finally:
        producer.close()
    assert backend.jobs_next_due(["default"]) is None  # not written by this backend, not acquired yet

    assert acquire(backend, now=at(0)) == []
    assert backend.jobs_next_due(["default"]) == at(20)
    assert ids(acquire(backend, now=at(20))) == [first.id]
    assert backend.jobs_next_due(["default"]) == at(40)
    assert ids(acquire(backend, now=at(41))) == [second.id]
    assert backend.jobs_next_due(["default"]) is None
    assert backend.jobs_next_due(["other"]) is None  # never acquired from: unknown here


def test_a_retry_whose_backoff_is_ahead_is_known_to_come_due(backend: Backend) -> None:
    insert(backend, new_job(), new_job())
    a, b = acquire(backend)
    assert backend.jobs_next_due(["default"]) is None

    assert retry(backend, a, run_at=at(30), now=at(1)) == 1
    assert retry(backend, b, run_at=at(1), now=at(1)) == 1  # due at once: pending, nothing to wait for
    assert backend.jobs_next_due(["default"]) == at(30)
    assert ids(acquire(backend, now=at(2))) == [b.id]
    assert backend.jobs_next_due(["default"]) == at(30)
    assert ids(acquire(backend, now=at(30))) == [a.id]
    assert backend.jobs_next_due(["default"]) is None


def test_a_stale_retry_tells_nothing(backend: Backend) -> None:
    insert(backend, new_job())
    (a,) = acquire(backend)
    assert retry(backend, a, run_at=at(30), now=at(1)) == 1
    assert ids(acquire(backend, now=at(30))) == [a.id]
    assert backend.jobs_next_due(["default"]) is None

    assert retry(backend, a, run_at=at(90), now=at(31)) == 0  # the first receipt: fenced
    assert backend.jobs_next_due(["default"]) is None


def test_an_acquire_without_promote_leaves_due_scheduled_jobs_to_the_next_acquire(
    backend: Backend, database_url: str
) -> None:
    # JobsAcquireParams.promote: False skips the promotion on every engine (before, SQLite and MySQL promoted
    # anyway: the flag was ignored), and the next acquire that promotes hands the job out, once.
    ready = new_job()
    insert(backend, ready)
    producer = open_backend(database_url)
    try:
        later = new_job(run_at=at(10))
        insert(producer, later)
    finally:
        producer.close()
    skipped = backend.jobs_acquire(JobsAcquireParams("default", 10, 30.0, "w", at(20), promote=False))
    assert ids(skipped) == [ready.id]
    assert backend.jobs_next_due(["default"]) is None  # no promotion: nothing learnt
    assert ids(acquire(backend, now=at(20))) == [later.id]
    assert acquire(backend, now=at(21)) == []
