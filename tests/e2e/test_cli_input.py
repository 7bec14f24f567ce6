"""The real ``conveyor`` command and bad input (issue 14): one line on stderr, a non-zero exit,
nothing written; global options on either side of the command; names printed escaped."""

from __future__ import annotations

import json
import random
import re
import socket
import time
from pathlib import Path

import pytest

from . import e2e_app
from ._support import APP_PATH
from .test_cli import Run, assert_one_line_error, conveyor, send, stats

SECRET = "S3cr3t-pw"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _incompressible(chars: int) -> str:
    rng = random.Random(chars)
    return "".join(chr(0x4E00 + rng.randrange(20_000)) for _ in range(chars))


# -- global options on either side -------------------------------------------------------------


def test_global_options_are_taken_after_the_command_too(database_url: str) -> None:
    """The README's ``conveyor migrate --db URL`` failed with "No such option: --db"."""
    migrated = conveyor(None, "migrate", "--db", database_url)
    assert migrated.code == 0 and migrated.out.startswith("applied "), migrated
    job = conveyor(None, "send", "e2e", e2e_app.WORK, "--payload", '{"kind": "ok", "n": 1}', "--db", database_url)
    assert job.code == 0, job
    assert conveyor(None, "stats", "--json", "--db", database_url).json()[0]["pending"] == 1
    # Nested groups: after the leaf command, or between the group and it.
    assert conveyor(None, "dlq", "list", "--db", database_url, "--json").json() == []
    assert conveyor(None, "dlq", "--db", database_url, "list", "--json").json() == []
    assert conveyor(None, "schedules", "list", "--json", "--db", database_url).json() == []
    # The later --db wins; -v and --app work after the command as well.
    other = conveyor("sqlite:////nonexistent-dir/x.db", "stats", "--json", "--db", database_url)
    assert other.json()[0]["queue"] == "e2e"
    verbose = conveyor(None, "stats", "--json", "--db", database_url, "-vv")
    assert verbose.code == 0 and json.loads(verbose.out)[0]["pending"] == 1
    contract = conveyor(None, "contract", "--format", "json", "--app", APP_PATH, "--db", database_url)
    assert contract.code == 0 and "e2e" in [q["queue"] for q in json.loads(contract.out)["queues"]], contract
    # And before the command, as always.
    assert conveyor(database_url, "stats", "--json").json()[0]["pending"] == 1


# -- numbers ----------------------------------------------------------------------------------

SEND_OPTIONS = [
    (["--delay", "nan"], "delay must be a finite number"),
    (["--delay", "inf"], "delay must be a finite number"),
    (["--delay", "1e300"], "100 years"),
    (["--ttl", "nan"], "ttl must be a finite number"),
    (["--ttl", "-inf"], "ttl must be a finite number"),
    (["--priority", "99999999999"], "priority must be between -2,147,483,648 and 2,147,483,647"),
    (["--priority", "-2147483649"], "priority must be between"),
    (["--max-attempts", "0"], "max_attempts must be between 1 and 1,000,000"),
    (["--max-attempts", "99999999999"], "max_attempts must be between"),
    (["--idempotency-key", ""], "idempotency_key must not be empty"),
    (["--ordering-key", "k" * 513], "ordering_key is 513 bytes, over the 512-byte limit"),
    (["--payload", "[" * 5000 + "]" * 5000], "--payload is nested too deeply"),
    (["--payload", '{"a":' * 150 + "1" + "}" * 150], "payload is nested deeper than 100 levels"),
    (["--payload", '{"a": "x\\u0000y"}'], "NUL character"),
    (["--headers", '{"a": "\\ud800"}'], "not valid Unicode"),
]


def test_bad_send_options_are_one_line_and_write_nothing(sqlite_url: str) -> None:
    assert conveyor(sqlite_url, "migrate").code == 0
    for options, message in SEND_OPTIONS:
        assert_one_line_error(conveyor(sqlite_url, "send", "e2e", "t", *options), message)
    assert stats(sqlite_url) == {}


