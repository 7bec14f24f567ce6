"""Every alert rule fires and resolves, and each change reaches a real local webhook receiver; bad
thresholds and webhook URLs are refused; a webhook that hangs or answers 500 harms nothing else."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from tests.conftest import driver_connection

from conveyor import App, ConfigurationError
from conveyor._alerting import AlertLoop, Webhooks
from conveyor._alerts import AlertRules, check_webhook
from conveyor._clock import host_now

from ._receiver import Receiver
from .conftest import Running


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


class Loop:
    """An AlertLoop with webhooks, driven a round at a time on one event loop."""

    def __init__(self, app: App, rules: AlertRules, *urls: str) -> None:
        self.runner = asyncio.Runner()
        self.webhooks = Webhooks(list(urls), attempts=3, timeout=1.0, backoff=0.05)
        self.loop = AlertLoop(app.admin, rules, self.webhooks, interval=0.05)

    def round(self) -> int:
        async def once() -> int:
            changed = await self.loop.run_once()
            # Let the deliveries run (they are tasks on this loop).
            pending = set(self.webhooks._tasks)
            if pending:
                await asyncio.wait(pending, timeout=15)
            return changed

        return self.runner.run(once())

    def close(self) -> None:
        self.runner.run(self.webhooks.drain(1.0))
        self.runner.close()


def _states(receiver: Receiver, rule: str) -> list[tuple[Any, str]]:
    return [(m["queue"], m["state"]) for m in receiver.received if m["rule"] == rule]


def _current(app: App, rule: str, queue: str | None) -> str | None:
    found = [a for a in app.admin.alerts() if a.rule == rule and a.queue == queue]
    return found[0].state if found else None


def test_dlq_depth_fires_on_a_dead_letter_and_resolves_on_purge(app: App, receiver: Receiver) -> None:
    @app.task(queue="q", name="doomed")
    def doomed() -> None:
        raise ValueError("bad")

    job = doomed.delay()
    from .conftest import drain

    drain(app)
    loop = Loop(app, AlertRules(), receiver.url)
    try:
        assert loop.round() >= 1
        assert _current(app, "dlq_depth", "q") == "firing"
        assert _states(receiver, "dlq_depth") == [("q", "firing")]
        (message,) = [m for m in receiver.received if m["rule"] == "dlq_depth"]
        assert (message["value"], message["threshold"], message["source"]) == (1.0, 0.0, "conveyor")
        assert loop.round() == 0  # still firing: no second notification
        app.admin.purge([job.id], reason="test", actor="ops")
        loop.round()
        assert _current(app, "dlq_depth", "q") == "resolved"
        assert _states(receiver, "dlq_depth") == [("q", "firing"), ("q", "resolved")]
    finally:
        loop.close()


def test_oldest_pending_age_over_the_queue_sla(app: App, receiver: Receiver) -> None:
    app.queue("slow", sla=timedelta(seconds=5))

    @app.task(queue="slow", name="late")
    def late() -> None: ...

    app.send("late", {}, queue="slow", run_at=host_now() - timedelta(seconds=60))
    loop = Loop(app, AlertRules(queues=app.catalogue.queues), receiver.url)
    try:
        loop.round()
        assert _states(receiver, "oldest_pending_age") == [("slow", "firing")]
        alert = next(a for a in app.admin.alerts() if a.rule == "oldest_pending_age")
        assert alert.threshold == 5.0 and alert.value >= 60
        from .conftest import drain

        drain(app)
        loop.round()
        assert _states(receiver, "oldest_pending_age") == [("slow", "firing"), ("slow", "resolved")]
    finally:
        loop.close()


def test_depth_over_the_high_water_mark(app: App, receiver: Receiver) -> None:
    @app.task(queue="deep", name="work")
    def work() -> None: ...

    for _ in range(3):
        work.delay()
    loop = Loop(app, AlertRules({"depth:deep": 2}), receiver.url)
    try:
        loop.round()
        assert _states(receiver, "depth") == [("deep", "firing")]
        from .conftest import drain

        drain(app)
        loop.round()
        assert _states(receiver, "depth") == [("deep", "firing"), ("deep", "resolved")]
    finally:
        loop.close()


def test_no_worker_on_a_queue_with_ready_jobs_until_one_starts(app: App, receiver: Receiver) -> None:
    release = threading.Event()

    @app.task(queue="lonely", name="wait")
    def wait() -> None:
        release.wait(30)

    wait.delay()
    wait.delay()
    loop = Loop(app, AlertRules(), receiver.url)
    running = None
    try:
        loop.round()
        assert _states(receiver, "no_worker") == [("lonely", "firing")]
        from conveyor import Worker

        running = Running(Worker(app, concurrency=1, prefetch=1, presence_interval=0.05, poll_interval=0.02))
        deadline = asyncio.run(asyncio.sleep(0, result=None))
        del deadline
        for _ in range(400):
            if any(w.alive for w in app.admin.workers()):
                break
            threading.Event().wait(0.02)
        loop.round()
        assert _states(receiver, "no_worker") == [("lonely", "firing"), ("lonely", "resolved")]
    finally:
        release.set()
        if running is not None:
            running.stop()
        loop.close()


def test_long_transaction_fires_while_one_is_open(app: App, receiver: Receiver, database_url: str) -> None:
    loop = Loop(app, AlertRules({"long_transaction": 0.2}), receiver.url)
    try:
        if database_url.startswith("sqlite"):
            # SQLite has no transactions that hold back cleanup: the rule never applies.
            loop.round()
            assert _current(app, "long_transaction", None) is None
            return
        with driver_connection(database_url) as conn:
            # A report's (or pg_dump's) snapshot, left open: what holds vacuum (InnoDB's purge) back.
            if database_url.startswith("mysql"):
                conn.cursor().execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            else:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.execute("SELECT 1")
            # MySQL knows when a transaction began to the second only, and reports an age it is surely past.
            threading.Event().wait(1.5 if database_url.startswith("mysql") else 0.5)
            loop.round()
            assert (None, "firing") in _states(receiver, "long_transaction")
            conn.rollback()
        loop.round()
        assert _states(receiver, "long_transaction")[-1] == (None, "resolved")
    finally:
        loop.close()


def test_hostile_thresholds_and_webhooks_are_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match="finite number"):
        AlertRules({"dlq_depth": math.nan})
    with pytest.raises(ConfigurationError, match="finite number"):
        AlertRules.parse(["depth:q=inf"])
    with pytest.raises(ConfigurationError, match="finite number"):
        AlertRules.parse(["dlq_depth=-1"])
    with pytest.raises(ConfigurationError, match="must be a number"):
        AlertRules.parse(["dlq_depth=lots"])
    with pytest.raises(ConfigurationError, match="unknown alert rule"):
        AlertRules.parse(["dlq=1"])
    with pytest.raises(ConfigurationError, match="database-wide"):
        AlertRules.parse(["long_transaction:q=1"])
    for bad in ("ftp://host/x", "not a url", "http://", "http://user:pw@host/x", "http://host:99999/", ""):
        with pytest.raises(ConfigurationError):
            check_webhook(bad)
    assert AlertRules.parse(["no_worker=off"]).threshold("no_worker", "q") is None


def test_an_alert_interval_or_queue_that_cannot_work_is_refused(app: App) -> None:
    from conveyor.http import ServiceConfig
    from conveyor.http._api import create_app

    # NaN passed every range check and made the alert loop evaluate without a pause.
    for interval in (math.nan, math.inf, -1.0):
        with pytest.raises(ConfigurationError, match="alert_interval"):
            create_app(app, ServiceConfig(alert_interval=interval))
    # A queue name no queue can have would silently never match.
    for bad in ("dlq_depth:a\udcffb=1", "depth:" + "q" * 300 + "=1"):
        with pytest.raises(ConfigurationError, match="queue"):
            AlertRules.parse([bad])
    assert AlertRules.parse(['dlq_depth:q"\\\n<b>=1']).threshold("dlq_depth", 'q"\\\n<b>') == 1.0
    # http.client sends the request line as ASCII: a non-ASCII URL would fail every delivery.
    with pytest.raises(ConfigurationError, match="ASCII"):
        check_webhook("http://example.com/h\u00e9")


def test_a_hanging_or_failing_webhook_delays_nothing_else(app: App, receiver: Receiver) -> None:
    hanging, failing = Receiver("hang"), Receiver("error")

    @app.task(queue="q", name="doomed")
    def doomed() -> None:
        raise ValueError("bad")

    doomed.delay()
    from .conftest import drain

    drain(app)
    loop = Loop(app, AlertRules(), hanging.url, failing.url, receiver.url)
    try:
        loop.round()
        # The good receiver got it; the failing one was tried every time; the hanging one timed out.
        assert _states(receiver, "dlq_depth") == [("q", "firing")]
        assert failing.hits == 3
        outcomes = {d.url: d for d in loop.webhooks.recent}
        assert outcomes[receiver.url].delivered and outcomes[receiver.url].attempts == 1
        assert not outcomes[failing.url].delivered and outcomes[failing.url].status == 500
        assert not outcomes[hanging.url].delivered and "timed out" in (outcomes[hanging.url].error or "").lower()
    finally:
        loop.close()
        hanging.close()
        failing.close()


def test_a_webhook_that_redirects_is_not_delivered() -> None:
    # urllib followed a 302 with a GET that carries no body, and the GET's 200 counted as delivered:
    # the alert was lost while the log said nothing. A redirect is now a failed try.
    from conveyor.backends.base import AlertState

    redirecting = Receiver("redirect")
    alert = AlertState("dlq_depth", "q", "firing", host_now(), 1.0, 0.0, "queue q: 1 dead letter")

    hooks = Webhooks([redirecting.url], attempts=2, timeout=1.0, backoff=0.01)

    async def deliver() -> None:
        hooks.notify(alert)
        await hooks.drain(timeout=10)

    try:
        asyncio.run(deliver())
        assert redirecting.hits == 2 and redirecting.gets == 0
        assert [(d.delivered, d.status) for d in hooks.recent] == [(False, 302)]
    finally:
        redirecting.close()


def test_a_round_while_the_database_is_away_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    # Every round (every --alert-interval, 1 s or less) logged a full traceback while the database was
    # away; an outage is expected weather for this loop, so it is one line a round.
    from conveyor._errors import BackendUnavailable

    class Away:
        def evaluate_alerts(self, rules: AlertRules) -> list[Any]:
            raise BackendUnavailable("PostgreSQL unreachable (queues_stats): no connection within 5s")

    loop = AlertLoop(Away(), AlertRules(), None, interval=0.01)  # type: ignore[arg-type]

    async def rounds() -> None:
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.2)
        loop.stop()
        await task

    with caplog.at_level("WARNING", logger="conveyor"):
        asyncio.run(rounds())
    records = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert records, caplog.text
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records), caplog.text


def test_an_alert_on_a_queue_named_with_a_newline_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    from conveyor.backends.base import AlertState

    forged = AlertState("dlq_depth", "q\nFAKE alert resolved", "firing", host_now(), 1.0, 0.0, "queue q\nFAKE: 1")

    class Admin:
        def evaluate_alerts(self, rules: AlertRules) -> list[AlertState]:
            return [forged]

    loop = AlertLoop(Admin(), AlertRules(), None)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="conveyor.alerts"):
        assert asyncio.run(loop.run_once()) == 1
    assert [r.getMessage() for r in caplog.records] == ["alert firing: queue q\\nFAKE: 1"]
