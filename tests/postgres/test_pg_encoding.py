"""Databases whose encoding is not UTF-8. SQL_ASCII stores bytes unchecked: Conveyor's sessions speak UTF-8 to
it, so that its text comes back as text. LATIN1 holds 'é' but not '€': text it cannot store is refused like any
value the database refuses, for the one job or request that holds it, never its batch or its worker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from conveyor import App, BackendError, PayloadError, Worker


def _drain(app: App) -> dict[str, list[str]]:
    """Three jobs each of a task that fails with '€' in its error (retried once), one that returns '€',
    one that returns 'é'; run by a burst worker, which must end cleanly. Their ids by task."""
    runs: dict[int, int] = {}

    @app.task(queue="q", max_attempts=2, backoff=[0])
    def fails(i: int) -> None:
        runs[i] = runs.get(i, 0) + 1
        raise ConnectionError("prix: 5 € (café)")  # transient: retried

    @app.task(queue="q")
    def returns(i: int) -> str:
        return "5 €"

    @app.task(queue="q")
    def good(i: int) -> dict[str, str]:
        return {"café": "crème"}

    tasks = {"fails": fails, "returns": returns, "good": good}
    ids = {name: [str(t.delay(i=i).id) for i in range(3)] for name, t in tasks.items()}
    worker = Worker(app, burst=True, poll_interval=0.02, concurrency=4)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    assert worker.exit_code == 0
    assert runs == {0: 2, 1: 2, 2: 2}  # a failure is still a failure, retried as its task says
    for job_id in ids["good"]:
        assert (app.job(job_id).state, app.job(job_id).result) == ("completed", {"café": "crème"})
    for job_id in ids["fails"]:
        assert (app.job(job_id).state, app.job(job_id).attempts) == ("dead", 2)
    return ids


def test_a_sql_ascii_database_runs_jobs_and_keeps_their_text(postgres_database_in: Callable[[str], str]) -> None:
    # Before: psycopg read every text column of a SQL_ASCII database as bytes, so no acquired job
    # matched its task or its receipt: every job ended dead, none ran.
    with App(postgres_database_in("SQL_ASCII"), migrate=True) as app:
        app.send("t", {"price": "5 €"}, queue="prix €")
        ids = _drain(app)
        for job_id in ids["fails"]:
            error = app.job(job_id).error
            assert error is not None and error.message == "prix: 5 € (café)"
        for job_id in ids["returns"]:
            assert (app.job(job_id).state, app.job(job_id).result) == ("completed", "5 €")
        assert {q.queue: q.pending for q in app.admin.queues()}["prix €"] == 1


def test_a_handler_whose_error_or_result_latin1_cannot_hold_harms_no_other_job(
    postgres_database_in: Callable[[str], str],
) -> None:
    # Before: psycopg's UnicodeEncodeError escaped the completer, which ended the worker (exit 1) with
    # the good jobs of the same batch unacknowledged.
    with App(postgres_database_in("LATIN1"), migrate=True) as app:
        ids = _drain(app)
        for job_id in ids["fails"]:  # its error kept, with what LATIN1 cannot hold escaped
            error = app.job(job_id).error
            assert error is not None and error.message == "prix: 5 \\u20ac (café)"
        for job_id in ids["returns"]:  # a result it cannot hold ends its job dead, saying why
            job = app.job(job_id)
            assert (job.state, job.reason) == ("dead", "outcome_refused")
            assert job.error is not None and "cannot store U+20AC EURO SIGN" in job.error.message


def test_an_error_type_latin1_cannot_hold_is_escaped_to_what_a_filter_can_name(
    postgres_database_in: Callable[[str], str],
) -> None:
    # Before: '€' escaped as \u20ac made a 40-character class name a 240-character type, past the 200 characters
    # of a dead-letter filter: no `dlq list/replay --error-type` could name it.
    with App(postgres_database_in("LATIN1"), migrate=True) as app:

        @app.task(queue="q", max_attempts=1)
        def fails() -> None:
            raise type("€" * 40, (Exception,), {})("prix")

        job = fails.delay()
        worker = Worker(app, burst=True, poll_interval=0.02)
        asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
        error = app.job(job.id).error
        assert error is not None and error.message == "prix"
        assert error.type == "\\u20ac" * 28 + "\\u... (a name of 240 characters)"
        assert [d.id for d in app.admin.dead_letters(queue="q", error_type=error.type)] == [job.id]


def test_text_latin1_cannot_hold_in_a_filter_or_a_job_is_a_payload_error_naming_it(
    postgres_database_in: Callable[[str], str],
) -> None:
    with App(postgres_database_in("LATIN1"), migrate=True) as app:
        for call in (
            lambda: app.admin.dead_letters(task="t€"),
            lambda: app.send("t", queue="q€"),
            lambda: app.send("t", {"price": "5 €"}),
        ):
            with pytest.raises(PayloadError, match="cannot store U\\+20AC EURO SIGN") as caught:
                call()
            assert isinstance(caught.value, BackendError)  # a value the database refuses, too
        app.send("t", {"price": "café"}, queue="é")  # what LATIN1 holds goes through
