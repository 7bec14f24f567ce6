"""Reading history and live rows: archive_read's watermark, jobs_list's cursor, job_get."""

from __future__ import annotations

from _factory import acquire, at, complete, dead, get, ids, insert, new_job

from conveyor.backends.base import ArchiveReadParams, Backend, JobsListParams


def _archive_jobs(backend: Backend, count: int, now_s: float, queue: str = "default") -> list[object]:
    """Insert, acquire and complete ``count`` jobs, all finishing at ``at(now_s)``; their ids."""
    jobs = [new_job(queue) for _ in range(count)]
    insert(backend, *jobs)
    deliveries = acquire(backend, queue=queue, limit=count)
    assert complete(backend, *deliveries, now=at(now_s)) == count
    return [job.id for job in jobs]


def test_archive_read_orders_by_finished_at_then_id(backend: Backend) -> None:
    late = _archive_jobs(backend, 2, now_s=20)
    early = _archive_jobs(backend, 3, now_s=10)

    rows = backend.archive_read(ArchiveReadParams(after=None))

    assert ids(rows) == sorted(early) + sorted(late)  # type: ignore[type-var]
    assert [r.finished_at for r in rows] == [at(10)] * 3 + [at(20)] * 2
    assert {r.state for r in rows} == {"completed"}


def test_archive_read_resumes_strictly_after_the_watermark(backend: Backend) -> None:
    _archive_jobs(backend, 3, now_s=10)
    _archive_jobs(backend, 4, now_s=20)
    everything = backend.archive_read(ArchiveReadParams(after=None))

    # Page through with a small limit, resuming from each page's last row; the pages must
    # cover the archive exactly once even where several rows share one finished_at.
    seen = []
    after = None
    while True:
        page = backend.archive_read(ArchiveReadParams(after=after, limit=2))
        if not page:
            break
        seen.extend(ids(page))
        last = page[-1]
        assert last.finished_at is not None
        after = (last.finished_at, last.id)

    assert seen == ids(everything)
    assert len(seen) == 7


def test_archive_read_after_the_last_row_is_empty_until_more_history(backend: Backend) -> None:
    _archive_jobs(backend, 2, now_s=10)
    rows = backend.archive_read(ArchiveReadParams(after=None))
    last = rows[-1]
    assert last.finished_at is not None
    watermark = (last.finished_at, last.id)

    assert backend.archive_read(ArchiveReadParams(after=watermark)) == []
    newer = _archive_jobs(backend, 1, now_s=30)
    assert ids(backend.archive_read(ArchiveReadParams(after=watermark))) == newer


def test_archive_read_includes_dead_letters_with_their_error(backend: Backend) -> None:
    insert(backend, new_job())
    (delivery,) = acquire(backend)
    dead(backend, delivery, now=at(5))

    (row,) = backend.archive_read(ArchiveReadParams(after=None))

    assert (row.id, row.state, row.error_type, row.reason) == (
        delivery.id,
        "dead",
        "RuntimeError",
        "max_attempts_exceeded",
    )


def test_jobs_list_returns_live_rows_in_id_order(backend: Backend) -> None:
    jobs = [new_job("a"), new_job("b"), new_job("a"), new_job("a")]
    insert(backend, *reversed(jobs))
    (taken,) = acquire(backend, queue="b")
    finished = _archive_jobs(backend, 1, now_s=1, queue="c")

    listed = backend.jobs_list(JobsListParams())

    assert ids(listed) == [j.id for j in jobs]
    assert finished[0] not in ids(listed)
    assert {r.state for r in listed} == {"pending", "processing"}
    assert get(backend, taken.id).state == "processing"


def test_jobs_list_filters_by_queue_and_pages_by_cursor(backend: Backend) -> None:
    jobs = [new_job("a") for _ in range(5)]
    insert(backend, *jobs, new_job("b"))

    page1 = backend.jobs_list(JobsListParams(queue="a", limit=2))
    page2 = backend.jobs_list(JobsListParams(queue="a", limit=2, after=page1[-1].id))
    page3 = backend.jobs_list(JobsListParams(queue="a", limit=2, after=page2[-1].id))

    assert ids(page1) + ids(page2) + ids(page3) == [j.id for j in jobs]
    assert len(page3) == 1
    assert {r.queue for r in page1 + page2 + page3} == {"a"}


def test_job_get_reads_live_and_archived_rows(backend: Backend) -> None:
    live, archived = new_job(), new_job()
    insert(backend, live, archived)
    deliveries = acquire(backend, limit=2)
    complete(backend, deliveries[1], now=at(3))

    live_record, archived_record = get(backend, live.id), get(backend, archived.id)

    assert live_record.state == "processing" and live_record.finished_at is None
    assert archived_record.state == "completed" and archived_record.finished_at == at(3)
