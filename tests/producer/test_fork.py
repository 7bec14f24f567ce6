"""An App used before a fork: the child opens connections of its own, and leaves the parent's alone."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor import App

_app: App | None = None  # the App the children inherit


def _child(tag: str, results: Queue[Any]) -> None:
    assert _app is not None
    sent = 0
    for _ in range(20):
        _app.send("t", {"tag": tag}, queue="fork")
        sent += 1
    results.put((tag, sent))


def _stored(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT payload->>'tag', count(*) FROM jobs WHERE queue = 'fork' GROUP BY 1").fetchall()
    return {tag: count for tag, count in rows}


def test_children_forked_after_a_send_use_connections_of_their_own(postgres_database: str) -> None:
    # Before: parent and children shared the parent's pooled sessions; a child hung for good, and both
    # got "prepared statement "_pg3_0" already exists" from a session the other was using.
    global _app
    _app = app = App(postgres_database, migrate=True)
    try:
        app.send("t", {"tag": "parent"}, queue="fork")
        context = multiprocessing.get_context("fork")
        results: Queue[Any] = context.Queue()
        children = [context.Process(target=_child, args=(f"c{i}", results)) for i in range(3)]
        for child in children:
            child.start()
        for _ in range(20):
            app.send("t", {"tag": "parent"}, queue="fork")
        for child in children:
            child.join(60)
        hung = [child.pid for child in children if child.is_alive()]
        for child in children:
            child.kill()
        assert not hung, hung
        assert sorted(child.exitcode for child in children) == [0, 0, 0]
        assert _stored(postgres_database) == {"parent": 21, "c0": 20, "c1": 20, "c2": 20}
    finally:
        _app = None
        app.close()


_FORK_AND_EXIT = """
import os, sys
from conveyor import App
app = App(sys.argv[1])
app.send("t", {"tag": "parent"}, queue="fork")
pid = os.fork()
if pid == 0:
    app.send("t", {"tag": "child"}, queue="fork")
    sys.exit(0)  # the interpreter's own exit: atexit handlers, then every object freed
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
for _ in range(5):
    app.send("t", {"tag": "parent"}, queue="fork")  # on the sessions the parent had before the fork
print("parent sent")
"""


def test_a_child_that_exits_normally_leaves_the_parents_sessions_open(postgres_database: str) -> None:
    # A child ending through the interpreter's exit frees what it inherited: a PostgreSQL connection
    # freed says goodbye to the server on the parent's socket, which ends the parent's session.
    App(postgres_database, migrate=True).backend.close()
    done = subprocess.run(
        [sys.executable, "-c", _FORK_AND_EXIT, postgres_database], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "parent sent" in done.stdout, done.stderr[-2000:]
    assert _stored(postgres_database) == {"parent": 6, "child": 1}


_FORK_MID_SEND = """
import os, signal, sys, threading, time
from conveyor import App
app = App(sys.argv[1], migrate=True)
stop, errors = False, []
def sending() -> None:
    while not stop:
        try:
            app.send("t", {"tag": "parent"}, queue="fork")
        except Exception as exc:
            errors.append(repr(exc))
thread = threading.Thread(target=sending, daemon=True)
thread.start()
time.sleep(0.2)
codes = []
for _ in range(12):
    time.sleep(0.02)
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # a child that hangs ends by SIGALRM
        try:
            app.send("t", {"tag": "child"}, queue="fork")
        except BaseException as exc:
            print("child:", repr(exc), flush=True)
            os._exit(3)
        os._exit(0)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
stop = True
thread.join(10)
print("codes", codes, "errors", errors[:3])
"""


@pytest.mark.parametrize("engine", ["sqlite", "memory"])
def test_a_child_forked_while_another_thread_writes_can_write(engine: str, tmp_path: Path) -> None:
    # SQLite keeps a process's file locks in bookkeeping a child copies: a child forked while a thread of
    # its parent was in a write found the file locked (30 s, then "database is locked", or for ever); with
    # a private in-memory database it waited for ever on a lock held by a thread it does not have.
    url = f"sqlite:///{tmp_path / 'fork.db'}" if engine == "sqlite" else "memory://"
    done = subprocess.run([sys.executable, "-c", _FORK_MID_SEND, url], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "codes [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] errors []" in done.stdout, done.stdout[-2000:]


_FORK_GIVEN_BACKEND = """
import os, sys
from conveyor import App
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.sqlite import SqliteBackend
url = sys.argv[1]
backend = PostgresBackend(url, durable_acks=True, max_size=3) if url.startswith("postgres") else SqliteBackend(url)
app = App(backend=backend)  # no database URL: the App's own is the default SQLite file
app.backend.migrate()
app.send("t", {"tag": "parent"}, queue="fork")
pid = os.fork()
if pid == 0:
    try:
        app.send("t", {"tag": "child"}, queue="fork")
        child = app.backend
        same = type(child) is type(backend) and child is not backend
        if url.startswith("postgres"):
            same = same and child._durable_acks and child._sizes == (1, 3)
        print("child backend like the parent's:", same, flush=True)
    finally:
        os._exit(0)
os.waitpid(pid, 0)
print("parent sent", app.send("t", {"tag": "parent"}, queue="fork") is not None)
"""


@pytest.mark.parametrize("engine", ["postgres", "sqlite"])
def test_a_child_of_an_app_given_its_backend_keeps_that_database(
    engine: str, postgres_database: str, tmp_path: Path
) -> None:
    # Before: the child reopened App.database_url, which for App(backend=...) is the default SQLite file
    # ./conveyor.db: the child's jobs went there (created and migrated on the spot), never to the workers'
    # database; and a backend's options (durable_acks, pool sizes) were dropped.
    db_file = tmp_path / "given.db"
    url = postgres_database if engine == "postgres" else str(db_file)
    done = subprocess.run(
        [sys.executable, "-c", _FORK_GIVEN_BACKEND, url], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "child backend like the parent's: True" in done.stdout and "parent sent True" in done.stdout, done.stdout
    assert not (tmp_path / "conveyor.db").exists()
    if engine == "postgres":
        assert _stored(postgres_database) == {"parent": 2, "child": 1}
    else:
        import sqlite3

        with sqlite3.connect(db_file) as conn:
            rows = conn.execute("SELECT json_extract(payload, '$.tag'), count(*) FROM jobs GROUP BY 1").fetchall()
        assert dict(rows) == {"parent": 2, "child": 1}
