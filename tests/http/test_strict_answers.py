"""Small answers a hostile sweep found wrong: every error is JSON (unrouted paths and methods too),
a query integer is ASCII digits only, a purge counts an id named twice once, as a replay does, and a token revoked
through a process is refused by it at once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.conftest import make_dead_letters
from tests.http.conftest import Server, make_tokens, serving, start, stop

from conveyor import App


@pytest.fixture
def served(sqlite_url: str, tmp_path: Path) -> Iterator[Server]:
    with serving(sqlite_url, tmp_path) as running:
        yield running


def test_unrouted_paths_and_methods_answer_json(served: Server) -> None:
    with served.client("admin") as c:
        # Before: Starlette's plain-text "Not Found" and "Method Not Allowed".
        missing = c.get("/v1/nothing")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found", missing.text
        wrong = c.delete("/v1/queues")
        assert wrong.status_code == 405, wrong.text
        assert wrong.json()["error"] == {"status": 405, "code": "method_not_allowed", "message": "Method Not Allowed"}
        assert "GET" in wrong.headers["allow"]


def test_a_query_integer_is_ascii_digits_only(served: Server) -> None:
    with served.client("operator") as c:
        assert c.get("/v1/dead-letters", params={"limit": "5"}).status_code == 200
        # int() read each of these as 5 or 50.
        for text in ("5_0", "+5", " 5", "5 ", "\uff15", "\u0665", "0x5", ""):
            answer = c.get("/v1/dead-letters", params={"limit": text})
            assert answer.status_code == 400 and answer.json()["error"]["field"] == "limit", (text, answer.text)
        assert c.get("/v1/audit?limit=%205").status_code == 400


def test_a_purge_counts_an_id_named_twice_once(served: Server) -> None:
    (dead,) = make_dead_letters(served.db, 1)
    with served.client("admin") as c:
        purged = c.post("/v1/dead-letters:purge", json={"ids": [dead, dead], "reason": "r"})
        assert purged.status_code == 200, purged.text
        assert purged.json() == {"purged": 1, "selected": 1}  # before: selected 2


def test_a_method_a_single_job_send_does_not_take_is_405_with_allow(served: Server) -> None:
    with served.client("producer") as c:
        # Before: 404 not_found, as if no such path existed (the send path is answered before Starlette's routes).
        for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS"):
            wrong = c.request(method, "/v1/queues/emails/jobs")
            assert wrong.status_code == 405, (method, wrong.text)
            assert wrong.json()["error"]["code"] == "method_not_allowed", wrong.text
            assert wrong.headers["allow"] == "POST"
        assert c.head("/v1/queues/emails/jobs").status_code == 405
        assert c.post("/v1/queues/emails/jobs", json={"task": "t"}).status_code == 202


def test_a_token_revoked_through_a_process_is_refused_by_it_at_once(sqlite_url: str, tmp_path: Path) -> None:
    tokens = make_tokens(sqlite_url)
    running = start(sqlite_url, tmp_path, "--token-cache", "60")
    running.tokens = tokens
    try:
        with running.client("producer") as shop, running.client("admin") as root:
            assert shop.post("/v1/queues/emails/jobs", json={"task": "t"}).status_code == 202  # cached now
            assert root.delete("/v1/tokens/shop").status_code == 204
            # Before: 202 for the next 60 s, from the very process that had answered the revoke.
            refused = shop.post("/v1/queues/emails/jobs", json={"task": "t"})
            assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"], refused.text
            assert shop.get(f"/v1/jobs/{uuid.uuid4()}").status_code == 401
    finally:
        stop(running)


def test_a_url_that_is_not_utf8_once_percent_decoded_is_400(served: Server) -> None:
    with served.client("admin") as c:
        # Before: 202 into the queue "caf\ufffd" for both (the server decodes with U+FFFD), one queue for two names.
        for path in ("/v1/queues/caf%E9/jobs", "/v1/queues/caf%EF/jobs", "/v1/queues/caf%E9/jobs:batch"):
            body = {"jobs": [{"task": "t"}]} if path.endswith("batch") else {"task": "t"}
            answer = c.post(path, json=body)
            assert answer.status_code == 400 and "not UTF-8" in answer.json()["error"]["message"], (path, answer.text)
        answer = c.get("/v1/scaling?max=2&queues=caf%E9")
        assert answer.status_code == 400 and "query" in answer.json()["error"]["message"], answer.text
        # UTF-8 percent-encoded is the name, U+FFFD itself included.
        assert c.post("/v1/queues/caf%C3%A9/jobs", json={"task": "t"}).json()["queue"] == "café"
        assert c.post("/v1/queues/%EF%BF%BD/jobs", json={"task": "t"}).json()["queue"] == "\ufffd"
        assert c.get("/v1/dead-letters?queue=caf%C3%A9").status_code == 200
    with App(served.db) as app:
        assert sorted(q.queue for q in app.admin.queues()) == ["café", "\ufffd"]


def test_a_page_of_another_site_cannot_change_anything_without_auth(sqlite_url: str, tmp_path: Path) -> None:
    # A form on any site can make a browser POST text/plain that reads as JSON ({"queue":"doomed","reason":"x=..."}).
    # Before, on --insecure-no-auth: 202 for the send, 200 purged 2, 201 for an admin token.
    make_dead_letters(sqlite_url, 2)
    running = start(sqlite_url, tmp_path, "--insecure-no-auth")
    try:
        with httpx.Client(base_url=running.url, headers={"Content-Type": "text/plain"}) as browser:
            foreign = {"Origin": "https://evil.example"}
            for path, body in [
                ("/v1/queues/x/jobs", b'{"task":"t","payload":{"a":"="}}'),
                ("/v1/dead-letters:purge", b'{"queue":"doomed","reason":"x="}'),
                ("/v1/tokens", b'{"name":"evil","role":"admin"}'),
            ]:
                answer = browser.post(path, content=body, headers=foreign)
                assert answer.status_code == 403 and "another site" in answer.json()["error"]["message"], answer.text
            assert browser.delete("/v1/tokens/nobody", headers={"Origin": "null"}).status_code == 403
            # A page of the service itself, and a client that is not a browser (no Origin), still may.
            own = {"Origin": running.url}
            assert browser.post("/v1/queues/x/jobs", content=b'{"task":"t"}', headers=own).status_code == 202
            assert browser.post("/v1/queues/x/jobs", content=b'{"task":"t"}').status_code == 202
            assert browser.get("/v1/queues", headers=foreign).status_code == 200  # a read changes nothing
    finally:
        stop(running)
    with App(sqlite_url) as app:
        assert len(app.admin.dead_letters(queue="doomed")) == 2
        assert [q.enqueued for q in app.admin.queues() if q.queue == "x"] == [2]
        assert "evil" not in {t.name for t in app.admin.tokens()}
