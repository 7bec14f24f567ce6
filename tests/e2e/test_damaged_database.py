"""A damaged database stops the worker; it never re-runs jobs endlessly or dead-letters them for it.

A damaged SQLite file (a torn page, a disk fault) or a PostgreSQL page that fails its checks refuses
every statement touching it, whatever the job: before, a worker whose outcomes could not be stored
split its batches down to each job and tried to dead-letter them one by one, and when that failed too
the job's lease expired and it ran again, a burst that never ended. Now the worker stops at once,
exit 74 (EX_IOERR), with one line saying what is damaged, and a prefork supervisor restarts none of its
processes (a restart would lease and run more jobs it cannot finish); the jobs stay where they were for
after the repair."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import psycopg
import pytest

from conveyor import App, Message, Worker
from conveyor._errors import EXIT_DAMAGED, BackendCorrupt

from . import e2e_app
from ._support import Procs, worker_argv

JOBS = 20


def damage(path: Path, index: str) -> None:
    """Overwrite the first bytes of ``index``'s root page, as a torn write would."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\xff" * 64)


def _damaged_database(tmp_path: Path, index: str) -> tuple[Path, str]:
    path = tmp_path / "damaged.db"
    url = f"sqlite:///{path}"
    producer = App(url, migrate=True)
    e2e_app.register(producer)
    with producer:
        producer.send_many([Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(JOBS)])
    damage(path, index)
    return path, url


# Where the damage is found: finishing a job writes the archive's index (leasing and running still work);
# the migrations' ledger is read before the worker's loops start.
@pytest.mark.parametrize("index", ["archive_finished", "schema_migrations"])
@pytest.mark.parametrize("processes", [1, 2])
def test_a_worker_on_a_damaged_sqlite_file_stops_and_leaves_the_jobs_for_after_the_repair(
    tmp_path: Path, procs: Procs, processes: int, index: str
) -> None:
    path, url = _damaged_database(tmp_path, index)
    worker = procs.start(
        "worker",
        worker_argv(url, "--queues", e2e_app.WORK_QUEUE, "--burst", "--visibility-timeout", "1", "-p", str(processes)),
        env={"E2E_VISIBILITY_TIMEOUT": "1"},
    )
    # Before: leases expired and the jobs ran again, the burst never ended; under a supervisor, each
    # process that stopped was restarted and ran more.
    code = worker.wait(timeout=60)
    output = worker.output()
    assert code == EXIT_DAMAGED, output
    assert "is damaged: database disk image is malformed; restore it from a backup" in output
    assert str(path) in output
    assert "Traceback" not in output
    assert "dead-letter" not in output
    assert "restarting it" not in output
    if processes > 1:  # before, for damage found at start: a traceback and a restart every 0.5 s
        assert "found the database damaged; stopping the others, restarting none" in output
    with closing(sqlite3.connect(path)) as conn:
        states = conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
        archived = conn.execute("SELECT count(*) FROM archive NOT INDEXED").fetchone()[0]
    assert sum(n for _, n in states) == JOBS and archived == 0, states


def test_a_burst_worker_whose_drained_check_meets_damage_stops(tmp_path: Path, procs: Procs) -> None:
    # The dead-letter index is read only by the check that the queues are drained: every job runs and is
    # archived, then the check fails. Before: that failure went unseen and the worker never exited.
    path, url = _damaged_database(tmp_path, "archive_dlq_queue")
    worker = procs.start("worker", worker_argv(url, "--queues", e2e_app.WORK_QUEUE, "--burst"))
    code = worker.wait(timeout=60)
    output = worker.output()
    assert code == EXIT_DAMAGED, output
    assert "the burst's watch failed: the SQLite database" in output
    assert "Traceback" not in output
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM archive NOT INDEXED WHERE state = 'completed'").fetchone() == (JOBS,)


def test_a_damaged_release_on_stopping_still_flushes_the_running_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Handing buffered jobs back is the stop's first write. Before: its error escaped Worker.run(), the
    # running handlers were cut and their outcomes never written; now it is one line, and the stop goes on.
    with App(f"sqlite:///{tmp_path}/q.db", migrate=True) as app:
        started = threading.Event()
        starts: list[int] = []

        @app.task(queue="q", name="slow")
        def slow(i: int) -> int:
            starts.append(i)
            if len(starts) >= 2:  # both slots run a job (stopping after the first start raced the second)
                started.set()
            time.sleep(0.3)
            return i

        ids = [slow.delay(i=i).id for i in range(30)]

        def refused(params: object) -> int:
            raise BackendCorrupt("the SQLite database (q.db) is damaged: database disk image is malformed")

        monkeypatch.setattr(app.backend, "jobs_release_many", refused)
        worker = Worker(app, concurrency=2, prefetch=20, graceful_timeout=10)

        async def run() -> None:
            running = asyncio.create_task(worker.run())
            await asyncio.to_thread(started.wait, 10)
            worker.stop()
            await asyncio.wait_for(running, 30)

        asyncio.run(run())
        assert worker.exit_code == EXIT_DAMAGED
        states = [app.job(job_id).state for job_id in ids]
        assert states.count("completed") == 2, states  # the two that were running when it stopped
        # The buffered ones keep their leases until they expire; the rest were never leased.
        assert "processing" in states and set(states) <= {"completed", "processing", "pending"}, states


def test_a_worker_stops_when_postgresql_reports_damaged_data(postgres_database: str) -> None:
    # Damaging PostgreSQL's own files under a shared server is not for a test: a trigger raises what a
    # page failing its checksum raises (SQLSTATE XX001, data_corrupted) where a finish deletes the job.
    with App(postgres_database, migrate=True) as app:

        @app.task(queue="q")
        def ok(i: int) -> int:
            return i

        ids = [ok.delay(i=i).id for i in range(JOBS)]
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            conn.execute(
                """
                CREATE FUNCTION damaged() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    RAISE EXCEPTION 'invalid page in block 7 of relation base/16384/16385'
                        USING ERRCODE = 'data_corrupted';
                END $$;
                CREATE TRIGGER damaged BEFORE DELETE ON jobs FOR EACH ROW EXECUTE FUNCTION damaged();
                """
            )
        worker = Worker(app, burst=True, poll_interval=0.02, visibility_timeout=1.0)
        asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
        assert worker.exit_code == EXIT_DAMAGED
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM archive").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (JOBS,)
            conn.execute("DROP TRIGGER damaged ON jobs")
        # Still jobs to run once the data is repaired: nothing was decided for them.
        assert {app.job(job_id).state for job_id in ids} <= {"pending", "processing"}


def test_the_postgresql_error_is_a_backend_corrupt_naming_what_was_running(postgres_database: str) -> None:
    with App(postgres_database, migrate=True) as app, psycopg.connect(postgres_database, autocommit=True) as conn:
        app.send_many([Message(task="t", queue="q")])
        conn.execute(
            "CREATE FUNCTION damaged() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'index \"jobs_pkey\" contains unexpected zero page' USING ERRCODE = 'index_corrupted'; "
            "END $$; CREATE TRIGGER damaged BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION damaged()"
        )
        with pytest.raises(BackendCorrupt, match=r"PostgreSQL found damaged data \(.*\): index .* an operator must"):
            app.send_many([Message(task="t", queue="q")])
