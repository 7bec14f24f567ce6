"""Large batches without idempotency keys go in by COPY: same rows, same notifications, same
all-or-nothing, and a resent live id still changes nothing. Every test runs with both of COPY's
formats (text below the backend's TEXT_MAX jobs, binary from there on)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any
from uuid import UUID

import psycopg
import pytest
from _pg import T0, acquire, at, insert
from _pg import make_job as any_job

from conveyor import App, Message, PayloadError
from conveyor.backends.base import Backend, JobsInsertParams, JobsListParams, NewJob
from conveyor.backends.postgres import PostgresBackend, _backend

N = 200  # over the backend's COPY threshold


def make_job(queue: str = "default", **overrides: Any) -> NewJob:
    """A job whose id was minted for it (``fresh``), as a producer's: COPY takes those only."""
    return replace(any_job(queue, **overrides), fresh=True)


@pytest.fixture(params=["text", "binary"], autouse=True)
def copy_format(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str]]:
    """The format this test's COPYs use, and the formats the backend wrote rows in (a list)."""
    if request.param == "binary":
        monkeypatch.setattr(_backend, "TEXT_MAX", 0)
    used: list[str] = []

    def counted(fmt: str, write: Callable[..., None]) -> Callable[..., None]:
        def writer(*args: Any) -> None:
            used.append(fmt)
            write(*args)

        return writer

    monkeypatch.setattr(_backend, "write_text", counted("text", _backend.write_text))
    monkeypatch.setattr(_backend, "write_binary", counted("binary", _backend.write_binary))
    return request.param, used


def live_ids(pg: Backend, queue: str) -> list[UUID]:
    return [r.id for r in pg.jobs_list(JobsListParams(queue=queue, limit=10 * N))]


