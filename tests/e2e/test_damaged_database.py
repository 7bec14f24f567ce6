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
from contextlib import closing
from pathlib import Path

import psycopg
import pytest

from conveyor import App, Message, Worker
from conveyor._errors import BackendCorrupt
from conveyor.worker._worker import EXIT_DAMAGED

from . import e2e_app
from ._support import Procs, worker_argv

JOBS = 20


def _damage(path: Path, index: str) -> None:
    """Overwrite the first bytes of ``index``'s root page, as a torn write would."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\xff" * 64)


def _damaged_database(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "damaged.db"
    url = f"sqlite:///{path}"
    producer = App(url, migrate=True)
    e2e_app.register(producer)
    with producer:
        producer.send_many([Message(task=e2e_app.WORK, payload={"kind": e2e_app.OK, "n": n}) for n in range(JOBS)])
    # Finishing a job writes the archive: its index is damaged, leasing and running still work.
    _damage(path, "archive_finished")
    return path, url


@pytest.mark.parametrize("processes", [1, 2])
def test_a_worker_on_a_damaged_sqlite_file_stops_and_leaves_the_jobs_for_after_the_repair(
    tmp_path: Path, procs: Procs, processes: int
) -> None:
    path, url = _damaged_database(tmp_path)
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
    if processes > 1:
        assert "found the database damaged; stopping the others, restarting none" in output
    with closing(sqlite3.connect(path)) as conn:
        states = conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
        archived = conn.execute("SELECT count(*) FROM archive NOT INDEXED").fetchone()[0]
    assert sum(n for _, n in states) == JOBS and archived == 0, states


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