def test_bad_numbers_elsewhere_are_one_line(sqlite_url: str) -> None:
    assert conveyor(sqlite_url, "migrate").code == 0
    cases = [
        (["dlq", "list", "--limit", "99999999999999999999"], "--limit"),
        (["audit", "--limit", "0"], "--limit"),
        (["dlq", "replay", "--all", "--queue", "q", "--reason", "r", "--rate", "nan"], "--rate"),
        (["dlq", "replay", "--all", "--queue", "q", "--reason", "r", "--rate", "inf"], "--rate"),
        (["worker", APP_PATH, "--burst", "--visibility-timeout", "nan"], "visibility_timeout must be a finite"),
        (["worker", APP_PATH, "--burst", "--visibility-timeout", "0"], "visibility_timeout must be >= 0.5"),
        (["worker", APP_PATH, "--burst", "--visibility-timeout", "0.1"], "visibility_timeout must be >= 0.5"),
        (["worker", APP_PATH, "--burst", "--graceful-timeout", "nan"], "graceful_timeout must be a finite"),
        (["worker", APP_PATH, "--burst", "-p", "2", "--graceful-timeout", "inf"], "graceful_timeout must be a finite"),
        (["schedules", "add", "s", "--cron", "* * * * *", "--task", "t", "--priority", "2147483648"], "priority"),
    ]
    for argv, message in cases:
        assert_one_line_error(conveyor(sqlite_url, *argv), message)
    assert conveyor(sqlite_url, "schedules", "list", "--json").json() == []


def test_worker_queues_that_name_no_queue_or_one_weighted_twice_are_one_line(sqlite_url: str) -> None:
    # Before: "" and "," drained every queue the app declares, and a:3,a:1 was told to give every queue a weight.
    send(sqlite_url, e2e_app.WORK, {"kind": "ok", "n": 1})
    for queues, message in [
        ("", "--queues '' names no queue"),
        (" , ", "--queues ' , ' names no queue"),
        ("e2e:3,e2e:1", "--queues: queue 'e2e' is given a weight twice"),
    ]:
        assert_one_line_error(conveyor(sqlite_url, "worker", APP_PATH, "--burst", "--queues", queues), message)
    assert stats(sqlite_url)[e2e_app.WORK_QUEUE]["pending"] == 1


def test_worker_weights_that_are_not_plain_decimal_or_are_huge_are_one_line(sqlite_url: str) -> None:
    # Before: a Unicode digit ('²' is a digit to str.isdigit, not to int) and a weight past Python's 4,300-digit
    # limit raised ValueError from int(): a traceback, not the option's error.
    send(sqlite_url, e2e_app.WORK, {"kind": "ok", "n": 1})
    for queues, message in [
        ("e2e:²", "--queues: weight of 'e2e' must be a positive integer, got '²'"),
        ("e2e:٣", "--queues: weight of 'e2e' must be a positive integer"),
        ("e2e:" + "9" * 5000, "--queues: weight of 'e2e' must be between 1 and 1,000,000"),
        ("e2e:00000003000000", "weight of e2e must be between 1 and 1,000,000, got 3,000,000"),
    ]:
        assert_one_line_error(conveyor(sqlite_url, "worker", APP_PATH, "--burst", "--queues", queues), message)
    assert stats(sqlite_url)[e2e_app.WORK_QUEUE]["pending"] == 1


def test_an_integer_past_pythons_4300_digits_in_a_json_option_is_one_line(sqlite_url: str) -> None:
    # Valid JSON that json.loads refuses with a ValueError (not a JSONDecodeError): a traceback before.
    assert conveyor(sqlite_url, "migrate").code == 0
    huge = '{"n": ' + "9" * 5000 + "}"
    cases = [
        (["send", "e2e", "t", "--payload", huge], "--payload"),
        (["send", "e2e", "t", "--headers", huge], "--headers"),
        (["publish", "orders", "--payload", huge], "--payload"),
        (["publish", "orders", "--headers", huge], "--headers"),
        (["schedules", "add", "s", "--cron", "* * * * *", "--task", "t", "--payload", huge], "--payload"),
        (["topics", "subscribe", "orders", "q", "--task", "t", "--filter", huge], "--filter"),
    ]
    for argv, option in cases:
        assert_one_line_error(conveyor(sqlite_url, *argv), option, "4,300 digits")
    assert stats(sqlite_url) == {}
    assert conveyor(sqlite_url, "schedules", "list", "--json").json() == []
    assert conveyor(sqlite_url, "topics", "list", "--json").json() == []


