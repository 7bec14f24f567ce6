"""The per-queue totals (``Admin.queues()``, ``Admin.task_totals()``) against a COUNT over the archive,
after a mixed workload with a worker process killed mid-work (SIGKILL, possibly mid-flush), replays,
purges and retention, on every engine (docs/observability.md: the totals commit with the archive rows
or not at all)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from types import ModuleType

from tests.conftest import query_rows

from conveyor import App
from conveyor._clock import host_now
from conveyor.backends.base import ArchivePruneParams

from .conftest import drain

TASKS = """
import time
from conveyor import App

app = App({url!r})


@app.task(queue="alpha", name="ok")
def ok(i: int) -> int:
    return i


@app.task(queue="alpha", name="boom", max_attempts=1)
def boom(i: int) -> None:
    raise ValueError(i)


@app.task(queue="beta", name="slow", visibility_timeout=1)
def slow(i: int) -> None:
    time.sleep(0.02)
    if i % 7 == 0:
        raise ValueError(i)
"""


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _archive(database_url: str) -> tuple[Counter[tuple[str, str, str]], Counter[str]]:
    """(queue, task, state) -> archived rows, and queue -> unreplayed dead letters, counted in SQL."""
    query = "SELECT queue, task, state, replayed_by IS NULL FROM archive"
    rows = query_rows(database_url, query)
    ended = Counter((q, t, s) for q, t, s, _ in rows)
    dlq = Counter(q for q, _, s, unreplayed in rows if s == "dead" and unreplayed)
    return ended, dlq


def _totals(app: App) -> Counter[tuple[str, str, str]]:
    out: Counter[tuple[str, str, str]] = Counter()
    for t in app.admin.task_totals():
        for state in ("completed", "dead", "expired", "cancelled"):
            if getattr(t, state):
                out[(t.queue, t.task, state)] = getattr(t, state)
    return out


def _settle(app: App) -> None:
    """Drain until no job is live (the killed worker's leases expire after 1 s and are rescued)."""
    deadline = time.monotonic() + 60
    while any(q.pending + q.scheduled + q.processing for q in app.admin.queues()):
        assert time.monotonic() < deadline, app.admin.queues()
        drain(app, rescue_interval=0.1)
        time.sleep(0.3)


def test_totals_equal_a_count_over_the_archive_after_crash_replay_purge_and_retention(
    database_url: str, tmp_path: Path
) -> None:
    module_path = tmp_path / "counted_tasks.py"
    module_path.write_text(TASKS.format(url=database_url))
    app: App = _load(module_path, f"counted_tasks_{abs(hash(database_url))}").app
    app.admin.migrate()
    for i in range(40):
        app.send("ok", {"i": i}, queue="alpha")
        app.send("boom", {"i": i}, queue="alpha")
    for i in range(400):
        app.send("slow", {"i": i}, queue="beta")
    app.send("ok", {"i": -1}, queue="alpha", ttl=0.001)
    time.sleep(0.01)

    # A worker process killed while it works and flushes: what it committed is counted once, what it
    # did not is redelivered after its leases expire and counted when it ends.
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "worker", "counted_tasks:app", "--concurrency", "8"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while sum(q.completed for q in app.admin.queues()) < 50:
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.01)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    assert any(q.pending + q.processing for q in app.admin.queues()), "the worker was not killed mid-work"
    _settle(app)

    dead = app.admin.dead_letters(queue="alpha", limit=1000)
    app.admin.replay([d.id for d in dead[:10]], reason="test", actor="t")
    _settle(app)
    dead_beta = app.admin.dead_letters(queue="beta", limit=1000)
    purged = app.admin.purge([d.id for d in dead_beta[:5]], reason="test", actor="t").purged
    assert purged == 5

    ended, dlq = _archive(database_url)
    totals = _totals(app)
    # A purge deletes the dead letter's archive row; its dead-lettering stays in the totals.
    assert totals == ended + Counter({("beta", "slow", "dead"): purged})
    stats = {q.queue: q for q in app.admin.queues()}
    assert {q: s.dead for q, s in stats.items() if s.dead} == dict(dlq)
    assert stats["alpha"].expired == 1
    # Every job ended exactly once: 81 sent to alpha plus 10 replays, 400 to beta.
    assert (stats["alpha"].enqueued, stats["beta"].enqueued) == (91, 400)
    assert sum(n for (q, _, _), n in totals.items() if q == "alpha") == 91

    # Retention deletes archive rows and never lowers a total; the DLQ depth follows the archive.
    far = host_now() + timedelta(days=400)
    while app.backend.archive_prune(ArchivePruneParams(far, far, far)):
        pass
    assert _archive(database_url) == (Counter(), Counter())
    assert _totals(app) == totals
    after = {q.queue: q for q in app.admin.queues()}
    assert all(s.dead == 0 for s in after.values())
    assert {q: (s.completed, s.dead_total, s.expired, s.enqueued) for q, s in after.items()} == {
        q: (s.completed, s.dead_total, s.expired, s.enqueued) for q, s in stats.items()
    }
    app.close()
