"""Job rows the worker did not expect (raw SQL: an operator's hand edit, another writer, an older release): the one
hostile row gets an outcome an operator can read, or runs, and the rest of its batch runs as usual."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from tests.conftest import run_statements

from conveyor import App, ConveyorError, UnreadableResult, Worker
from conveyor._job import JobError


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def run(app: App, timeout: float = 60) -> Worker:
    """Run a burst worker until its queues are empty; fail the test if it takes longer than ``timeout``."""
    worker = Worker(app, burst=True, poll_interval=0.02)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=timeout))
    return worker


def run_until(app: App, jobs: list[UUID], timeout: float = 60, **options: Any) -> None:
    """Run a worker until ``jobs`` are done or it stops (a burst worker waits for scheduled jobs too)."""

    async def main() -> None:
        worker = Worker(app, poll_interval=0.02, **options)
        running = asyncio.create_task(worker.run())
        try:
            while not running.done() and not all(app.admin.job(job).done for job in jobs):
                await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await running

    asyncio.run(asyncio.wait_for(main(), timeout=timeout))


def set_columns(url: str, job: UUID, assignments: str) -> None:
    """``UPDATE jobs SET <assignments>`` on one job, with the engine's own driver, as an operator would."""
    run_statements(url, f"UPDATE jobs SET {assignments} WHERE id = '{job}'")


def test_a_time_no_datetime_holds_stops_no_acquire_and_no_view(app: App, database_url: str) -> None:
    # Before: a run_at or expires_at before the year 1 (PostgreSQL's -infinity or a BC date, a negative number of
    # seconds on SQLite and MySQL) failed every acquire of its queue after the leases were taken (psycopg's
    # DataError, Python's ValueError), so none of its jobs ran; job show failed on it, on PostgreSQL on +infinity too.
    ran: list[str] = []

    @app.task(name="work", queue="q")
    def work(name: str) -> None:
        ran.append(name)

    names = ["good-1", "early", "expired", "never-expires", "enqueued-early", "enqueued-late", "good-2"]
    jobs = {name: app.send("work", {"name": name}).id for name in names}
    if database_url.startswith("postgresql"):
        before, after = "'-infinity'", "'infinity'"
        set_columns(database_url, jobs["early"], "run_at = '4000-01-01 BC'")
    else:
        # SQLite and MySQL keep unix seconds; -1e12 is the year -29719. MySQL's DOUBLE holds no infinity.
        before, after = "-1e12", "1e300"
        set_columns(database_url, jobs["early"], f"run_at = {before}")
    set_columns(database_url, jobs["expired"], f"expires_at = {before}")
    set_columns(database_url, jobs["never-expires"], f"expires_at = {after}")
    set_columns(database_url, jobs["enqueued-early"], f"enqueued_at = {before}")
    set_columns(database_url, jobs["enqueued-late"], f"enqueued_at = {after}")

    # The oldest ready job is read as due since the year 1 (before: "cannot subtract infinite timestamps").
    (waiting,) = app.admin.queues()
    assert 2000 * 365 * 86400 < waiting.oldest_pending_age < 2100 * 365 * 86400  # type: ignore[operator]

    run(app)

    assert sorted(ran) == sorted(set(names) - {"expired"})
    states = {name: app.admin.job(job).state for name, job in jobs.items()}
    assert states == {name: "expired" if name == "expired" else "completed" for name in names}
    # Read as the first and the last time a datetime holds.
    assert app.admin.job(jobs["enqueued-early"]).to_json()["enqueued_at"].startswith("0001-01-01T00:00:00")
    assert app.admin.job(jobs["enqueued-late"]).to_json()["enqueued_at"].startswith("9999-12-31T23:59:59")
    stats: Any = {q.queue: q for q in app.admin.queues()}
    assert (stats["q"].completed, stats["q"].expired) == (len(names) - 1, 1)


def _deep_json(url: str, levels: int) -> str:
    """SQL for a JSON object holding arrays nested ``levels`` deep (past Python's recursion limit)."""
    if url.startswith("postgresql"):
        return f"""('{{"n": ' || repeat('[', {levels}) || repeat(']', {levels}) || '}}')::jsonb"""
    if url.startswith("mysql://"):
        return f"""CONCAT('{{"n": ', REPEAT('[', {levels}), REPEAT(']', {levels}), '}}')"""
    return f"""'{{"n": ' || printf('%.*c', {levels}, '[') || printf('%.*c', {levels}, ']') || '}}'"""