def test_a_topic_filter_that_can_match_nothing_is_one_line_and_writes_nothing(sqlite_url: str) -> None:
    # Before: --filter '{"region": {"in": []}}' was stored, and the subscription never received a message.
    assert conveyor(sqlite_url, "migrate").code == 0
    subscribe = ("topics", "subscribe", "orders", "q", "--task", "t", "--filter")
    run = conveyor(sqlite_url, *subscribe, '{"region": {"in": []}}')
    assert_one_line_error(run, """filter on 'region': {"in": []} matches no message""")
    assert_one_line_error(conveyor(sqlite_url, *subscribe, '{"region": NaN}'), "subscription filter is not JSON")
    assert conveyor(sqlite_url, "topics", "list", "--json").json() == []


def test_bad_cron_expressions_are_one_line_and_write_nothing(sqlite_url: str) -> None:
    """``*/``, ``1_0`` and ``+5`` were taken as every minute, minute 10 and minute 5."""
    assert conveyor(sqlite_url, "migrate").code == 0
    bad = [
        ("*/ * * * *", "bad minute field '*/'"),
        ("1_0 * * * *", "bad minute field '1_0'"),
        ("0 +5 * * *", "bad hour field '+5'"),
        ("0 0 31 2 *", "never fires"),
    ]
    for cron, message in bad:
        assert_one_line_error(conveyor(sqlite_url, "schedules", "add", "s", "--cron", cron, "--task", "t"), message)
    assert conveyor(sqlite_url, "schedules", "list", "--json").json() == []
    assert conveyor(sqlite_url, "schedules", "add", "s", "--cron", "0 0 29 2 *", "--task", "t").code == 0
    for cron, message in bad:
        assert_one_line_error(conveyor(sqlite_url, "schedules", "set", "s", "--cron", cron), message)
    assert [s["cron"] for s in conveyor(sqlite_url, "schedules", "list", "--json").json()] == ["0 0 29 2 *"]


def test_visibility_timeout_nan_cannot_lease_a_job_and_lose_it(sqlite_url: str) -> None:
    """SQLite stores now + NaN as NULL: the lease never expired and rescue never returned the job."""
    job = send(sqlite_url, e2e_app.WORK, {"kind": "ok", "n": 1})
    assert_one_line_error(
        conveyor(sqlite_url, "worker", APP_PATH, "--queues", "e2e", "--burst", "--visibility-timeout", "nan"),
        "visibility_timeout must be a finite number",
    )
    row = stats(sqlite_url)["e2e"]
    assert (row["pending"], row["processing"]) == (1, 0)
    assert conveyor(sqlite_url, "job", job, "--json").json()["deliveries"] == 0
    drained = conveyor(sqlite_url, "worker", APP_PATH, "--queues", "e2e", "--burst", timeout=120)
    assert drained.code == 0, drained
    assert conveyor(sqlite_url, "job", job, "--json").json()["state"] == "completed"


# -- names and keys ----------------------------------------------------------------------------


def test_names_and_keys_past_the_limits_are_one_line_and_write_nothing(database_url: str) -> None:
    """On PostgreSQL a key past the btree limit was reported as "database unavailable"."""
    assert conveyor(database_url, "migrate").code == 0
    assert_one_line_error(conveyor(database_url, "send", "q" * 201, "t"), "queue is 201 characters long")
    assert_one_line_error(conveyor(database_url, "send", "e2e", "t" * 201), "task is 201 characters long")
    key = _incompressible(1000)  # 3,000 bytes
    assert_one_line_error(
        conveyor(database_url, "send", "e2e", "t", "--idempotency-key", key), "idempotency_key is 3000 bytes"
    )
    # Bytes that are not UTF-8 on the command line arrive as lone surrogates.
    assert_one_line_error(conveyor(database_url, "send", "q\udcff", "t"), "queue is not valid Unicode")
    assert stats(database_url) == {}
    for argv, message in [
        (["schedules", "add", "", "--cron", "* * * * *", "--task", "t"], "schedule name must not be empty"),
        (["schedules", "add", "s", "--cron", "* * * * *", "--task", ""], "schedule task must not be empty"),
        (["schedules", "add", key, "--cron", "* * * * *", "--task", "t"], "schedule name is 1000 characters long"),
        (["schedules", "add", "s", "--cron", "* * * * *", "--task", "t", "--queue", key], "schedule queue is 1000"),
        (["topics", "subscribe", key, "q", "--task", "t"], "topic is 1000 characters long"),
    ]:
        assert_one_line_error(conveyor(database_url, *argv), message)
    assert conveyor(database_url, "schedules", "list", "--json").json() == []
    assert conveyor(database_url, "topics", "list", "--json").json() == []


