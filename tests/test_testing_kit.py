"""The testing kit users call in their own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor import App, JobContext
from conveyor.testing import assert_enqueued, drain, enqueued, run_job


@pytest.fixture(params=["sqlite", "memory"])
def app(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[App]:
    a = App(sqlite_url if request.param == "sqlite" else "memory://", migrate=True)
    yield a
    a.close()


def test_assert_enqueued(app: App) -> None:
    @app.task(queue="emails")
    def send(to: str, subject: str) -> None:
        pass

    send.delay(to="a@example.com", subject="hi")
    send.delay(to="b@example.com", subject="hi")
    assert len(assert_enqueued(app, send, to="a@example.com")) == 1
    assert_enqueued(app, send, {"subject": "hi"}, count=2)
    with pytest.raises(AssertionError, match="no job enqueued"):
        assert_enqueued(app, send, to="c@example.com")
    with pytest.raises(AssertionError, match="expected 1 job"):
        assert_enqueued(app, send, subject="hi", count=1)


def test_drain_runs_retries_without_sleeping(app: App) -> None:
    @app.task(queue="q", max_attempts=4, backoff=[3600])
    def flaky(ctx: JobContext) -> int:
        if ctx.attempt < 3:
            raise ConnectionError("not yet")
        return ctx.attempt

    @app.task(queue="q")
    def broken() -> None:
        raise ValueError("bad input")

    ok = flaky.delay()
    bad = broken.delay()
    result = drain(app)
    assert (result.started, result.completed, result.retried, result.dead) == (4, 1, 2, 1)
    assert ok.status().result == 3
    assert bad.status().state == "dead"
    assert enqueued(app) == []


def test_run_job_applies_the_real_policy(app: App) -> None:
    @app.task(queue="q", max_attempts=3, backoff=[60])
    def always_fails() -> None:
        raise RuntimeError("nope")

    status = run_job(app, always_fails)
    assert (status.state, status.attempts, status.reason) == ("dead", 3, "max_attempts_exceeded")


def test_drain_leaves_a_job_parked_at_the_latest_time_pending(app: App) -> None:
    # Before: drain moved its clock to the parked job's run_at, 9999-12-31, and its next acquire failed
    # ("BackendError: not a visibility timeout: 30.0 seconds", or an OverflowError): a lease there ends past the
    # last datetime. A job a producer accepts must not fail the kit.
    from conveyor._message import LATEST

    @app.task(queue="q")
    def work() -> None:
        pass

    parked = app.send(work, run_at=LATEST)
    done = work.delay()
    result = drain(app)
    assert (result.started, result.completed) == (1, 1)
    assert (done.status().state, parked.status().state) == ("completed", "pending")
    assert [job.id for job in enqueued(app)] == [parked.id]