def test_a_stored_payload_that_is_not_a_json_object_is_dead_at_once_saying_so(app: App, database_url: str) -> None:
    # Before: an array, a string or null reached the handler as **kwargs ("argument after ** must be a mapping,
    # not list", a TypeError: retried by a task whose dead_on leaves TypeError out), and JSON nested past the
    # recursion limit was a RecursionError, retried to max_attempts, on every engine.
    ran: list[int] = []

    @app.task(name="work", queue="q", max_attempts=3)
    def work(n: int) -> None:
        ran.append(n)

    jobs = [app.send("work", {"n": n}).id for n in range(6)]
    stored = {jobs[1]: "'[1, 2]'", jobs[2]: "'\"text\"'", jobs[3]: "'null'", jobs[4]: _deep_json(database_url, 3000)}
    for job, payload in stored.items():
        set_columns(database_url, job, f"payload = {payload}")

    run(app)

    assert sorted(ran) == [0, 5]
    kwargs = "a handler takes its payload's keys as keyword arguments"
    said = {
        jobs[1]: f"the stored payload is not a JSON object but an array: {kwargs}",
        jobs[2]: f"the stored payload is not a JSON object but a string: {kwargs}",
        jobs[3]: f"the stored payload is not a JSON object but null: {kwargs}",
        jobs[4]: "the stored payload is not JSON Python can read (maximum recursion depth exceeded while decoding",
    }
    for job, message in said.items():
        status = app.admin.job(job)
        assert (status.state, status.reason, status.attempts) == ("dead", "permanent_error", 1), status
        assert status.error is not None and status.error.type == "PayloadError"
        assert status.error.message.startswith(message)
    assert sorted(d.id for d in app.admin.dead_letters()) == sorted(said)


def test_headers_the_producer_would_refuse_are_dead_letters_that_say_why(app: App, database_url: str) -> None:
    # Before: a schema_version of 0, -1 or true ran the handler (the producer refuses each), and headers that are
    # not an object were dead as "the job's schema_version is not an integer is not supported".
    ran: list[int] = []

    @app.task(name="work", queue="q")
    def work(n: int) -> None:
        ran.append(n)

    jobs = [app.send("work", {"n": n}).id for n in range(6)]
    stored = {
        jobs[1]: ("'[1]'", "the job's headers are not a JSON object Python can read"),
        jobs[2]: ("""'{"schema_version": 0}'""", "the job's schema_version 0 is not an integer of at least 1"),
        jobs[3]: ("""'{"schema_version": -1}'""", "the job's schema_version -1 is not an integer of at least 1"),
        jobs[4]: ("""'{"schema_version": true}'""", "the job's schema_version true is not an integer of at least 1"),
    }
    for job, (headers, _) in stored.items():
        set_columns(database_url, job, f"headers = {headers}")

    run(app)

    assert sorted(ran) == [0, 5]
    for job, (_, why) in stored.items():
        status = app.admin.job(job)
        assert (status.state, status.reason, status.attempts) == ("dead", "unsupported_version", 0), status
        assert status.error == JobError(
            "UnsupportedVersion", f"{why}, not supported by task 'work' (handles up to 1)", ""
        )


def test_a_time_sqlite_keeps_as_text_is_read_as_later_than_any(sqlite_url: str) -> None:
    # Before: expires_at = 'tomorrow' (SQLite keeps text that is not a number as it is, in any column) failed the
    # acquire of its batch with a TypeError, and the worker stopped; run_at = '2024-01-01' made job show and every
    # listing of the job fail with a traceback. SQLite orders text after every number (never due, never expired):
    # such a time is read so, as the last time a datetime holds.
    with App(sqlite_url, migrate=True) as app:
        ran: list[int] = []

        @app.task(name="work", queue="q")
        def work(n: int) -> None:
            ran.append(n)

        jobs = [app.send("work", {"n": n}).id for n in range(4)]
        set_columns(sqlite_url, jobs[1], "run_at = '2024-01-01'")
        set_columns(sqlite_url, jobs[2], "expires_at = 'tomorrow'")

        run_until(app, [jobs[0], jobs[2], jobs[3]])

        assert sorted(ran) == [0, 2, 3]
        waiting = app.admin.job(jobs[1])
        assert (waiting.state, waiting.run_at.year) == ("pending", 9999)
        assert app.admin.job(jobs[2]).state == "completed"
        (stats,) = app.admin.queues()
        assert (stats.scheduled, stats.completed) == (1, 3)