# -- dlq purge ---------------------------------------------------------------------------------


def test_dlq_purge_never_deletes_without_yes_when_stdin_is_not_a_terminal(sqlite_url: str) -> None:
    dead = [send(sqlite_url, e2e_app.WORK, {"kind": "permanent", "n": n}) for n in range(2)]
    assert conveyor(sqlite_url, "worker", APP_PATH, "--queues", "e2e", "--burst", timeout=120).code == 0
    assert stats(sqlite_url)["e2e"]["dead"] == 2
    for argv in (["--all", "--queue", "e2e"], [dead[0]]):
        refused = conveyor(sqlite_url, "dlq", "purge", *argv, "--reason", "cleanup")
        assert_one_line_error(refused, "pass --yes")
    assert stats(sqlite_url)["e2e"]["dead"] == 2
    assert conveyor(sqlite_url, "audit", "--json").json() == []
    purged = conveyor(sqlite_url, "dlq", "purge", "--all", "--queue", "e2e", "--reason", "cleanup", "--yes")
    assert (purged.code, purged.out) == (0, "purged 2 dead letter(s)\n"), purged
    assert conveyor(sqlite_url, "dlq", "list", "--json").json() == []


# -- printing names ----------------------------------------------------------------------------

EVIL_QUEUE = "q\x1b[2J\x07"
EVIL_TASK = "t\x1b]0;pwned\x07\u202e"
MARKUP_QUEUE = "[/]"


def _assert_printable(text: str) -> None:
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", text), repr(text)


def test_control_characters_in_names_are_escaped_when_printed(sqlite_url: str) -> None:
    """An ESC in a queue or task name reached the operator's terminal raw (it can clear the screen,
    retitle the window, or hide text); a name that looks like rich markup crashed the table."""
    evil = send_to(sqlite_url, EVIL_QUEUE, EVIL_TASK)
    send_to(sqlite_url, MARKUP_QUEUE, "t")
    table = wide(sqlite_url, "stats")
    assert table.code == 0 and table.err == "", table
    _assert_printable(table.out)
    assert "q\\x1b[2J\\x07" in table.out and "[/]" in table.out
    shown = conveyor(sqlite_url, "job", evil)
    assert shown.code == 0, shown
    _assert_printable(shown.out)
    assert "t\\x1b]0;pwned\\x07\\u202e" in shown.out
    # JSON output is escaped by JSON itself, and keeps the names exact.
    assert conveyor(sqlite_url, "job", evil, "--json").json()["queue"] == EVIL_QUEUE

    # Dead letters: an unknown task is dead-lettered without running.
    worker = conveyor(
        sqlite_url, "worker", APP_PATH, "--queues", f"{EVIL_QUEUE},{MARKUP_QUEUE}", "--burst", timeout=120
    )
    assert worker.code == 0, worker
    listed = wide(sqlite_url, "dlq", "list")
    assert listed.code == 0 and listed.err == "", listed
    _assert_printable(listed.out)
    assert "q\\x1b[2J" in listed.out

    added = conveyor(sqlite_url, "schedules", "add", "s\x1b[31m", "--cron", "* * * * *", "--task", EVIL_TASK)
    assert added.code == 0, added
    _assert_printable(added.out)
    listed = wide(sqlite_url, "schedules", "list")
    assert listed.code == 0, listed
    _assert_printable(listed.out)
    assert "s\\x1b[31m" in listed.out
    subscribed = conveyor(sqlite_url, "topics", "subscribe", "o\x1b[8m", EVIL_QUEUE, "--task", "[bold]t")
    assert subscribed.code == 0, subscribed
    _assert_printable(subscribed.out)
    topics = wide(sqlite_url, "topics", "list")
    assert topics.code == 0, topics
    _assert_printable(topics.out)
    assert "[bold]t" in topics.out
    # Errors that quote a name are escaped too.
    missing = conveyor(sqlite_url, "schedules", "pause", "nope\x1b[2J")
    _assert_printable(assert_one_line_error(missing, "no schedule named"))


