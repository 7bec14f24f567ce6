"""The app the chaos tests run in real worker processes (``tests.chaos.chaos_app:app``).

``effect`` writes a business row in its own PostgreSQL transaction, guarded by ``ctx.once`` on the same
connection; ``unguarded`` does the same without the guard. On its first delivery (no lease of it expired
yet) each handler kills its own worker process with SIGKILL right after the commit, before the ack can be
written: the case ``ctx.once`` exists for."""

from __future__ import annotations

import os
import signal

import psycopg

from conveyor import App, JobContext

app = App()


def _insert(conn: psycopg.Connection[tuple[object, ...]], ctx: JobContext) -> None:
    conn.execute("INSERT INTO effects (job_id, delivery) VALUES (%s, %s)", (str(ctx.job_id), ctx.rescues + 1))


def _crash_on_first_delivery(ctx: JobContext) -> None:
    if ctx.rescues == 0:
        os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="chaos.effect", queue="chaos", visibility_timeout=1.0)
def effect(ctx: JobContext) -> str:
    with psycopg.connect(os.environ["CONVEYOR_DATABASE_URL"]) as conn, conn.transaction():
        if ctx.once(f"effect:{ctx.job_id}", conn=conn):
            _insert(conn, ctx)
    _crash_on_first_delivery(ctx)
    return "done"


@app.task(name="chaos.unguarded", queue="chaos", visibility_timeout=1.0)
def unguarded(ctx: JobContext) -> str:
    with psycopg.connect(os.environ["CONVEYOR_DATABASE_URL"]) as conn, conn.transaction():
        _insert(conn, ctx)
    _crash_on_first_delivery(ctx)
    return "done"
