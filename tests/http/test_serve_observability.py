"""`conveyor serve` as the operators' window: /metrics (every database family), GET /api/workers and
/api/alerts, and its alert loop notifying a real local webhook receiver of a firing and a resolve."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import make_dead_letters
from tests.http.conftest import REPO, Server, make_tokens, serving, start, stop
from tests.observability._receiver import Receiver

from conveyor import App
from conveyor._clock import host_now
from conveyor.backends.base import WorkerInfo, WorkersBeatParams


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def watched(database_url: str, tmp_path: Path, receiver: Receiver) -> Iterator[Server]:
    with serving(database_url, tmp_path, "--webhook", receiver.url, "--alert-interval", "0.2") as running:
        yield running


def _samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_alerts_fire_and_resolve_through_the_webhook_and_the_api(watched: Server, receiver: Receiver) -> None:
    dead = make_dead_letters(watched.db)[0]
    receiver.wait_for(lambda got: any(m["rule"] == "dlq_depth" and m["state"] == "firing" for m in got))
    with watched.client("operator") as ops, watched.client("admin") as root, watched.client("producer") as shop:
        for path in ("/api/alerts", "/v1/alerts"):
            alerts = ops.get(path).json()["alerts"]
            (dlq,) = [a for a in alerts if a["rule"] == "dlq_depth"]
            assert (dlq["queue"], dlq["state"], dlq["value"], dlq["threshold"]) == ("doomed", "firing", 1.0, 0.0)
            assert "DLQ depth is 1" in dlq["message"]
        assert shop.get("/api/alerts").status_code == 403
        assert httpx.get(f"{watched.url}/api/alerts").status_code == 401

        assert root.post("/v1/dead-letters:purge", json={"ids": [dead], "reason": "noise"}).status_code == 200
        receiver.wait_for(lambda got: [m["state"] for m in got if m["rule"] == "dlq_depth"] == ["firing", "resolved"])
        (dlq,) = [a for a in ops.get("/api/alerts").json()["alerts"] if a["rule"] == "dlq_depth"]
        assert dlq["state"] == "resolved"


def test_metrics_and_workers_read_the_database(watched: Server) -> None:
    make_dead_letters(watched.db)
    with App(watched.db) as app:
        app.send("later", {}, queue="mixed", delay=3600)
        held = app.send("now", {}, queue="mixed")
        from conveyor.backends.base import JobsAcquireParams

        app.backend.jobs_acquire(JobsAcquireParams("mixed", 1, 60, "host-b:7", host_now()))
        app.backend.workers_beat(
            WorkersBeatParams(WorkerInfo("host-b:7", "host-b", 7, ("mixed",), 4, host_now(), host_now()), host_now())
        )
    with watched.client("operator") as ops, watched.client("producer") as shop:
        deadline = time.monotonic() + 20
        while not ops.get("/api/alerts").json()["alerts"]:  # the alert loop's first round after the dead letter
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert httpx.get(f"{watched.url}/metrics").status_code == 401
        assert shop.get("/metrics").status_code == 403
        response = ops.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        m = _samples(response.text)
        (workers,) = [w for w in ops.get("/api/workers").json()["workers"] if w["id"] == "host-b:7"]
        assert workers["in_flight"] == [str(held.id)] and workers["alive"] and workers["queues"] == ["mixed"]
        assert ops.get("/v1/workers").json() == ops.get("/api/workers").json()
    assert m["conveyor_database_up"][()] == 1
    assert m["conveyor_queue_depth"][(("queue", "mixed"), ("state", "scheduled"))] == 1
    assert m["conveyor_queue_depth"][(("queue", "mixed"), ("state", "processing"))] == 1
    assert m["conveyor_queue_depth"][(("queue", "mixed"), ("state", "pending"))] == 0
    assert m["conveyor_queue_oldest_pending_age_seconds"][(("queue", "mixed"),)] == 0
    assert m["conveyor_queue_dlq_depth"][(("queue", "doomed"),)] == 1
    assert m["conveyor_queue_jobs_enqueued_total"][(("queue", "mixed"),)] == 2
    assert m["conveyor_queue_jobs_finished_total"][(("outcome", "dead"), ("queue", "doomed"), ("task", "doomed"))] == 1
    assert m["conveyor_queue_workers"][(("queue", "mixed"),)] == 1
    assert m["conveyor_queue_workers"][(("queue", "doomed"),)] == 0
    assert (("queue", "doomed"), ("rule", "dlq_depth")) in m["conveyor_alert_firing"]
    assert m["conveyor_scrape_duration_seconds"][()] > 0
    if watched.db.startswith("postgresql"):
        assert m["conveyor_db_oldest_transaction_age_seconds"][()] >= 0
        assert m["conveyor_db_jobs_dead_tuples"][()] >= 0
    elif watched.db.startswith("mysql"):  # InnoDB counts no dead rows per table: that family is left out
        assert m["conveyor_db_oldest_transaction_age_seconds"][()] >= 0
        assert "conveyor_db_jobs_dead_tuples" not in m
    else:
        # SQLite has neither signal; the families are left out (docs/observability.md).
        assert "conveyor_db_oldest_transaction_age_seconds" not in m and "conveyor_db_jobs_dead_tuples" not in m


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--webhook", "ftp://example.com/hook"], "http(s) URL"),
        (["--webhook", "http://user:secret@example.com/hook"], "must not carry a user or password"),
        (["--alert", "dlq_depth=nan"], "finite number"),
        (["--alert", "oldest_pending_age:q=-5"], "finite number"),
        (["--alert", "made_up=1"], "unknown alert rule"),
        # NaN compares false, so it passed click's range and the alert loop spun without a pause.
        (["--alert-interval", "nan"], "not a finite number"),
        (["--token-cache", "nan"], "not a finite number"),
        # A queue name that no queue can have, and a URL that urllib cannot send, are refused at start.
        (["--alert", "dlq_depth:a\udcffb=1"], "queue"),
        (["--alert", "dlq_depth:" + "q" * 300 + "=1"], "queue"),
        (["--alert", "dlq_depth:=5"], "must not be empty"),  # was accepted: a threshold on no queue
        (["--webhook", "http://example.com/h\u00e9"], "http(s) URL"),
    ],
)
def test_bad_alert_options_are_one_clear_line(sqlite_url: str, args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conveyor", "--db", sqlite_url, "serve", "--port", "1", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr
    assert "secret" not in done.stderr


def test_a_webhook_that_hangs_does_not_wedge_the_service(sqlite_url: str, tmp_path: Path) -> None:
    hanging, failing, good = Receiver("hang"), Receiver("error"), Receiver()
    tokens = make_tokens(sqlite_url)
    hooks = ["--webhook", hanging.url, "--webhook", failing.url, "--webhook", good.url]
    running = start(sqlite_url, tmp_path, *hooks, "--alert-interval", "0.2")
    running.tokens = tokens
    try:
        make_dead_letters(sqlite_url)
        good.wait_for(lambda got: any(m["rule"] == "dlq_depth" for m in got))
        began = time.monotonic()
        with running.client("operator") as ops:
            for _ in range(20):
                assert ops.get("/v1/queues").status_code == 200
        assert time.monotonic() - began < 10
        deadline = time.monotonic() + 20
        while failing.hits < 2:
            assert time.monotonic() < deadline, "the failing webhook was not retried"
            time.sleep(0.05)
    finally:
        stop(running)
        for r in (hanging, failing, good):
            r.close()


def _stalled_request(server: Server) -> socket.socket:
    """A replay request whose body never ends: it is under way until the service cancels it."""
    host, _, port = server.url.removeprefix("http://").partition(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    head = (
        f"POST /v1/dead-letters:replay HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {server.tokens['admin']}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{"
    )
    sock.sendall(head.encode())
    return sock


def _read_all(sock: socket.socket) -> bytes:
    received = b""
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_sigterm_ends_the_service_within_its_30_seconds(sqlite_url: str, tmp_path: Path) -> None:
    # A request still running at SIGTERM (a slow replay) used all of uvicorn's 30 s graceful wait;
    # the service's own shutdown (the alert loop, then the hanging webhook's delivery) came after it,
    # and the process took 35 s. (A replay can no longer be that slow over HTTP: its pacing is at most
    # 20 s. A request whose body never ends still is.)
    hanging = Receiver("hang")
    tokens = make_tokens(sqlite_url)
    running = start(sqlite_url, tmp_path, "--webhook", hanging.url, "--alert-interval", "0.2", "--workers", "2")
    running.tokens = tokens
    try:
        make_dead_letters(sqlite_url)
        make_dead_letters(sqlite_url)
        deadline = time.monotonic() + 20
        while hanging.hits < 1:
            assert time.monotonic() < deadline, "the webhook was never called"
            time.sleep(0.05)
        with running.client("admin") as admin:
            idle = admin.get("/v1/queues")  # a keep-alive connection left open
            assert idle.status_code == 200

            stalled = _stalled_request(running)
            time.sleep(1.0)
            began = time.monotonic()
            running.proc.terminate()
            running.proc.wait(timeout=60)
            took = time.monotonic() - began
            answer = _read_all(stalled)
        assert took < 30, f"SIGTERM took {took:.1f} s"
        # The request cut off at the end of the graceful wait is told so in JSON (it got uvicorn's plain-text 500).
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer
        assert json.loads(body)["error"]["code"] == "stopping", answer
        # Logged once by uvicorn; before, also as "Exception in ASGI application" with a traceback.
        assert "Cancel 1 running task(s)" in running.stderr()
        assert "Traceback" not in running.stderr() and "Exception in ASGI" not in running.stderr(), running.stderr()
    finally:
        stop(running)
        hanging.close()


def test_a_token_limited_to_queues_sees_only_its_queues_of_a_worker(watched: Server) -> None:
    # A worker draining "emails" and "payroll" was shown whole to a token of "emails": the other queue's
    # name and the ids of the payroll jobs it held.
    from conveyor.backends.base import JobsAcquireParams

    with App(watched.db) as app:
        mail = app.send("send", {}, queue="emails")
        pay = app.send("pay", {}, queue="payroll")
        for queue in ("emails", "payroll"):
            app.backend.jobs_acquire(JobsAcquireParams(queue, 1, 60, "host-c:9", host_now()))
        info = WorkerInfo("host-c:9", "host-c", 9, ("emails", "payroll"), 4, host_now(), host_now())
        app.backend.workers_beat(WorkersBeatParams(info, host_now()))
    with watched.client("emails_ops") as scoped, watched.client("operator") as ops:
        (everything,) = [w for w in ops.get("/v1/workers").json()["workers"] if w["id"] == "host-c:9"]
        assert sorted(everything["in_flight"]) == sorted([str(mail.id), str(pay.id)])
        for path in ("/v1/workers", "/api/workers"):
            (seen,) = scoped.get(path).json()["workers"]
            assert (seen["queues"], seen["in_flight"]) == (["emails"], [str(mail.id)])
    with httpx.Client(base_url=watched.url, cookies={"conveyor_session": watched.tokens["emails_ops"]}) as browser:
        panel = browser.get("/panels/workers")
        assert panel.status_code == 200 and "payroll" not in panel.text and str(pay.id) not in panel.text
        assert str(mail.id) in panel.text
        # Its own queues, workers and alerts: the overview showed none of them, and the workers and
        # alerts pages and panels answered 500.
        for path in ("/", "/workers", "/alerts", "/panels/alerts"):
            page = browser.get(path)
            assert page.status_code == 200, path
            assert "payroll" not in page.text, path
        assert "emails" in browser.get("/").text
