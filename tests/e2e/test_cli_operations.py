"""The CLI for delivery features (real `python -m conveyor` processes): schedules, topics, publish, contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(db: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", "--db", db, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def ok(db: str, *args: str) -> str:
    result = run(db, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("conveyor: error:") and needle in lines[0], result.stderr


@pytest.fixture
def db(database_url: str) -> str:
    ok(database_url, "migrate")
    return database_url


def test_schedules_at_runtime(db: str) -> None:
    ok(
        db,
        "schedules",
        "add",
        "nightly",
        "--cron",
        "0 2 * * *",
        "--task",
        "export.run",
        "--queue",
        "exports",
        "--payload",
        '{"full": true}',
    )
    listed = json.loads(ok(db, "schedules", "list", "--json"))
    assert [(s["name"], s["cron"], s["task"], s["queue"], s["payload"], s["paused"]) for s in listed] == [
        ("nightly", "0 2 * * *", "export.run", "exports", {"full": True}, False)
    ]
    assert listed[0]["next_run_at"].endswith("02:00:00+00:00")
    ok(db, "schedules", "pause", "nightly")
    assert json.loads(ok(db, "schedules", "list", "--json"))[0]["paused"] is True
    ok(db, "schedules", "resume", "nightly")
    ok(db, "schedules", "set", "nightly", "--cron", "30 3 * * *")
    listed = json.loads(ok(db, "schedules", "list", "--json"))
    assert (listed[0]["cron"], listed[0]["paused"]) == ("30 3 * * *", False)
    assert listed[0]["next_run_at"].endswith("03:30:00+00:00")
    one_line_error(run(db, "schedules", "set", "nightly", "--cron", "61 * * * *"), "minute")
    one_line_error(run(db, "schedules", "pause", "nope"), "no schedule named 'nope'")
    ok(db, "schedules", "remove", "nightly")
    assert json.loads(ok(db, "schedules", "list", "--json")) == []


def test_topics_publish_and_contract(db: str) -> None:
    ok(db, "topics", "subscribe", "orders", "billing", "--task", "billing.charge")
    ok(db, "topics", "subscribe", "orders", "eu", "--task", "ship.eu", "--filter", '{"region": {"in": ["eu"]}}')
    one_line_error(
        run(db, "topics", "subscribe", "orders", "x", "--task", "t", "--filter", '{"region": ["eu"]}'), '"in"'
    )
    assert len(json.loads(ok(db, "topics", "list", "--json"))) == 2
    assert (
        len(json.loads(ok(db, "publish", "orders", "--payload", '{"n": 1}', "--headers", '{"region": "eu"}', "--json")))
        == 2
    )
    assert len(json.loads(ok(db, "publish", "orders", "--payload", '{"n": 2}', "--json"))) == 1
    contract = json.loads(ok(db, "contract", "--format", "json"))
    assert {q["queue"] for q in contract["queues"]} >= {"billing", "eu"}
    assert contract["topics"][0]["topic"] == "orders"
    assert "## Topics" in ok(db, "contract")
    assert "topics:" in ok(db, "contract", "--format", "yaml")
    ok(db, "topics", "unsubscribe", "orders", "eu")
    one_line_error(run(db, "topics", "unsubscribe", "orders", "eu"), "not subscribed")


def test_contract_of_an_app(db: str) -> None:
    out = ok(db, "contract", "--app", "examples.demo:app", "--format", "json")
    queues = {q["queue"]: q for q in json.loads(out)["queues"]}
    assert queues["emails"]["tasks"][0]["max_attempts"] == 3
    assert queues["images"]["tasks"][0]["backoff"] == "fixed 0.1s"
    one_line_error(run(db, "contract", "--app", "nope"), "module:attribute")


def test_weighted_lanes_option_errors(db: str) -> None:
    one_line_error(run(db, "worker", "examples.demo:app", "--queues", "a:3,b"), "weight")
    one_line_error(run(db, "worker", "examples.demo:app", "--queues", "a:x"), "positive integer")


def test_send_applies_the_apps_backpressure(db: str) -> None:
    args = ("--app", "tests.e2e.bounded_app:app", "send", "bounded", "t")
    ok(db, *args)
    ok(db, *args)
    one_line_error(run(db, *args), "queue 'bounded' is full")
    assert json.loads(ok(db, "stats", "--json"))[0]["pending"] == 2
