"""SQLite, the embedded default, while another process holds its write lock (an operator's `sqlite3` shell left in
`BEGIN IMMEDIATE`, a backup tool): a worker mid-drain and a producer wait, then go on; nothing is lost or run twice,
and the worker neither spins nor floods its log."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conveyor import App, Message

from . import e2e_app
from ._support import Db, Procs, iter_lines, wait_until, worker_argv

JOBS = 300
HELD = 6.0


@pytest.mark.parametrize("mode", ["IMMEDIATE", "EXCLUSIVE"])
def test_a_write_lock_held_by_another_process_is_waited_out(
    mode: str, sqlite_url: str, procs: Procs, tmp_path: Path
) -> None:
    run_log = tmp_path / "runs.log"
    producer = App(sqlite_url, migrate=True)
    e2e_app.register(producer)
    db = Db(sqlite_url)
    try:
        messages = [Message(e2e_app.WORK, {"kind": e2e_app.OK, "n": n}) for n in range(JOBS)]
        ids = {j.id for j in producer.send_many(messages)}
        worker = procs.start(
            "worker",
            worker_argv(sqlite_url, "--concurrency", "4"),
            env={"E2E_RUN_LOG": str(run_log), "E2E_WORK_SLEEP": "0.02"},
        )
        wait_until(lambda: len(list(iter_lines(run_log))) >= 20, 30, "the drain under way")
        holder = sqlite3.connect(urlsplit(sqlite_url).path, isolation_level=None, check_same_thread=False)
        holder.execute(f"BEGIN {mode}")
        held_at = time.monotonic()
        release = threading.Timer(HELD, holder.execute, ("ROLLBACK",))
        release.start()
        try:
            # A producer waits for the lock (its busy timeout is longer than the hold), then its job is in.
            late = producer.send(e2e_app.WORK, {"kind": e2e_app.OK, "n": JOBS})
            waited = time.monotonic() - held_at
        finally:
            release.join()
            holder.close()
        assert waited >= HELD - 0.5
        ids.add(late.id)
        wait_until(lambda: not db.live(), 60, "every job finished")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
        archived = db.archived()
        assert {r.id for r in archived} == ids
        assert {(r.state, r.deliveries) for r in archived} == {("completed", 1)}
        output = worker.output()
        assert "Traceback" not in output
        # A warning per loop and backoff step, not one per statement: the worker waited, it did not spin.
        assert output.count("WARNING") <= 10, output
    finally:
        db.close()
        producer.close()