def wide(db: str, *args: str) -> Run:
    """``conveyor`` with a terminal width that fits whole names in its tables."""
    return conveyor(db, *args, env={"COLUMNS": "250"})


def send_to(db: str, queue: str, task: str) -> str:
    run = conveyor(db, "send", queue, task, "--json")
    assert run.code == 0, run
    return str(run.json()["id"])


# -- passwords ---------------------------------------------------------------------------------


def test_passwords_never_appear_and_a_malformed_url_fails_fast() -> None:
    refused = conveyor(f"postgresql://bob:{SECRET}@127.0.0.1:{_closed_port()}/db", "stats", timeout=60)
    assert_one_line_error(refused, "PostgreSQL unreachable", "refused")
    assert SECRET not in refused.out + refused.err
    refused = conveyor(f"mysql://bob:{SECRET}@127.0.0.1:{_closed_port()}/db", "stats", timeout=60)
    assert_one_line_error(refused, "MySQL unavailable", "Can't connect")
    assert SECRET not in refused.out + refused.err
    for url in (
        f"postgresql://bob:{SECRET}@[::1/db",
        f"postgresql://bob:{SECRET}@localhost:notaport/db",
        f"oracle://bob:{SECRET}@localhost/db",
        f"mysql://bob:{SECRET}@localhost:notaport/db",
    ):
        started = time.monotonic()
        run = conveyor(url, "stats")
        assert time.monotonic() - started < 5, run  # no pool retrying in the background until a timeout
        line = assert_one_line_error(run, "bob:***@")
        assert SECRET not in line + run.out
    # A password of bytes that are not UTF-8 (the shell's $'\xff'): was a UnicodeEncodeError traceback.
    run = conveyor(f"postgresql://bob:{SECRET}\udcff@127.0.0.1/db", "stats")
    line = assert_one_line_error(run, "bob:***@", "not valid UTF-8")
    assert SECRET not in line + run.out


def test_output_a_terminal_cannot_encode_is_escaped_not_a_traceback(sqlite_url: str) -> None:
    # Before: on an ASCII terminal (PYTHONIOENCODING=ascii) stats and dlq list died on the tables' "…"
    # and on non-ASCII names with a UnicodeEncodeError traceback.
    assert conveyor(sqlite_url, "send", "t\u00e4\u20acsk", "job").code == 0
    for args in (("stats",), ("dlq", "list"), ("stats", "--json")):
        run = conveyor(sqlite_url, *args, env={"PYTHONIOENCODING": "ascii"})
        assert run.code == 0 and "Traceback" not in run.err, run
    assert "t\\xe4\\u20acsk" in conveyor(sqlite_url, "stats", env={"PYTHONIOENCODING": "ascii"}).out


@pytest.mark.parametrize("where", ["before", "after"])
def test_migrate_with_a_malformed_url_is_one_line(where: str) -> None:
    url = f"postgresql://bob:{SECRET}@localhost/db?bogus=1"
    run = conveyor(url, "migrate") if where == "before" else conveyor(None, "migrate", "--db", url)
    line = assert_one_line_error(run, "malformed PostgreSQL URL")
    assert SECRET not in line


@pytest.mark.parametrize("url", ["memory://", "sqlite:///:memory:"])
def test_a_private_in_memory_database_is_refused_by_every_command(url: str) -> None:
    # Before: each command got a database of its own that died with it: `send` answered with an id for a
    # job nobody could ever run, `stats` showed nothing, and a worker drained nothing, all with exit 0.
    for args in (
        ("send", "e2e", e2e_app.WORK, "--payload", "{}"),
        ("stats",),
        ("dlq", "list"),
        ("worker", APP_PATH, "--burst"),
        ("serve", "--port", "0"),
    ):
        result = conveyor(url, *args)
        assert_one_line_error(result, "private in-memory database")


def test_a_sqlite_file_that_cannot_be_used_is_named_in_the_error(tmp_path: Path) -> None:
    # SQLite's own messages never say which file: "unable to open database file".
    missing = tmp_path / "no-such-dir" / "x.db"
    assert_one_line_error(conveyor(f"sqlite:///{missing}", "stats"), str(missing), "does not exist")
    text = tmp_path / "notes.db"
    text.write_text("not a database\n" * 100)
    assert_one_line_error(conveyor(f"sqlite:///{text}", "stats"), str(text), "file is not a database")
