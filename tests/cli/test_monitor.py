"""`conveyor workers` and `conveyor alerts`: the operator API's worker registry and alert states from a
shell, as a table or JSON (the same dicts the HTTP API answers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.conftest import make_dead_letters

from conveyor import App
from conveyor._alerts import AlertRules
from conveyor.cli import main


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_workers_lists_a_running_worker_and_forgets_it_once_it_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/conveyor.db"
    (tmp_path / "monitored.py").write_text(
        textwrap.dedent(
            """
            from conveyor import App
            app = App()

            @app.task(queue="mail")
            def send() -> None: ...
            """
        )
    )
    App(db, migrate=True).close()
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = dict(os.environ, CONVEYOR_DATABASE_URL=db, PYTHONPATH=path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "worker", "monitored:app", "--concurrency", "3"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        rows: object = []
        while time.monotonic() < deadline:
            rows = _json(capsys, ["--db", db, "workers", "--json"])
            if rows:
                break
            time.sleep(0.1)
        assert isinstance(rows, list) and len(rows) == 1, rows
        row = rows[0]
        assert (row["pid"], row["queues"], row["concurrency"], row["alive"], row["in_flight"]) == (
            proc.pid,
            ["mail"],
            3,
            True,
            [],
        )
        capsys.readouterr()
        assert main(["--db", db, "workers"]) == 0
        table = capsys.readouterr().out
        assert "Conveyor workers" in table and str(proc.pid) in table and "mail" in table
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert _json(capsys, ["--db", db, "workers", "--json"]) == []


def test_alerts_shows_what_the_evaluator_stored_and_firing_filters(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _json(capsys, ["--db", sqlite_url, "alerts", "--json"]) == []  # nothing evaluated yet
    make_dead_letters(sqlite_url)
    with App(sqlite_url) as app:
        changed = app.admin.evaluate_alerts(AlertRules())
    firing = [a.to_json() for a in changed if a.state == "firing"]
    assert any(a["rule"] == "dlq_depth" and a["queue"] == "doomed" for a in firing), firing
    shown = _json(capsys, ["--db", sqlite_url, "alerts", "--firing", "--json"])
    assert shown == firing
    capsys.readouterr()
    assert main(["--db", sqlite_url, "alerts"]) == 0
    table = capsys.readouterr().out
    assert "dlq_depth" in table and "doomed" in table and "firing" in table