def test_a_copied_batch_stores_every_field(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]], copy_format: tuple[str, list[str]]
) -> None:
    # Text COPY's special characters (tab, newline, carriage return, backslash) in every text field,
    # JSON with raw whitespace between its tokens, non-ASCII text, and jobs still scheduled.
    awkward = 'é\t\\N\\\n\r"'
    jobs = [
        make_job(
            "bulk",
            task=f"tasks.{awkward}{n % 2}",
            payload=json.dumps({"n": n, "text": 'é\\"\n' + awkward}, indent="\t" if n % 3 else None),
            headers=json.dumps({"schema_version": 1, "n": n, "key": awkward}),
            priority=n % 3,
            run_at=at(n - N // 2),
            expires_at=at(3600 + n) if n % 2 else None,
            max_attempts=3,
            max_deliveries=4,
            ordering_key=f"k{n % 5}{awkward}" if n % 4 == 0 else None,
        )
        for n in range(N)
    ]
    assert insert(pg, *jobs, now=T0) == [j.id for j in jobs]
    assert copy_format[1] == [copy_format[0]]

    records = {r.id: r for r in pg.jobs_list(JobsListParams(queue="bulk", limit=10 * N))}
    assert len(records) == N
    for n, job in enumerate(jobs):
        r = records[job.id]
        assert (r.task, r.priority, r.run_at, r.enqueued_at) == (f"tasks.{awkward}{n % 2}", n % 3, at(n - N // 2), T0)
        assert json.loads(r.payload) == {"n": n, "text": 'é\\"\n' + awkward}
        assert json.loads(r.headers) == {"schema_version": 1, "n": n, "key": awkward}
        assert r.expires_at == (at(3600 + n) if n % 2 else None)
        assert (r.max_attempts, r.max_deliveries, r.attempts, r.deliveries) == (3, 4, 0, 0)
        assert r.ordering_key == (f"k{n % 5}{awkward}" if n % 4 == 0 else None)
        assert r.idempotency_key is None and r.replay_of is None
    # The jobs due at T0 are ready now, the later ones wait for their time.
    states = admin.execute("SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state").fetchall()
    assert states == [("pending", N // 2 + 1), ("scheduled", N // 2 - 1)]


def test_a_batch_of_stale_ids_is_not_copied(pg: PostgresBackend, copy_format: tuple[str, list[str]]) -> None:
    # An id that was not minted for its job may be in the archive: the statement path probes it.
    assert insert(pg, *[any_job("bulk") for _ in range(N)]) != []
    assert copy_format[1] == []
    assert len(live_ids(pg, "bulk")) == N


def test_a_copied_batch_notifies_each_of_its_queues(pg: PostgresBackend) -> None:
    a, b = pg.listen(["a"]), pg.listen(["b"])
    try:
        insert(pg, *[make_job("a") for _ in range(N)], make_job("b"))
        assert a.wait(5) is True and b.wait(5) is True
        assert a.wait(0.2) is False  # one notification per queue, not per job
    finally:
        a.close()
        b.close()


def test_a_copied_batch_notifies_queues_whose_names_need_quoting(pg: PostgresBackend) -> None:
    # The notifications are NOTIFY statements with the queue as a literal: a quote, a backslash, a
    # semicolon or non-ASCII text in a name is the name, never SQL.
    names = ["it's", "back\\slash", "semi; COMMIT; --", "名前"]
    listeners = [pg.listen([n]) for n in names]
    try:
        insert(pg, *[make_job(n) for n in names for _ in range(N // 4)])
        assert [listener.wait(5) for listener in listeners] == [True] * len(names)
        assert sorted({j.queue for j in pg.jobs_list(JobsListParams(limit=1000))}) == sorted(names)
    finally:
        for listener in listeners:
            listener.close()


def test_a_large_batch_resending_a_live_id_inserts_the_others_and_keeps_the_live_one(pg: PostgresBackend) -> None:
    live = make_job("bulk", payload=json.dumps({"v": 1}))
    insert(pg, live)
    batch = [make_job("bulk") for _ in range(N)]
    batch[N // 2] = replace(live, payload=json.dumps({"v": 2}))

    assert insert(pg, *batch, now=at(5)) == [j.id for j in batch]

    assert sorted(live_ids(pg, "bulk")) == sorted(j.id for j in batch)
    records = {r.id: r for r in pg.jobs_list(JobsListParams(queue="bulk", limit=10 * N))}
    assert json.loads(records[live.id].payload) == {"v": 1}
    assert records[live.id].enqueued_at == T0


def test_a_large_batch_on_the_callers_connection_commits_or_rolls_back_with_it(
    pg: PostgresBackend, postgres_database: str
) -> None:
    live = make_job("outbox")
    insert(pg, live)
    rolled_back = [make_job("outbox") for _ in range(N)]
    committed = [make_job("outbox") for _ in range(N)] + [live]
    with psycopg.connect(postgres_database) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        pg.jobs_insert_many(JobsInsertParams(jobs=rolled_back, now=T0, conn=conn))
        conn.rollback()
        assert live_ids(pg, "outbox") == [live.id]

        conn.execute("INSERT INTO orders VALUES (1)")
        # The resent live id makes the COPY fail; only its savepoint rolls back, not the order.
        assert pg.jobs_insert_many(JobsInsertParams(jobs=committed, now=T0, conn=conn)) == [j.id for j in committed]
        assert live_ids(pg, "outbox") == [live.id]  # not committed yet
        conn.commit()
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)

    assert sorted(live_ids(pg, "outbox")) == sorted(j.id for j in committed)
    assert len(acquire(pg, "outbox", limit=10 * N)) == N + 1


def test_a_large_batch_with_a_keyed_job_after_the_first_still_claims_its_key(pg: PostgresBackend) -> None:
    held = make_job("bulk", idempotency_key="k", dedup_until=at(3600))
    insert(pg, held)
    batch = [make_job("bulk") for _ in range(N)]
    batch[N - 1] = make_job("bulk", idempotency_key="k", dedup_until=at(3600))

    # The COPY starts on the unkeyed head, meets the key, rolls back and takes the statement path.
    returned = insert(pg, *batch)

    assert returned == [j.id for j in batch[:-1]] + [held.id]
    assert sorted(live_ids(pg, "bulk")) == sorted([j.id for j in batch[:-1]] + [held.id])


def test_send_many_with_a_bad_message_in_a_large_batch_enqueues_nothing(pg: PostgresBackend) -> None:
    app = App(backend=pg)
    messages = [Message(task="t", payload={"i": i}, queue="bulk") for i in range(N)]
    messages[N // 2] = Message(task="t", payload={"bad": object()}, queue="bulk")
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        app.send_many(messages)
    assert live_ids(pg, "bulk") == []

    jobs = app.send_many(messages[: N // 2] + messages[N // 2 + 1 :])  # the connection is still good
    assert len(live_ids(pg, "bulk")) == len(jobs) == N - 1


class Queue(str, Enum):  # noqa: UP042 - not StrEnum: a plain (str, Enum) formats as its name
    EMAILS = "emails"


class Priority(int, Enum):
    HIGH = 7


class Nanoseconds(datetime):
    """A datetime whose isoformat writes nanoseconds, as pandas' Timestamp does."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return super().isoformat(sep, timespec).replace("+", "999+")


def test_a_copied_batch_stores_values_not_their_subclass_spelling(
    pg: PostgresBackend, admin: psycopg.Connection[tuple[object, ...]], copy_format: tuple[str, list[str]]
) -> None:
    # A (str, Enum) member formats as 'Queue.EMAILS' and an (int, Enum) one as 'Priority.HIGH': the rows
    # hold their values, as the statements store them. A time is stored to the microsecond whatever
    # its class writes, and whatever its offset (one with seconds).
    odd_zone = timezone(timedelta(hours=5, minutes=30, seconds=15))
    run_at = Nanoseconds(2030, 1, 1, 12, 0, 0, 999_999, tzinfo=UTC)
    expires_at = datetime(2031, 6, 1, 0, 0, 0, 1, tzinfo=odd_zone)
    jobs = [
        make_job(
            Queue.EMAILS,
            task=Queue.EMAILS,
            ordering_key=Queue.EMAILS if n == 0 else None,
            priority=Priority.HIGH,
            max_attempts=Priority.HIGH,
            max_deliveries=Priority.HIGH,
            run_at=run_at,
            expires_at=expires_at,
        )
        for n in range(N)
    ]
    assert insert(pg, *jobs, now=T0) == [j.id for j in jobs]
    assert copy_format[1] == [copy_format[0]]
    rows = admin.execute(
        "SELECT DISTINCT queue, task, priority, max_attempts, max_deliveries, run_at, expires_at FROM jobs"
    ).fetchall()
    assert rows == [("emails", "emails", 7, 7, 7, run_at.replace(tzinfo=UTC), expires_at)]
    assert admin.execute("SELECT ordering_key FROM jobs WHERE ordering_key IS NOT NULL").fetchall() == [("emails",)]


def test_a_sql_ascii_database_stores_a_copied_batch_as_utf8(
    pg_in: Callable[[str], PostgresBackend], copy_format: tuple[str, list[str]]
) -> None:
    # psycopg sends UTF-8 to a SQL_ASCII database (which takes any bytes); so does the text COPY.
    backend = pg_in("SQL_ASCII")
    jobs = [make_job("café", payload=json.dumps({"price": "5 €"}, ensure_ascii=False)) for _ in range(N)]
    assert insert(backend, *jobs) == [j.id for j in jobs]
    assert copy_format[1] == [copy_format[0]]
    stored = backend.jobs_list(JobsListParams(queue="café", limit=10 * N))
    assert len(stored) == N and {json.loads(r.payload)["price"] for r in stored} == {"5 €"}


def test_text_a_databases_encoding_cannot_hold_is_a_payload_error(
    pg_in: Callable[[str], PostgresBackend], copy_format: tuple[str, list[str]]
) -> None:
    # LATIN1 holds 'é' but not '€': the batch is refused as bad input (never half-written), and
    # the backend goes on; the HTTP group commit then isolates the one request that holds it.
    backend = pg_in("LATIN1")
    good = [make_job("q", payload=json.dumps({"name": "café"}, ensure_ascii=False)) for _ in range(N)]
    bad = [*good[: N // 2], make_job("q", payload=json.dumps({"price": "5 €"}, ensure_ascii=False))]
    bad += [make_job("q") for _ in range(N // 2)]
    with pytest.raises(PayloadError, match=r"cannot store U\+20AC EURO SIGN"):
        insert(backend, *bad)
    assert live_ids(backend, "q") == []
    assert insert(backend, *good) == [j.id for j in good]
    assert {json.loads(r.payload)["name"] for r in backend.jobs_list(JobsListParams(queue="q", limit=1000))} == {"café"}
