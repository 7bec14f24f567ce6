"""The real ``conveyor`` command, run as a subprocess: outputs, JSON shapes, exit codes, and one-line
errors (never a traceback) for bad input."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import make_dead_letters, run_statements

from conveyor import App, ConfigurationError, Reject
from conveyor.testing import drain

from . import e2e_app
from ._support import APP_PATH, REPO, child_env

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def _command() -> list[str]:
    """The installed console script next to this interpreter (what a user runs), else ``-m``."""
    script = Path(sys.executable).with_name("conveyor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "conveyor"]


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self
        return json.loads(self.out)


def conveyor(db: str | None, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> Run:
    argv = [*_command(), *(["--db", db] if db else []), *args]
    # No terminal on stdin, as in a script or CI, whatever terminal pytest itself runs in.
    done = subprocess.run(
        argv,
        cwd=REPO,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(run: Run, *fragments: str, code: int | None = None) -> str:
    """Non-zero exit, exactly one line on stderr (``conveyor: error: ...``), no traceback anywhere."""
    assert run.code != 0, run
    if code is not None:
        assert run.code == code, run
    assert "Traceback" not in run.err + run.out, run
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert lines[0].startswith("conveyor: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def send(db: str, task: str, payload: dict[str, Any], *options: str) -> str:
    run = conveyor(db, "send", e2e_app.WORK_QUEUE, task, "--payload", json.dumps(payload), *options)
    assert run.code == 0 and run.err == "", run
    job_id = run.out.strip()
    assert UUID_RE.match(job_id), run.out
    return job_id


def stats(db: str) -> dict[str, dict[str, Any]]:
    return {row["queue"]: row for row in conveyor(db, "stats", "--json").json()}


def test_migrate(database_url: str) -> None:
    first = conveyor(database_url, "migrate")
    assert first.code == 0 and first.err == "", first
    assert re.fullmatch(r"applied \d+ migration\(s\)(: .+)?\n", first.out), first.out
    if database_url.startswith("postgresql"):
        # PostgreSQL is migrated only on request: the first call applies every migration.
        assert not first.out.startswith("applied 0 "), first.out
    again = conveyor(database_url, "migrate")
    assert (again.code, again.out, again.err) == (0, "applied 0 migration(s)\n", "")


def test_send_stats_and_job(database_url: str) -> None:
    assert conveyor(database_url, "migrate").code == 0
    first = send(database_url, e2e_app.WORK, {"kind": "ok", "n": 1})
    as_json = conveyor(
        database_url, "send", "e2e", e2e_app.WORK, "--payload", '{"kind": "ok", "n": 2}', "--priority", "5", "--json"
    ).json()
    assert set(as_json) == {"id"} and UUID_RE.match(as_json["id"])
    send(database_url, e2e_app.WORK, {"kind": "ok", "n": 3}, "--delay", "3600")
    keyed = send(database_url, e2e_app.WORK, {"kind": "ok", "n": 4}, "--idempotency-key", "order-4")
    assert send(database_url, e2e_app.WORK, {"kind": "ok", "n": 5}, "--idempotency-key", "order-4") == keyed

    row = stats(database_url)["e2e"]
    assert (row["pending"], row["scheduled"], row["processing"], row["completed"], row["dead"]) == (3, 1, 0, 0, 0)
    assert row["oldest_pending_age"] is not None and row["oldest_pending_age"] >= 0
    table = conveyor(database_url, "stats")
    assert table.code == 0 and "e2e" in table.out
    # $CONVEYOR_DATABASE_URL stands in for --db.
    from_env = conveyor(None, "stats", "--json", env={"CONVEYOR_DATABASE_URL": database_url}).json()
    assert [r["pending"] for r in from_env if r["queue"] == "e2e"] == [3]

    job = conveyor(database_url, "job", first, "--json").json()
    assert (job["id"], job["queue"], job["task"], job["state"]) == (first, "e2e", e2e_app.WORK, "pending")
    assert (job["attempts"], job["deliveries"], job["payload"], job["error"]) == (0, 0, {"kind": "ok", "n": 1}, None)
    assert job["headers"]["schema_version"] == 1 and job["headers"]["correlation_id"] == first
    prioritised = conveyor(database_url, "job", as_json["id"], "--json").json()
    assert prioritised["priority"] == 5
    text = conveyor(database_url, "job", first)
    assert text.code == 0 and "pending" in text.out and first in text.out


def test_bad_input_is_one_line_and_enqueues_nothing(sqlite_url: str) -> None:
    """Bad input: one line on stderr, a non-zero exit, nothing enqueued."""
    assert_one_line_error(conveyor(sqlite_url, "send", "e2e", "t", "--payload", "{bad"), "--payload is not valid JSON")
    assert_one_line_error(conveyor(sqlite_url, "send", "e2e", "t", "--payload", "[1, 2]"), "must be a JSON object")
    assert_one_line_error(conveyor(sqlite_url, "send", "e2e", "t", "--payload", "{}", "--headers", "x"), "--headers")
    assert_one_line_error(conveyor(sqlite_url, "send", "e2e", "t", "--payload", '{"x": NaN}'), "not JSON")
    assert_one_line_error(conveyor(sqlite_url, "send", "e2e", "t", "--delay", "-1"), "delay must be >= 0", code=1)
    assert_one_line_error(conveyor(sqlite_url, "send", "e2e"), "TASK", code=2)
    assert_one_line_error(conveyor(sqlite_url, "job", "not-a-uuid"), "not-a-uuid")
    assert_one_line_error(conveyor(sqlite_url, "job", "0190f1b4-3a5e-7c3d-9b1e-7f5d2a9c4e81"), "0190f1b4")
    assert_one_line_error(
        conveyor(sqlite_url, "worker", "nosuch.module:app", "--burst"), "cannot import 'nosuch.module'"
    )
    assert_one_line_error(conveyor(sqlite_url, "worker", "tests.e2e.e2e_app:nothing"), "has no attribute 'nothing'")
    assert_one_line_error(conveyor(sqlite_url, "worker", "tests.e2e.e2e_app:WORK"), "is not a conveyor.App (found str)")
    assert_one_line_error(conveyor(sqlite_url, "worker", "no-colon"), "module:attribute")
    assert stats(sqlite_url) == {}


def test_unmigrated_postgres_is_one_line(postgres_database: str) -> None:
    assert_one_line_error(conveyor(postgres_database, "stats"), "jobs")


def test_bad_database_url_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(conveyor("oracle://nobody@localhost/x", "stats"), "unsupported database URL scheme 'oracle'")
    # MySQL refusing the login: its message, no traceback, no password.
    refused = conveyor("mysql://nobody:s3cret@127.0.0.1:3306/x", "stats")
    assert_one_line_error(refused, "MySQL unavailable", "Access denied for user 'nobody'")
    assert "s3cret" not in refused.err
    assert_one_line_error(conveyor("not a url", "stats"), "not a database URL")
    # Before: a new, empty database in a file named 'x.db?mode=ro'.
    assert_one_line_error(
        conveyor(f"sqlite:///{tmp_path}/x.db?mode=ro", "migrate"),
        "sqlite URLs take no options (?mode=ro in",
        f"name the file alone (sqlite:///{tmp_path}/x.db)",
    )
    # Before: SQLite read 'file:' as a URI, a private in-memory database: a send answered with an id,
    # and the job was gone with the process.
    assert_one_line_error(conveyor("sqlite:///file::memory:", "send", "q", "t"), "a 'file:' URI")
    assert_one_line_error(conveyor(f"sqlite:///{tmp_path}/x.db#main", "migrate"), "without '#'")
    assert list(tmp_path.iterdir()) == []


def _refused_by_send_and_by_workers(url: str, message: str) -> None:
    """``send`` and a two-process ``worker --burst`` each end on one line with ``message``, at once."""
    assert_one_line_error(conveyor(url, "send", "q", "t"), message)
    workers = conveyor(url, "worker", APP_PATH, "--burst", "--processes", "2", timeout=30)
    assert_one_line_error(workers, message)


def test_a_sqlite_path_no_process_can_open_is_one_line_and_no_worker_waits_for_it(tmp_path: Path) -> None:
    # SQLite says "unable to open database file" for each, which was read as a database that is away: a
    # `worker --processes 2` restarted its children every 0.5 s for ever (here: past the 30 s timeout).
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "a-dir").mkdir()
    deep = tmp_path.joinpath(*["d" * 200] * 3, "x.db")
    refused = {
        f"{tmp_path}/{'a' * 5000}.db": "its file name is 5003 bytes long, which with the '-journal' SQLite adds",
        # 251 bytes in UTF-8: past 255 with '-journal', though 127 characters.
        f"{tmp_path}/{'é' * 124}.db": "its file name is 251 bytes long",
        f"{tmp_path}/{'d' * 300}/x.db": "a directory name of 300 bytes is past this file system's limit of 255 bytes",
        str(deep): f"its path is {len(str(deep))} bytes long once absolute, and SQLite opens paths of at most 504",
        f"{tmp_path}/no-such-dir/x.db": f"the directory '{tmp_path}/no-such-dir' does not exist; create it first",
        str(tmp_path / "a-dir"): f"it is a directory; name a file in it (sqlite:///{tmp_path}/a-dir/conveyor.db)",
        f"{tmp_path}/a-file/x.db": f"'{tmp_path}/a-file' is not a directory",
    }
    for path, message in refused.items():
        _refused_by_send_and_by_workers(f"sqlite:///{path}", message)
    # A path under the current directory, where an absolute one was meant.
    _refused_by_send_and_by_workers("sqlite:///no-such-dir/x.db", "four slashes: sqlite:////no-such-dir/x.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file"]
    assert list((tmp_path / "a-dir").iterdir()) == []
    # The longest name and path SQLite opens are still taken.
    longest = tmp_path / ("n" * 244 + ".db")
    assert conveyor(f"sqlite:///{longest}", "send", "q", "t").code == 0
    middle = 504 - len(f"{tmp_path}/{'d' * 200}//{'x' * 100}")  # the name that makes the path 504 bytes
    deepest = tmp_path.joinpath("d" * 200, "e" * middle, "x" * 100)
    deepest.parent.mkdir(parents=True)
    assert len(str(deepest)) == 504
    assert conveyor(f"sqlite:///{deepest}", "send", "q", "t").code == 0


def _opened_as_nobody(url: str) -> str:
    """What opening and migrating ``url`` says (ConfigurationError's message, or "opened"): in a process of
    uid 65534 forked from this one when this is root, which may write whatever the mode bits say; else in
    this one. Forked, not started: nobody may not be able to reach this interpreter."""
    import conveyor.backends.sqlite  # noqa: F401 - imported here: nobody may not be able to read it
    from conveyor.backends import open_backend

    def attempt() -> str:
        try:
            backend = open_backend(url)
            try:
                backend.migrate()
            finally:
                backend.close()
        except ConfigurationError as exc:
            return str(exc)
        except Exception as exc:  # pragma: no cover - shown by the failing assertion
            return repr(exc)
        return "opened"

    if os.geteuid() != 0:
        return attempt()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, attempt().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(pid, 0)
    return said


def test_a_sqlite_file_this_user_may_not_write_is_refused_when_the_url_is_read() -> None:
    # Before: opened, then "unable to open database file" (BackendUnavailable: waited out for ever) or
    # "attempt to write a readonly database" at the first statement.
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        root.chmod(0o755)  # nobody may enter it
        db = root / "conveyor.db"
        assert conveyor(f"sqlite:///{db}", "migrate").code == 0
        locked = root / "locked"
        locked.mkdir(mode=0o555)
        try:
            shared = root / "shared"
            shared.mkdir()
            shared.chmod(0o777)
            assert _opened_as_nobody(f"sqlite:///{shared}/new.db") == "opened"
            db.chmod(0o000)
            assert "conveyor.db': this user (uid " in _opened_as_nobody(f"sqlite:///{db}")
            assert ") may not read and write it (its mode, its owner" in _opened_as_nobody(f"sqlite:///{db}")
            db.chmod(0o444)
            assert "may not read and write it" in _opened_as_nobody(f"sqlite:///{db}")
            assert f"may not create files in '{locked}', where SQLite keeps" in _opened_as_nobody(
                f"sqlite:///{locked}/x.db"
            )
            locked.chmod(0o000)
            assert f"may not reach '{locked}/in'" in _opened_as_nobody(f"sqlite:///{locked}/in/x.db")
        finally:
            locked.chmod(0o755)
            db.chmod(0o644)


def test_a_file_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_bytes(b"these are my notes, not a database\n" * 200)
    assert_one_line_error(
        conveyor(f"sqlite:///{notes}", "stats"),
        f"{notes} is not an SQLite database, or is damaged: file is not a database; check that the URL",
    )
    assert notes.read_bytes().startswith(b"these are my notes")  # nothing written over it


def test_dlq_list_show_replay_purge_and_audit(database_url: str) -> None:
    assert conveyor(database_url, "migrate").code == 0
    dead = [send(database_url, e2e_app.WORK, {"kind": "permanent", "n": n}) for n in range(3)]
    done = send(database_url, e2e_app.WORK, {"kind": "ok", "n": 3})
    unknown = send(database_url, "no.such.task", {"n": 4})
    worker = conveyor(database_url, "worker", APP_PATH, "--queues", "e2e", "--burst", timeout=120)
    assert worker.code == 0, worker
    row = stats(database_url)["e2e"]
    assert (row["pending"], row["processing"], row["completed"], row["dead"]) == (0, 0, 1, 4)

    # list: newest first, filters, JSON shape.
    listed = conveyor(database_url, "dlq", "list", "--json").json()
    assert {r["id"] for r in listed} == {*dead, unknown}
    by_id = {r["id"]: r for r in listed}
    assert {(by_id[i]["reason"], by_id[i]["error_type"], by_id[i]["attempts"]) for i in dead} == {
        ("permanent_error", "ValueError", 1)
    }
    assert (by_id[unknown]["reason"], by_id[unknown]["attempts"]) == ("unknown_task", 0)
    assert [r["failed_at"] for r in listed] == sorted((r["failed_at"] for r in listed), reverse=True)
    only_value_errors = conveyor(database_url, "dlq", "list", "--error-type", "ValueError", "--json").json()
    assert {r["id"] for r in only_value_errors} == set(dead)
    only_unknown = conveyor(database_url, "dlq", "list", "--task", "no.such.task", "--json").json()
    assert [r["id"] for r in only_unknown] == [unknown]
    assert conveyor(database_url, "dlq", "list", "--queue", "elsewhere", "--json").json() == []
    table = conveyor(database_url, "dlq", "list")
    assert table.code == 0 and "Dead letters" in table.out

    # show: everything needed to replay.
    shown = conveyor(database_url, "dlq", "show", dead[0], "--json").json()
    assert (shown["state"], shown["reason"], shown["queue"], shown["task"]) == (
        "dead",
        "permanent_error",
        "e2e",
        "e2e.work",
    )
    assert shown["payload"] == {"kind": "permanent", "n": 0}
    assert shown["error"]["type"] == "ValueError" and shown["error"]["message"] == "job 0: permanent failure"
    assert "Traceback" in shown["error"]["traceback"] and "ValueError" in shown["error"]["traceback"]
    assert shown["finished_at"] is not None
    assert_one_line_error(conveyor(database_url, "dlq", "show", done), "not a dead letter")

    # replay one by id: a new pending job with fresh attempts and replay_of set; audited.
    replayed = conveyor(database_url, "dlq", "replay", dead[0], "--reason", "fixed the parser", "--json").json()
    assert len(replayed) == 1 and replayed[0]["dead_id"] == dead[0]
    new_id = replayed[0]["new_id"]
    new_job = conveyor(database_url, "job", new_id, "--json").json()
    assert (new_job["state"], new_job["attempts"], new_job["replay_of"]) == ("pending", 0, dead[0])
    assert (new_job["queue"], new_job["task"], new_job["payload"]) == ("e2e", "e2e.work", {"kind": "permanent", "n": 0})
    assert conveyor(database_url, "job", dead[0], "--json").json()["replayed_by"] == new_id
    again = conveyor(database_url, "dlq", "replay", dead[0], "--reason", "twice")
    assert again.code == 0 and again.out.strip() == "replayed 0 of 1 dead letter(s)", again
    assert "not unreplayed dead letters" in again.err
    assert_one_line_error(conveyor(database_url, "dlq", "replay", dead[1]), "--reason", code=2)
    assert_one_line_error(conveyor(database_url, "dlq", "replay", "--all", "--reason", "r"), "--queue")
    assert_one_line_error(conveyor(database_url, "dlq", "replay", "--reason", "r"), "--all")
    assert_one_line_error(conveyor(database_url, "dlq", "replay", "xyz", "--reason", "r"), "xyz")

    # purge: gone for good; audited.
    purged = conveyor(database_url, "dlq", "purge", dead[1], "--reason", "test data", "--actor", "ops@example", "--yes")
    assert (purged.code, purged.out) == (0, "purged 1 dead letter(s)\n"), purged
    assert_one_line_error(conveyor(database_url, "job", dead[1]), dead[1])

    # replay --all --queue, narrowed by error type, rate-limited.
    bulk = conveyor(
        database_url,
        "dlq",
        "replay",
        "--all",
        "--queue",
        "e2e",
        "--error-type",
        "ValueError",
        "--rate",
        "50",
        "--reason",
        "bulk retry",
        "--json",
    ).json()
    assert [p["dead_id"] for p in bulk] == [dead[2]]
    assert [r["id"] for r in conveyor(database_url, "dlq", "list", "--json").json()] == [unknown]

    audit = conveyor(database_url, "audit", "--json").json()
    assert [(a["action"], a["reason"], a["job_ids"]) for a in audit] == [
        ("replay", "bulk retry", [dead[2]]),
        ("purge", "test data", [dead[1]]),
        # Every call is audited, even one that found nothing to replay.
        ("replay", "twice", []),
        ("replay", "fixed the parser", [dead[0]]),
    ]
    assert audit[1]["actor"] == "ops@example"
    of_one = conveyor(database_url, "audit", "--job", dead[1], "--json").json()
    assert [(a["action"], a["job_ids"]) for a in of_one] == [("purge", [dead[1]])]
    assert_one_line_error(conveyor(database_url, "audit", "--job", "xyz"), "xyz")
    assert audit[0]["actor"].endswith("@cli") or audit[0]["actor"] == "cli"
    assert all(a["at"] for a in audit)
    table = conveyor(database_url, "audit")
    assert table.code == 0 and "purge" in table.out

    row = stats(database_url)["e2e"]
    assert (row["pending"], row["completed"], row["dead"]) == (2, 1, 1)


def test_one_dead_letter_python_cannot_read_stops_no_listing_or_replay_of_the_others(database_url: str) -> None:
    dead = make_dead_letters(database_url, 4)
    # What each engine can hold that Python's json cannot read: PostgreSQL's jsonb an integer of 5,000 digits
    # (past Python's 4,300) or arrays nested 3,000 deep (past its recursion limit); SQLite's and MySQL's text
    # columns text that is not JSON at all (another writer, a hand edit), and SQLite's bytes that are not UTF-8
    # (which sqlite3 refused to read: the whole listing failed).
    if database_url.startswith("sqlite"):
        unreadable = ["'{\"n\": 1'", "CAST(X'7b226e223a22ff227d' AS TEXT)"]
    elif database_url.startswith("postgresql"):
        unreadable = [
            "('{\"n\": ' || repeat('9', 5000) || '}')::jsonb",
            "(repeat('[', 3000) || repeat(']', 3000))::jsonb",
        ]
    else:
        unreadable = ["'{\"n\": 1'"]
    run_statements(
        database_url,
        *(f"UPDATE archive SET payload = {value} WHERE id = '{dead[n]}'" for n, value in enumerate(unreadable, 1)),
    )

    # Before: every one of these failed with a traceback (JSONDecodeError, ValueError, RecursionError).
    listed = conveyor(database_url, "dlq", "list", "--queue", "doomed", "--json").json()
    assert sorted(r["id"] for r in listed) == sorted(dead)
    for n in range(1, len(unreadable) + 1):
        shown = conveyor(database_url, "dlq", "show", dead[n], "--json").json()
        assert list(shown["payload"]) == ["unreadable"]
        assert shown["payload"]["unreadable"].startswith("the stored payload is not JSON Python can read (")
    assert conveyor(database_url, "dlq", "show", dead[0], "--json").json()["payload"] == {"n": 0}
    replayed = conveyor(database_url, "dlq", "replay", "--all", "--queue", "doomed", "--reason", "r", "--json").json()
    assert [r["dead_id"] for r in replayed] == dead, "each once, in enqueue order, the unreadable ones too"


def test_dlq_replay_writes_nothing_but_its_lines_on_stderr_without_a_terminal(sqlite_url: str) -> None:
    # Before: the progress bar, drawing nothing without a terminal, still left a blank line on stderr first.
    dead = make_dead_letters(sqlite_url, 1)
    unknown = "01a226f8-4b8c-7000-a129-d51ed5c80a0c"
    skipped = conveyor(sqlite_url, "dlq", "replay", unknown, "--reason", "r")
    assert (skipped.code, skipped.out) == (0, "replayed 0 of 1 dead letter(s)\n"), skipped
    assert skipped.err == "1 id(s) were not unreplayed dead letters and were skipped\n", skipped
    refused = conveyor(sqlite_url, "dlq", "replay", "xyz", "--reason", "r")
    assert refused.code == 1 and refused.err == "conveyor: error: not a job id: 'xyz'\n", refused
    done = conveyor(sqlite_url, "dlq", "replay", "--all", "--queue", "doomed", "--reason", "r")
    assert (done.code, done.out, done.err) == (0, "replayed 1 of 1 dead letter(s)\n", ""), done
    assert conveyor(sqlite_url, "dlq", "list", "--queue", "doomed", "--json").json() == [], dead


def test_dlq_replay_all_holds_no_payloads_to_select_its_dead_letters(sqlite_url: str) -> None:
    # 400 dead letters of 230 KB (92 MB of JSON). Before, the selection decoded and held them all: 245 MB resident,
    # and under a 200 MB data limit a MemoryError traceback with nothing replayed. Now it needs under 100 MB.
    with App(sqlite_url, migrate=True) as app:

        @app.task(name="doomed", queue="doomed", max_attempts=1)
        def doomed(blob: list[str]) -> None:
            raise Reject("always")

        blob = ["y" * 250 for _ in range(900)]
        for _ in range(4):
            doomed.delay_many([{"blob": blob}] * 100)
            assert drain(app, ["doomed"]).dead == 100
    limit = 120 * 2**20
    done = subprocess.run(
        [*_command(), "--db", sqlite_url, "dlq", "replay", "--all", "--queue", "doomed", "--reason", "r"],
        cwd=REPO,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)),
    )
    assert (done.returncode, done.stdout) == (0, "replayed 400 of 400 dead letter(s)\n"), done.stderr[-500:]


def _sigint_as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_an_interrupted_paced_replay_says_how_far_it_went(sqlite_url: str) -> None:
    # Before: "conveyor: aborted", and nothing said that some of the dead letters were replayed already.
    # 30 at one a second: the replay cannot end before the signal, however late a loaded machine sends it.
    make_dead_letters(sqlite_url, 30)
    replay = ["dlq", "replay", "--all", "--queue", "doomed", "--reason", "r", "--rate", "1"]
    argv = [*_command(), "--db", sqlite_url, *replay]
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: SIGINT at its default, unblocked. A child inherits an ignored or blocked SIGINT, and an
        # earlier test of the suite's process may leave it so: the replay then ran to its end (failed in CI only).
        preexec_fn=_sigint_as_from_a_terminal,
    )
    try:
        with App(sqlite_url) as app:
            while len(app.admin.dead_letters(queue="doomed")) > 28:  # two chunks of one written, a second apart
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    with App(sqlite_url) as app:
        replayed = 30 - len(app.admin.dead_letters(queue="doomed"))
    assert proc.returncode == 1 and out == "", (out, err)
    said = r"conveyor: error: interrupted after (\d+) of 30 selected dead letter\(s\) were done .*\n"
    match = re.fullmatch(said, err)
    assert match, err
    assert int(match.group(1)) in (replayed, replayed - 1), (err, replayed)


@pytest.mark.parametrize("args", [["--help"], ["worker", "--help"], ["dlq", "replay", "--help"]])
def test_help(args: list[str]) -> None:
    run = conveyor(None, *args)
    assert run.code == 0 and run.out.startswith("Usage: conveyor") and run.err == "", run


@pytest.mark.parametrize(
    ("source", "fragments"),
    [
        (
            "raise RuntimeError('no config here')\n",
            ("importing 'hostile_app' failed: RuntimeError: no config here", ":1)"),
        ),
        ("import sys\nsys.exit(0)\n", ("importing 'hostile_app' called sys.exit(0)",)),
        ("import sys\nsys.exit(4)\n", ("called sys.exit(4)",)),
    ],
)
def test_an_app_module_that_fails_on_import_is_one_line(
    sqlite_url: str, tmp_path: Path, source: str, fragments: tuple[str, ...]
) -> None:
    # Before: a module that raised printed a traceback through Conveyor's internals; one calling
    # sys.exit ended the worker with that code and no word (exit 0: "drained").
    (tmp_path / "hostile_app.py").write_text(source)
    for processes in ("1", "2"):
        run = conveyor(
            sqlite_url, "worker", "hostile_app:app", "--burst", "-p", processes, env={"PYTHONPATH": str(tmp_path)}
        )
        assert_one_line_error(run, *fragments)
