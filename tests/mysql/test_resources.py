"""A MySQL server out of a resource (a full disk or tablespace: "The table is full") is waited out like a lost
server, on every path: never read as a refusal of the statement's items, which dead-letters their jobs."""

from __future__ import annotations

import threading
import time

from tests.conftest import driver_connection

from conveyor import App, Worker


def test_a_full_table_while_finishing_jobs_is_waited_out_not_dead_lettered(mysql_database: str) -> None:
    """The server says 1114 ("The table 'archive' is full") for completed jobs with a big result, as a full
    tablespace does for big rows while small ones still fit. Before: the worker split the batch, dead-lettered each
    such job as outcome_refused (its small dead-letter row fitted) and the jobs were lost to the DLQ. Now it waits,
    and once there is room they complete."""
    app = App(mysql_database, migrate=True)
    app.backend.migrate()

    @app.task(queue="q")
    def echo(text: str) -> str:
        return text

    with driver_connection(mysql_database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            """CREATE TRIGGER full BEFORE INSERT ON archive FOR EACH ROW
            BEGIN
                IF NEW.state = 'completed' AND CAST(NEW.result AS CHAR) LIKE '%BIG%' THEN
                    SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1114, MESSAGE_TEXT = 'The table ''archive'' is full';
                END IF;
            END"""
        )
    jobs = [echo.delay(text="BIG" if i % 3 == 0 else f"ok {i}") for i in range(12)]
    big = {j.id for j in jobs[::3]}
    worker = Worker(app, ["q"], concurrency=4, poll_interval=0.1, burst=True)
    runner = threading.Thread(target=lambda: worker.run_sync(install_signals=False))
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and worker.counters.backend_errors < 2:
            time.sleep(0.05)
        assert worker.counters.backend_errors >= 2  # the full table was met, and is being waited out
        assert "dead" not in {app.job(i).state for i in big}
        with driver_connection(mysql_database, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("DROP TRIGGER full")
        runner.join(60)  # a burst: it stops once every job has ended
        assert not runner.is_alive()
        states = {j.id: app.job(j.id) for j in jobs}
    finally:
        worker.stop()
        runner.join(30)
        app.close()
    assert {s.state for s in states.values()} == {"completed"}, {i: (s.state, s.reason) for i, s in states.items()}
    assert worker.counters.dead == 0
