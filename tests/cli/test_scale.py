"""``app.admin.scaling`` on SQLite and PostgreSQL, ``conveyor scale`` (the recommendation for an external
autoscaler), and the bad input of ``conveyor scale`` and ``conveyor worker --autoscale``: one line, a non-zero
exit, no traceback, no process started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.e2e import e2e_app
from tests.e2e._support import APP_PATH
from tests.e2e.test_cli import assert_one_line_error, conveyor

from conveyor import App, ConfigurationError, Message
from conveyor.admin import ScalingPolicy


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/conveyor.db"
    return str(request.getfixturevalue("postgres_database"))


def _load(url: str) -> None:
    """25 ready jobs on e2e, 3 on slow, 4 scheduled (not load), one in flight on e2e."""
    with App(url, migrate=True) as app:
        e2e_app.register(app)
        app.send_many([Message(task=e2e_app.WORK, payload={"kind": "ok", "n": n}) for n in range(26)])
        app.send_many([Message(task=e2e_app.SLOW, payload={"seconds": 1}) for _ in range(3)])
        app.send_many([Message(task=e2e_app.WORK, payload={"kind": "ok", "n": 0}, delay=3600) for _ in range(4)])
        from conveyor.backends.base import JobsAcquireParams  # one lease, as a worker takes it

        backend = app.backend
        now = app.clock.now()
        acquired = backend.jobs_acquire(
            JobsAcquireParams(queue="e2e", limit=1, worker_id="test", visibility_timeout=60.0, now=now)
        )
        assert len(acquired) == 1


def test_admin_scaling_reads_the_load_of_the_queues(url: str) -> None:
    _load(url)
    with App(url) as app:
        both = app.admin.scaling(ScalingPolicy(1, 8), queues=["e2e", "slow"], current=2)
        assert (both.desired, both.current, both.ready, both.in_flight) == (3, 2, 28, 1)
        assert "29 jobs at 10 per process want 3" in both.reason
        assert app.admin.scaling(ScalingPolicy(1, 8), queues=["slow"]).to_json() == {
            "desired": 1,
            "current": 1,
            "ready": 3,
            "in_flight": 0,
            "reason": "ready 3, in flight 0: 3 jobs at 10 per process want 1",
        }
        assert app.admin.scaling(ScalingPolicy(1, 8), concurrency=2).desired == 8  # every queue, 29 / 2
        assert app.admin.scaling(ScalingPolicy(1, 8, target=4), queues=["e2e"]).desired == 7
        steps = ScalingPolicy(1, 8, steps=((10, 2), (20, 3)))
        assert app.admin.scaling(steps, queues=["e2e"], current=4).desired == 7
        assert app.admin.scaling(steps, queues=["slow"], current=4).desired == 3
        assert app.admin.scaling(ScalingPolicy(2, 8), queues=["nothing-here"]).desired == 2
        for bad in ([], [""], ["a" * 1000], [None]):
            with pytest.raises(ConfigurationError):
                app.admin.scaling(ScalingPolicy(1, 8), queues=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="current"):
            app.admin.scaling(ScalingPolicy(1, 8), current=-1)


def test_conveyor_scale_prints_one_line_or_json(postgres_database: str) -> None:
    _load(postgres_database)
    line = conveyor(postgres_database, "scale", "--queues", "e2e,slow", "--autoscale", "1:8", "--current", "2")
    assert (
        line.code == 0
        and line.out == "desired 3 (current 2): ready 28, in flight 1: 29 jobs at 10 per process want 3\n"
    )
    as_json = conveyor(postgres_database, "scale", APP_PATH, "--autoscale", "1:8", "--scale-steps", "20:4", "--json")
    assert as_json.json() == {
        "desired": 5,
        "current": 1,
        "ready": 28,
        "in_flight": 1,
        "reason": "ready 28, in flight 1: backlog >= 20 adds 4",
    }


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--autoscale", "3:2"], "minimum 3 is above its maximum 2"),
        (["--autoscale", "0:2"], "minimum must be from 1 to 256"),
        (["--autoscale", "1:257"], "maximum must be from 1 to 256"),
        (["--autoscale", "-1:2"], "autoscale must be MIN:MAX"),
        (["--autoscale", "nan:2"], "autoscale must be MIN:MAX"),
        (["--autoscale", ""], "autoscale must be MIN:MAX"),
        (["--autoscale", "1:2\x01"], "autoscale must be MIN:MAX"),
        (["--autoscale", "1:" + "9" * 5000], "autoscale must be MIN:MAX"),
        (["--autoscale", "1:3", "--scale-steps", "10:x"], "scale steps must be BACKLOG:ADD"),
        (["--autoscale", "1:3", "--scale-steps", ""], "scale steps: give at least one step"),
        (["--autoscale", "1:3", "--scale-steps", "10:1,10:2"], "backlog 10 is given twice"),
        (["--autoscale", "1:3", "--scale-target", "nan"], "--scale-target"),
        (["--autoscale", "1:3", "--scale-target", "0"], "--scale-target"),
        (["--autoscale", "1:3", "--scale-target", "2", "--scale-steps", "1:1"], "not both"),
    ],
)
@pytest.mark.parametrize("command", ["scale", "worker"])
def test_bad_autoscale_input_is_one_line(tmp_path: Path, command: str, args: list[str], fragment: str) -> None:
    db = f"sqlite:///{tmp_path}/conveyor.db"
    argv = ["scale", "--queues", "e2e"] if command == "scale" else ["worker", APP_PATH]
    assert_one_line_error(conveyor(db, *argv, *args, timeout=30), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--autoscale", "1:3", "--processes", "2"], "give it or --processes, not both"),
        (["--autoscale", "1:3", "--burst"], "cannot be combined with --burst"),
        (["--scale-steps", "10:1"], "--scale-steps needs --autoscale"),
        (["--scale-in-cooldown", "5"], "--scale-in-cooldown needs --autoscale"),
        (["--autoscale", "1:3", "--scale-interval", "0"], "--scale-interval"),
        (["--autoscale", "1:3", "--scale-in-cooldown", "inf"], "--scale-in-cooldown"),
        (["--autoscale", "1:3", "--scale-out-cooldown", "-1"], "--scale-out-cooldown"),
    ],
)
def test_bad_worker_autoscale_combinations_are_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    db = f"sqlite:///{tmp_path}/conveyor.db"
    assert_one_line_error(conveyor(db, "worker", APP_PATH, *args, timeout=30), fragment)


def test_bad_scale_queues_are_one_line(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/conveyor.db"
    App(db, migrate=True).close()
    assert_one_line_error(conveyor(db, "scale", "--queues", ",", "--autoscale", "1:3"), "--queues")
    assert_one_line_error(conveyor(db, "scale", "--queues", "a" * 500, "--autoscale", "1:3"), "queue")
    assert_one_line_error(conveyor(db, "scale", "--autoscale", "1:3", "--current", "-1"), "--current")
    missing = conveyor(db, "scale", "--queues", "e2e")
    assert_one_line_error(missing, "--autoscale")
    assert json.loads(conveyor(db, "scale", "--autoscale", "2:3", "--json").out)["desired"] == 2
