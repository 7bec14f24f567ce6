"""Task.delay_many: one job per payload in one round trip, each exactly what send_many would store for
a Message(task, payload); one bad payload enqueues nothing. Sizes on both sides of the PostgreSQL
COPY threshold (64), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conveyor import App, Message, PayloadError
from conveyor.testing import drain, enqueued

# Sampled: Conveyor's own traceparent says 01; once another test of the session has installed an
# OpenTelemetry SDK (the global tracer provider cannot be unset), the span's may add the random-trace-id
# flag (03). Either way, one per send.
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[13]")


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def stored(app: App, job_id: Any) -> dict[str, Any]:
    s = app.job(job_id)
    return {
        "queue": s.queue, "task": s.task, "payload": s.payload, "priority": s.priority,
        "max_attempts": s.max_attempts, "header_keys": sorted(s.headers),
    }  # fmt: skip


@pytest.mark.parametrize("n", [3, 100])
def test_delay_many_stores_what_send_many_stores_for_each_payload(app: App, n: int) -> None:
    @app.task(name="mail", queue="emails", priority=7, max_attempts=3)
    def mail(to: str, n: int) -> None: ...

    payloads = [{"to": f"user{i}@example.com", "n": i} for i in range(n)]
    jobs = mail.delay_many(payloads)
    twins = app.send_many([Message("mail", p) for p in payloads])

    assert len(jobs) == n and len({j.id for j in jobs}) == n
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)  # UUIDv7: in send order
    for job, twin, payload in zip(jobs, twins, payloads, strict=True):
        assert stored(app, job.id) == stored(app, twin.id)
        assert app.job(job.id).payload == payload
        headers = app.job(job.id).headers
        assert headers["correlation_id"] == str(job.id) and headers["schema_version"] == 1
    assert app.job(jobs[0].id).queue == "emails" and app.job(jobs[0].id).priority == 7
    done = drain(app, ["emails"])
    assert done.completed == 2 * n


@pytest.mark.parametrize("n", [3, 100])
def test_one_send_is_one_trace(app: App, n: int) -> None:
    @app.task(name="t")
    def t(i: int) -> None: ...

    first = {app.job(j.id).headers["traceparent"] for j in t.delay_many([{"i": i} for i in range(n)])}
    second = {app.job(j.id).headers["traceparent"] for j in app.send_many([Message("t", {"i": 0})] * 1)}
    many = {app.job(j.id).headers["traceparent"] for j in app.send_many([Message("t", {"i": i}) for i in range(n)])}
    assert len(first) == len(second) == len(many) == 1
    assert all(TRACEPARENT.fullmatch(tp) for tp in first | second | many)
    assert len(first | second | many) == 3


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "not a dict",
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": "nul\x00byte"},
        {"x": "\ud800"},
        {"x": object()},
        {"x": "y" * 2_000_000},
    ],
    ids=["none", "str", "nan", "inf", "nul", "surrogate", "object", "huge"],
)
@pytest.mark.parametrize("n", [3, 100])
def test_one_bad_payload_enqueues_none_of_the_batch(app: App, n: int, bad: Any) -> None:
    @app.task(name="t", queue="atomic")
    def t(i: int = 0) -> None: ...

    payloads: list[Any] = [{"i": i} for i in range(n)]
    payloads[n // 2] = bad
    with pytest.raises(PayloadError):
        t.delay_many(payloads)
    assert len(enqueued(app, queue="atomic")) == 0
    assert len(t.delay_many([{"i": 1}])) == 1  # the producer is fine afterwards


def test_delay_many_takes_any_iterable_and_refuses_a_single_payload(app: App) -> None:
    @app.task(name="t")
    def t(i: int = 0) -> None: ...

    assert t.delay_many([]) == []
    assert len(t.delay_many({"i": i} for i in range(5))) == 5
    for one in ({"i": 1}, "i", b"i"):
        with pytest.raises(PayloadError, match="delay_many takes a list of payloads"):
            t.delay_many(one)  # type: ignore[arg-type]
    assert len(asyncio.run(t.delay_many_async([{"i": 1}, {"i": 2}]))) == 2
    assert len(enqueued(app, queue="default")) == 7


def test_an_id_of_delay_many_resent_after_its_job_finished_is_not_run_again(app: App) -> None:
    # The ids delay_many mints are used once: resending one (a producer retrying a send whose
    # answer it lost) must find the archived job, not insert a second run of it.
    runs: list[int] = []

    @app.task(name="once", queue="once")
    def once(i: int) -> None:
        runs.append(i)

    jobs = once.delay_many([{"i": i} for i in range(100)])
    assert drain(app, ["once"]).completed == 100
    again = app.send_many([Message("once", {"i": i}, id=job.id) for i, job in enumerate(jobs)])
    assert [j.id for j in again] == [j.id for j in jobs]
    assert drain(app, ["once"]).completed == 0
    assert sorted(runs) == list(range(100))


@pytest.mark.parametrize("n", [3, 100])
def test_delay_many_on_the_callers_connection_commits_or_rolls_back_with_it(postgres_database: str, n: int) -> None:
    app = App(postgres_database, migrate=True)
    try:

        @app.task(name="t", queue="tx")
        def t(i: int) -> None: ...

        with psycopg.connect(postgres_database) as conn:
            t.delay_many([{"i": i} for i in range(n)], conn=conn)
            conn.rollback()
            assert len(enqueued(app, queue="tx")) == 0
            jobs = t.delay_many([{"i": i} for i in range(n)], conn=conn)
            assert len(enqueued(app, queue="tx")) == 0  # not committed yet
            conn.commit()
        assert len(enqueued(app, queue="tx")) == n
        assert app.job(jobs[-1].id).payload == {"i": n - 1}
    finally:
        app.close()


@pytest.mark.parametrize("conn", [False, True], ids=["pooled", "callers_connection"])
def test_a_bad_payload_of_a_batch_is_named_by_its_place(database_url: str, conn: bool) -> None:
    # Found by a hostile sweep: item 500 of 1,000 bad raised "payload is not JSON-serialisable" and no
    # more, on every engine, so a producer could not tell which of its 1,000 jobs to fix.
    from tests.conftest import driver_connection

    with App(database_url, migrate=True) as app:

        @app.task(name="t", queue="atomic")
        def t(i: int = 0) -> None: ...

        payloads: list[Any] = [{"i": i} for i in range(1_000)]
        payloads[500] = {"x": float("nan")}
        messages = [Message("t", {"i": i}) for i in range(1_000)]
        messages[500] = Message("t", {}, priority=2**40)
        app.send("warm-up", {})  # migrated before the caller's connection opens
        with driver_connection(database_url) as caller:
            on = caller if conn else None
            with pytest.raises(PayloadError, match=r"not JSON-serialisable .* \(job 500 of the send\)$"):
                t.delay_many(payloads, conn=on)
            with pytest.raises(PayloadError, match=r"^priority must be .* \(job 500 of the send\)$"):
                app.send_many(messages, conn=on)
            caller.rollback()
        assert len(enqueued(app, queue="atomic")) == 0
        # One job alone is not numbered: its error is about the only job there is.
        with pytest.raises(
            PayloadError, match=r"JSON-serialisable \(Out of range float values are not JSON compliant\); "
        ):
            t.delay_many([{"x": float("nan")}])
        with pytest.raises(PayloadError, match=r"finite number of seconds, got nan$"):
            t.send({}, delay=float("nan"))


def test_delay_many_refuses_what_is_not_a_list_of_payloads(app: App) -> None:
    # Found by a hostile sweep: delay_many(None) raised a bare TypeError ("'NoneType' object is not
    # iterable") instead of the PayloadError send_many(None) raises.
    @app.task(name="t")
    def t(i: int = 0) -> None: ...

    for bad in (None, 5, object()):
        with pytest.raises(PayloadError, match="delay_many takes a list of payloads"):
            t.delay_many(bad)  # type: ignore[arg-type]
