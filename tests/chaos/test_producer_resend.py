"""A producer's retry after an ambiguous send must not enqueue the job twice.

Found by the long chaos run: a paced producer's ``send_many`` (idempotency keys on every job)
committed just before an immediate PostgreSQL restart, the answer was lost, and the producer sent
the same messages again once the server was back. By then the workers had run and archived the
first copies; the resend inserted every one of them again, so 39 jobs ran twice and were archived
twice. The idempotency key is what a producer relies on for exactly this (DESIGN §3: a duplicate
inside the dedup window returns the existing job, it does not enqueue twice), and it must hold
whether the first copy is still live or already finished. Reproduced here without a fault: send,
drain, send the same message again."""

from __future__ import annotations

import psycopg
import pytest

from conveyor import App, JobContext, Message
from conveyor.testing import drain


@pytest.mark.parametrize("finished_first", [False, True], ids=["live", "archived"])
def test_keyed_resend_returns_the_existing_job_and_runs_nothing(postgres_database: str, finished_first: bool) -> None:
    app = App(postgres_database, migrate=True)
    runs: list[int] = []

    @app.task(name="chaos.once", queue="resend")
    def once(ctx: JobContext) -> None:
        runs.append(ctx.attempt)

    try:
        message = Message(task="chaos.once", idempotency_key="order-7")
        first = app.send_many([message])[0]
        if finished_first:
            drain(app)
            assert first.status().state == "completed"
        again = app.send_many([message])[0]  # the same Message: same id, same key
        assert again.id == first.id
        drain(app)
        assert runs == [1]
        with psycopg.connect(postgres_database) as conn:
            archived = conn.execute("SELECT count(*) FROM archive WHERE id = %s", (first.id,)).fetchone()
            live = conn.execute("SELECT count(*) FROM jobs").fetchone()
        assert (archived, live) == ((1,), (0,))
    finally:
        app.close()