def test_a_leased_row_without_a_lease_end_is_rescued(app: App, database_url: str) -> None:
    # Before: a row an operator set to processing by hand (to hold it, or copying another row), its lease_expires_at
    # NULL, was never rescued (NULL < now is not true) and never leased: processing for ever, on every engine.
    ran: list[int] = []

    @app.task(name="work", queue="q")
    def work(n: int) -> None:
        ran.append(n)

    jobs = [app.send("work", {"n": n}).id for n in range(3)]
    receipt = "gen_random_uuid()" if database_url.startswith("postgresql") else "'by-hand'"
    set_columns(database_url, jobs[1], f"state = 'processing', lease_expires_at = NULL, receipt = {receipt}")

    run_until(app, jobs, rescue_interval=0.05)

    assert sorted(ran) == [0, 1, 2]
    rescued = app.admin.job(jobs[1])
    assert (rescued.state, rescued.rescues) == ("completed", 1)


def test_a_row_whose_attempts_reach_its_max_is_dead_unrun(app: App, database_url: str) -> None:
    # Before: such a row ran (an attempt past its budget), and with attempts at the integer limit PostgreSQL and
    # MySQL refused to count its outcome ("integer out of range"): completed or dead, neither was stored, and the job
    # ran again at each lease's end until its delivery limit.
    ran: list[int] = []

    @app.task(name="work", queue="q")
    def work(n: int) -> None:
        ran.append(n)

    jobs = [app.send("work", {"n": n}).id for n in range(5)]
    set_columns(database_url, jobs[1], "attempts = 2147483647")
    set_columns(database_url, jobs[2], "attempts = 7, max_attempts = 3")
    set_columns(database_url, jobs[3], "max_attempts = 0")

    run(app)

    assert sorted(ran) == [0, 4]
    said = {
        jobs[1]: "attempts 2147483647 already reach max_attempts 5: not run",
        jobs[2]: "attempts 7 already reach max_attempts 3: not run",
        jobs[3]: "attempts 0 already reach max_attempts 0: not run",
    }
    for job, message in said.items():
        status = app.admin.job(job)
        assert (status.state, status.reason) == ("dead", "max_attempts_exceeded"), status
        assert status.error == JobError("AttemptsExhausted", message, "")


def test_a_stored_result_python_cannot_read_raises_for_a_program_and_shows_in_listings(
    app: App, database_url: str
) -> None:
    # Before: the unreadable result read as the note {"unreadable": "..."}, the very dict the first handler returns,
    # so a program reading job.wait().result could not tell a result it cannot have from a real one.
    @app.task(name="work", queue="q")
    def work(n: int) -> Any:
        return {"unreadable": "the handler's own word"} if n == 0 else {"n": n}

    jobs = [app.send("work", {"n": n}) for n in range(4)]
    run(app)
    if database_url.startswith("postgresql"):
        not_json = """('{"n": ' || repeat('9', 5000) || '}')::jsonb"""  # past Python's 4,300 digits
    else:
        not_json = "'{\"n\": 1'"
    stored = {jobs[1].id: not_json, jobs[2].id: _deep_json(database_url, 3000)}
    run_statements(database_url, *(f"UPDATE archive SET result = {v} WHERE id = '{job}'" for job, v in stored.items()))

    real = jobs[0].wait(timeout=5)
    assert (real.result, real.unreadable) == ({"unreadable": "the handler's own word"}, {})
    assert real.to_json()["result"] == {"unreadable": "the handler's own word"} and real.to_json()["unreadable"] == {}
    assert app.job(jobs[3].id).result == {"n": 3}
    why = "the stored result is not JSON Python can read ("
    for job in jobs[1:3]:
        for status in (job.status(), job.wait(timeout=5), asyncio.run(job.wait_async(timeout=5)), app.job(job.id)):
            assert status.state == "completed" and status.done
            assert list(status.unreadable) == ["result"] and status.unreadable["result"].startswith(why)
            with pytest.raises(UnreadableResult, match=f"job {job.id}: the stored result is not JSON") as raised:
                status.result  # noqa: B018 - reading it is the test
            assert isinstance(raised.value, ConveyorError) and raised.value.why == status.unreadable["result"]
            # As a process pool hands it back (pickled), and as copy makes it: before, a TypeError (a missing 'why').
            for again in (pickle.loads(pickle.dumps(raised.value)), copy.deepcopy(raised.value)):
                assert (type(again), str(again), again.why) == (UnreadableResult, str(raised.value), raised.value.why)
        # A listing (``conveyor job ID``, the HTTP API, the dashboard) shows no result and says why.
        shown = app.admin.job(job.id).to_json()
        assert shown["result"] is None and shown["unreadable"]["result"].startswith(why)
        assert json.loads(json.dumps(shown)) == shown
