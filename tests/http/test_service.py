"""`conveyor serve` against a live process, on SQLite and PostgreSQL: every status code, roles and scopes,
audit rows, idempotency, hostile input."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from tests.conftest import make_dead_letters, run_statements
from tests.http.conftest import Server, start, stop

from conveyor import App
from conveyor.backends.base import Subscription, SubscriptionsUpsertParams

JOB = {"task": "emails.send", "payload": {"to": "ada@example.com"}}


def _error(response: httpx.Response, status: int, field: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["status"] == status
    assert error["message"]
    if field is not None:
        assert error.get("field") == field, error
    return str(error["message"])


def test_send_answers_202_with_location_and_the_job_is_stored(server: Server) -> None:
    with server.client("producer") as c:
        sent = c.post("/v1/queues/emails/jobs", json={**JOB, "priority": 5, "delay": 60})
        assert sent.status_code == 202, sent.text
        body = sent.json()
        assert body["queue"] == "emails" and body["duplicate"] is False
        assert sent.headers["location"] == f"/v1/jobs/{body['id']}"
        status = c.get(sent.headers["location"])
        assert status.status_code == 200, status.text
        job = status.json()
        assert job["state"] == "pending" and job["priority"] == 5 and job["payload"] == JOB["payload"]
        assert job["headers"]["sent_by"] == "shop"  # the token that sent it
    with App(server.db) as app:
        assert app.job(body["id"]).task == "emails.send"


def test_401_without_a_valid_token(server: Server) -> None:
    secret = server.tokens["producer"]
    with httpx.Client(base_url=server.url) as c:
        _error(c.post("/v1/queues/emails/jobs", json=JOB), 401)
        bad = c.post("/v1/queues/emails/jobs", json=JOB, headers={"Authorization": "Bearer nope"})
        _error(bad, 401)
        wrong = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
        message = _error(c.post("/v1/queues/emails/jobs", json=JOB, headers={"Authorization": f"Bearer {wrong}"}), 401)
        assert _secret_of(wrong) not in message and _secret_of(secret) not in message
        assert c.get("/v1/queues", headers={"Authorization": "Basic eDp5"}).status_code == 401
        assert c.get("/healthz").status_code == 200  # health needs no token
    assert _secret_of(secret) not in server.stderr()


def _secret_of(bearer: str) -> str:
    """The secret part of ``cvy_<id>_<secret>``. (Not ``rsplit("_", 1)``: a URL-safe secret may hold
    ``_`` itself, and its last few characters then turned up in a JSON listing by chance.)"""
    return bearer.split("_", 2)[2]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "t", "priority": "high"}, "priority"),
        ({"task": "t", "priority": 2**31}, "priority"),
        ({"task": "t", "priority": True}, "priority"),
        ({"task": "t", "max_attempts": 0}, "max_attempts"),
        ({"task": "t", "delay": -1}, "delay"),
        ({"task": "t", "ttl": 0}, "ttl"),
        ({"task": "t", "run_at": "tomorrow"}, "run_at"),
        ({"task": "t", "run_at": "2030-01-01T00:00:00"}, "run_at"),  # naive
        ({"task": "t", "payload": [1, 2]}, "payload"),
        ({"task": "t", "payload": {"s": "a\u0000b"}}, "payload"),
        ({"task": "t", "headers": "x"}, "headers"),
        ({"task": ""}, "task"),
        ({"task": "a\u0000b"}, "task"),
        ({"task": "x" * 201}, "task"),
        ({"task": 7}, "task"),
        ({"payload": {}}, "task"),
        ({"task": "t", "idempotency_key": "k" * 513}, "idempotency_key"),
        ({"task": "t", "ordering_key": ""}, "ordering_key"),
        ({"task": "t", "color": "red"}, "color"),
    ],
)
def test_400_names_the_field(server: Server, body: dict[str, object], field: str) -> None:
    with server.client("admin") as c:
        _error(c.post("/v1/queues/emails/jobs", json=body), 400, field)


NOT_RFC_3339 = [
    "20300101T000000Z",  # these four were read by datetime.fromisoformat
    "2030-W01-1T00:00Z",
    "2030-01-01T00:00:00 Z",
    "2030-01-01T00:00:00+23:59:59.999999",
    "2030-01-01 00:00:00Z",
    "2030-01-01T00:00:00",
    "2030-01-01",
    "\u0662\u0660\u0663\u0660-01-01T00:00:00Z",
    "2030-01-01T00:00:00Z\n",
    "2030-01-01T00:00:00+00:00[Europe/Paris]",
]


def test_times_are_rfc_3339_date_times_and_a_400_shows_the_text_sent(server: Server) -> None:
    form = "YYYY-MM-DDTHH:MM:SS[.fraction] then Z or +HH:MM or -HH:MM, e.g. 2030-01-01T09:30:00Z"
    with server.client("admin") as c:
        for field in ("run_at", "expires_at"):
            for text in NOT_RFC_3339:
                message = _error(c.post("/v1/queues/emails/jobs", json={"task": "t", field: text}), 400, field)
                assert message == f"{field} must be an RFC 3339 time ({form}), got {text!r}"
        batch = {"jobs": [{"task": "t"}, {"task": "t", "run_at": "20300101T000000Z"}]}
        _error(c.post("/v1/queues/emails/jobs:batch", json=batch), 400, "jobs[1].run_at")
        for text, expected in [
            (
                "2030-02-30T00:00:00Z",
                "run_at is not a valid time: '2030-02-30T00:00:00Z' (day is out of range for month)",
            ),
            ("2030-01-01T00:00:00+24:00", "run_at is not a valid time: '2030-01-01T00:00:00+24:00' (the offset"),
            # The message showed datetime.datetime(9999, 12, 31, ..., tzinfo=datetime.timezone(...)).
            (
                "9999-12-31T23:59:59.999999-12:00",
                "run_at is out of range: 9999-12-31T23:59:59.999999-12:00 is not within the years 1 to 9999 in UTC",
            ),
            ("0001-01-01t00:00:00+14:00", "run_at is out of range: 0001-01-01t00:00:00+14:00 is not within"),
        ]:
            assert _error(
                c.post("/v1/queues/emails/jobs", json={"task": "t", "run_at": text}), 400, "run_at"
            ).startswith(expected)
        with App(server.db) as app:
            assert app.admin.queues() == []
        for text, stored in [
            ("2030-01-01T00:00:00Z", "2030-01-01T00:00:00+00:00"),
            ("2030-01-01t09:30:00.1234567z", "2030-01-01T09:30:00.123456+00:00"),
            ("2030-01-01T00:00:00+14:00", "2029-12-31T10:00:00+00:00"),
            ("2030-01-01T00:00:00-00:30", "2030-01-01T00:30:00+00:00"),
        ]:
            sent = c.post("/v1/queues/emails/jobs", json={"task": "t", "run_at": text})
            assert sent.status_code == 202, sent.text
            assert c.get(sent.headers["location"]).json()["run_at"] == stored


@pytest.mark.parametrize(
    ("jobs", "bad"), [([{"task": []}], 0), ([{"task": "t"}, {"task": {"a": 1}}], 1), ([{"task": 7}, {"task": 7}], 0)]
)
def test_a_batch_whose_task_is_not_a_string_gets_400(server: Server, jobs: list[dict[str, object]], bad: int) -> None:
    # The batch's trace span is named after its task before each job is checked (hashing a list was a 500).
    with server.client("admin") as c:
        _error(c.post("/v1/queues/emails/jobs:batch", json={"jobs": jobs}), 400, f"jobs[{bad}].task")
    with App(server.db) as app:
        assert app.admin.queues() == []


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"   ",
        b"{",
        b"[1, 2]",
        b'"a string"',
        b"null",
        b'{"task": "t", "delay": NaN}',
        b'{"task": "t", "delay": Infinity}',
        b'{"task": "t", "delay": 1e999}',
        b'{"task": "t", "priority": ' + b"9" * 5000 + b"}",
        b"\xff\xfe\x00{",
        b'{"task": "\xc3\x28"}',
        b'{"task": "t", "payload": ' + b'{"a":' * 150 + b"1" + b"}" * 150 + b"}",
        b'{"task": "t", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"task": "t", "payload": {"s": "\\ud800"}}',
        b'{"task": []}',
    ],
)
def test_hostile_bodies_get_400_never_500(server: Server, raw: bytes) -> None:
    with server.client("admin") as c:
        response = c.post("/v1/queues/emails/jobs", content=raw, headers={"Content-Type": "application/json"})
        _error(response, 400)
        batch = c.post("/v1/queues/emails/jobs:batch", content=raw)
        _error(batch, 400)
    with App(server.db) as app:
        assert app.admin.queues() == []  # nothing was written


@pytest.mark.parametrize(
    "raw",
    [
        b'{"task": "t", "payload": {"amount": 1, "amount": 1000}}',
        b'{"task": "t", "task": "u"}',
        b'{"task": "t", "headers": {"h": {"x": 1, "x": 2}}}',
    ],
)
def test_a_body_naming_a_member_twice_gets_400_and_writes_nothing(server: Server, raw: bytes) -> None:
    # Before: 202, the last value kept and the other dropped silently ({"amount": 1000}); RFC 8259 leaves which
    # one counts undefined, so another reader of the same bytes may take the first.
    with server.client("admin") as c:
        message = _error(c.post("/v1/queues/emails/jobs", content=raw), 400)
        assert "twice" in message, message
        _error(c.post("/v1/queues/emails/jobs:batch", content=b'{"jobs": [' + raw + b"]}"), 400)
        _error(c.post("/v1/topics/news/messages", content=b'{"payload": {"a": 1, "a": 2}}'), 400)
        token = c.post("/v1/tokens", content=b'{"name": "n", "role": "producer", "role": "admin"}')
        _error(token, 400)
    with App(server.db) as app:
        assert app.admin.queues() == []
        assert [t.name for t in app.admin.tokens() if t.name == "n"] == []


def test_an_idempotency_key_header_is_read_as_utf8_like_the_body(server: Server) -> None:
    # Before: the header was read as Latin-1, so the UTF-8 bytes of "clé-7" were the key "clÃ©-7": the same key in
    # the header and the body "differ" (400), and a retry through the header did not find the job the body made.
    utf8 = {"Idempotency-Key": "clé-7".encode()}
    with server.client("producer") as c:
        first = c.post("/v1/queues/emails/jobs", json={**JOB, "idempotency_key": "clé-7"}, headers=utf8)
        assert first.status_code == 202, first.text
        again = c.post("/v1/queues/emails/jobs", json=JOB, headers=utf8)
        assert again.status_code == 202 and again.json() == {**first.json(), "duplicate": True}, again.text
        published = c.post("/v1/topics/news/messages", json={"idempotency_key": "clé-7"}, headers=utf8)
        assert published.status_code == 202, published.text
        latin1 = {"Idempotency-Key": "clé-7".encode("latin-1")}
        _error(c.post("/v1/queues/emails/jobs", json=JOB, headers=latin1), 400, "idempotency_key")
        _error(c.post("/v1/topics/news/messages", json={}, headers=latin1), 400, "idempotency_key")
    with App(server.db) as app:
        assert app.job(first.json()["id"]).idempotency_key == "clé-7"
        assert [q.enqueued for q in app.admin.queues()] == [1]


def test_a_batch_with_an_idempotency_key_header_is_400_not_sent_twice(server: Server) -> None:
    # Before: the header was ignored, so each retry of the batch (the header's promise) enqueued both jobs again.
    batch = {"jobs": [{"task": "t", "payload": {"n": 1}}, {"task": "t", "payload": {"n": 2}}]}
    with server.client("producer") as c:
        for _ in range(2):
            refused = c.post("/v1/queues/emails/jobs:batch", json=batch, headers={"Idempotency-Key": "order-9"})
            assert "its own idempotency_key" in _error(refused, 400, "Idempotency-Key")
        keyed = {"jobs": [{**job, "idempotency_key": f"order-9/{i}"} for i, job in enumerate(batch["jobs"])]}
        for _ in range(2):
            assert c.post("/v1/queues/emails/jobs:batch", json=keyed).status_code == 202
    with App(server.db) as app:
        assert [q.enqueued for q in app.admin.queues()] == [2]


def test_413_for_a_payload_or_a_body_over_the_limit(server: Server) -> None:
    with server.client("admin") as c:
        big = {"task": "t", "payload": {"blob": "x" * 300_000}}
        message = _error(c.post("/v1/queues/emails/jobs", json=big), 413, "payload")
        assert "reference" in message
        _error(c.post("/v1/queues/emails/jobs", json={"task": "t", "headers": {"h": "x" * 300_000}}), 413, "headers")
        huge = b'{"task": "t", "payload": {"blob": "' + b"x" * (2 * 1024 * 1024) + b'"}}'
        _error(c.post("/v1/queues/emails/jobs", content=huge), 413)


def test_idempotency_key_returns_the_same_job_and_409_for_another_payload(server: Server) -> None:
    with server.client("producer") as c:
        first = c.post("/v1/queues/emails/jobs", json=JOB, headers={"Idempotency-Key": "order-7"})
        assert first.status_code == 202
        again = c.post("/v1/queues/emails/jobs", json={**JOB, "idempotency_key": "order-7"})
        assert again.status_code == 202 and again.json() == {**first.json(), "duplicate": True}
        key = {"Idempotency-Key": "order-7"}
        _error(c.post("/v1/queues/emails/jobs", json={**JOB, "payload": {"to": "bob"}}, headers=key), 409)
        _error(c.post("/v1/queues/emails/jobs", json={**JOB, "task": "other"}, headers=key), 409)
        # true is not 1: a different payload
        c.post("/v1/queues/emails/jobs", json={"task": "t", "payload": {"a": 1}, "idempotency_key": "k2"})
        again_k2 = c.post("/v1/queues/emails/jobs", json={"task": "t", "payload": {"a": True}, "idempotency_key": "k2"})
        _error(again_k2, 409)
        mismatch = c.post(
            "/v1/queues/emails/jobs", json={**JOB, "idempotency_key": "a"}, headers={"Idempotency-Key": "b"}
        )
        _error(mismatch, 400, "idempotency_key")
    with App(server.db) as app:
        assert [q.pending for q in app.admin.queues()] == [2]


def test_404_for_unknown_jobs_and_400_for_a_malformed_id(server: Server) -> None:
    with server.client("admin") as c:
        _error(c.get(f"/v1/jobs/{uuid.uuid4()}"), 404)
        _error(c.get("/v1/jobs/not-a-uuid"), 400, "id")
        _error(c.get(f"/v1/dead-letters/{uuid.uuid4()}"), 404)
        _error(c.post("/v1/schedules/nope:pause"), 404)
        _error(c.delete("/v1/tokens/nope"), 404)
        assert c.get("/v1/nothing").status_code == 404


def test_roles_and_queue_scopes(server: Server) -> None:
    with server.client("producer") as shop, server.client("producer2") as billing:
        mine = shop.post("/v1/queues/emails/jobs", json=JOB).json()["id"]
        assert shop.get(f"/v1/jobs/{mine}").status_code == 200
        # Another producer cannot read it, nor learn that it exists.
        _error(billing.get(f"/v1/jobs/{mine}"), 404)
        # Claiming another token's name in the headers does not help: the service stamps the sender.
        forged = billing.post("/v1/queues/emails/jobs", json={**JOB, "headers": {"sent_by": "shop"}}).json()["id"]
        _error(shop.get(f"/v1/jobs/{forged}"), 404)
        for path in ("/v1/queues", "/v1/dead-letters", "/v1/audit", "/v1/schedules", "/v1/tokens"):
            _error(shop.get(path), 403)
        _error(shop.post("/v1/dead-letters:replay", json={"queue": "emails", "reason": "x"}), 403)
    with server.client("emails") as mailer:
        assert mailer.post("/v1/queues/emails/jobs", json=JOB).status_code == 202
        _error(mailer.post("/v1/queues/billing/jobs", json=JOB), 403)
        _error(mailer.post("/v1/queues/billing/jobs:batch", json={"jobs": [JOB]}), 403)
        _error(mailer.post("/v1/topics/orders/messages", json={}), 403)  # topics span queues
    with server.client("operator") as ops:
        assert ops.get(f"/v1/jobs/{mine}").status_code == 200  # operators read every job
        assert {q["queue"] for q in ops.get("/v1/queues").json()["queues"]} == {"emails"}
        _error(ops.post("/v1/dead-letters:purge", json={"queue": "emails", "reason": "x"}), 403)
        _error(ops.get("/v1/tokens"), 403)
        _error(ops.post("/v1/tokens", json={"name": "x", "role": "admin"}), 403)
    with server.client("emails_ops") as mail_ops:
        assert mail_ops.get("/v1/dead-letters", params={"queue": "emails"}).status_code == 200
        _error(mail_ops.get("/v1/dead-letters"), 403)  # every queue
        _error(mail_ops.get("/v1/dead-letters", params={"queue": "billing"}), 403)
        _error(mail_ops.get("/v1/audit"), 403)


def test_dead_letters_page_replay_and_purge_are_audited_with_the_token_name(server: Server) -> None:
    dead = make_dead_letters(server.db, 5)
    with server.client("operator") as ops, server.client("admin") as root:
        first = ops.get("/v1/dead-letters", params={"queue": "doomed", "limit": 2}).json()
        assert len(first["dead_letters"]) == 2 and first["next_before"]
        page = {"queue": "doomed", "limit": 2}
        second = ops.get("/v1/dead-letters", params={**page, "before": first["next_before"]})
        third = ops.get("/v1/dead-letters", params={**page, "before": second.json()["next_before"]})
        seen = [d["id"] for page in (first, second.json(), third.json()) for d in page["dead_letters"]]
        assert sorted(seen) == sorted(dead) and third.json()["next_before"] is None
        _error(ops.get("/v1/dead-letters", params={"before": "garbage!"}), 400, "before")
        _error(ops.get("/v1/dead-letters", params={"limit": "ten"}), 400, "limit")
        _error(ops.get("/v1/dead-letters", params={"limit": "0"}), 400, "limit")
        shown = ops.get(f"/v1/dead-letters/{dead[0]}").json()
        assert shown["state"] == "dead" and shown["error"]["type"] == "Reject"

        _error(ops.post("/v1/dead-letters:replay", json={"ids": dead[:2]}), 400, "reason")
        _error(ops.post("/v1/dead-letters:replay", json={"ids": ["nope"], "reason": "x"}), 400, "ids[0]")
        _error(ops.post("/v1/dead-letters:replay", json={"ids": dead[:1], "queue": "doomed", "reason": "x"}), 400)
        replayed = ops.post("/v1/dead-letters:replay", json={"ids": dead[:2], "reason": "fixed the bug"})
        assert replayed.status_code == 200, replayed.text
        pairs = replayed.json()["replayed"]
        assert [p["dead_id"] for p in pairs] == dead[:2]
        assert ops.get(f"/v1/jobs/{pairs[0]['new_id']}").json()["replay_of"] == dead[0]

        purged = root.post("/v1/dead-letters:purge", json={"queue": "doomed", "reason": "noise"})
        assert purged.json() == {"purged": 3, "selected": 3}
        audit = root.get("/v1/audit", params={"limit": 10}).json()["audit"]
        by_action = {e["action"]: e for e in audit}
        assert by_action["replay"]["actor"] == "ops" and by_action["replay"]["reason"] == "fixed the bug"
        assert sorted(by_action["replay"]["job_ids"]) == sorted(dead[:2])
        assert by_action["purge"]["actor"] == "root" and len(by_action["purge"]["job_ids"]) == 3
        # One job's actions: a replayed dead letter's replay (the purge took the others), a purged one's purge.
        assert [e["action"] for e in root.get("/v1/audit", params={"job": dead[0]}).json()["audit"]] == ["replay"]
        assert [e["action"] for e in root.get("/v1/audit", params={"job": dead[2]}).json()["audit"]] == ["purge"]
        _error(root.get("/v1/audit", params={"job": "not-an-id"}), 400, "job")


def test_schedules_pause_and_resume_audited(server: Server) -> None:
    with App(server.db) as app:
        app.admin.add_schedule("nightly", "0 3 * * *", "reports.nightly", queue="reports", actor="test")
    with server.client("operator") as ops:
        listed = ops.get("/v1/schedules").json()["schedules"]
        assert [s["name"] for s in listed] == ["nightly"] and listed[0]["paused"] is False
        assert ops.post("/v1/schedules/nightly:pause").json()["paused"] is True
        assert ops.post("/v1/schedules/nightly:resume").json()["paused"] is False
        actions = [(e["actor"], e["action"]) for e in ops.get("/v1/audit").json()["audit"]]
        assert ("ops", "schedule.pause") in actions and ("ops", "schedule.resume") in actions
    with server.client("emails_ops") as mail_ops:
        assert mail_ops.get("/v1/schedules").json()["schedules"] == []  # not its queue
        _error(mail_ops.post("/v1/schedules/nightly:pause"), 404)


def test_tokens_over_http_revoke_and_expiry(server: Server) -> None:
    with server.client("admin") as root:
        made = root.post("/v1/tokens", json={"name": "ci", "role": "producer", "queues": ["emails"]})
        assert made.status_code == 201, made.text
        bearer = made.json()["token"]
        _error(root.post("/v1/tokens", json={"name": "ci", "role": "producer"}), 400)  # names stay taken
        _error(root.post("/v1/tokens", json={"name": "x", "role": "king"}), 400)
        _error(root.post("/v1/tokens", json={"name": "x", "role": "admin", "expires_in": -1}), 400, "expires_in")
        listed = root.get("/v1/tokens").json()["tokens"]
        assert "ci" in {t["name"] for t in listed}
        assert all("secret" not in json.dumps(t) and _secret_of(bearer) not in json.dumps(t) for t in listed)
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {bearer}"}) as ci:
            assert ci.post("/v1/queues/emails/jobs", json=JOB).status_code == 202
            assert root.delete("/v1/tokens/ci").status_code == 204
            _error(ci.post("/v1/queues/emails/jobs", json=JOB), 401)  # --token-cache 0: at once
        short = root.post("/v1/tokens", json={"name": "brief", "role": "producer", "expires_in": 1}).json()["token"]
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {short}"}) as brief:
            assert brief.post("/v1/queues/emails/jobs", json=JOB).status_code == 202
            time.sleep(1.2)
            assert "expired" in _error(brief.post("/v1/queues/emails/jobs", json=JOB), 401)
        actions = [(e["actor"], e["action"]) for e in root.get("/v1/audit").json()["audit"]]
        assert ("root", "token.create") in actions and ("root", "token.revoke") in actions


def test_429_with_retry_after_from_backpressure(server: Server) -> None:
    with server.client("producer") as c:
        key = {"Idempotency-Key": "tight-1"}
        first = c.post("/v1/queues/tight/jobs", json=JOB, headers=key)
        assert [first.status_code, c.post("/v1/queues/tight/jobs", json=JOB).status_code] == [202, 202]
        full = c.post("/v1/queues/tight/jobs", json=JOB)
        _error(full, 429)
        assert int(full.headers["retry-after"]) >= 1
        # A resend under the held key adds no job: answered with the job, not refused; another
        # payload under it is a conflict, not a full queue.
        again = c.post("/v1/queues/tight/jobs", json=JOB, headers=key)
        assert again.status_code == 202 and again.json() == {**first.json(), "duplicate": True}
        _error(c.post("/v1/queues/tight/jobs", json={**JOB, "payload": {"to": "bob"}}, headers=key), 409)
        # A high-priority send is refused only at 100 % of max_depth.
        assert c.post("/v1/queues/tight/jobs", json={**JOB, "priority": 1}).status_code == 202
        _error(c.post("/v1/queues/tight/jobs:batch", json={"jobs": [JOB]}), 429)
    with App(server.db) as app:
        assert [(q.queue, q.pending) for q in app.admin.queues()] == [("tight", 3)]


def test_batch_is_all_or_nothing_and_names_the_item(server: Server) -> None:
    with server.client("producer") as c:
        bad = c.post("/v1/queues/emails/jobs:batch", json={"jobs": [JOB, {**JOB, "max_attempts": "x"}]})
        _error(bad, 400, "jobs[1].max_attempts")
        _error(c.post("/v1/queues/emails/jobs:batch", json={"jobs": []}), 400, "jobs")
        _error(c.post("/v1/queues/emails/jobs:batch", json={"jobs": [JOB] * 1001}), 400, "jobs")
        _error(c.post("/v1/queues/emails/jobs:batch", json={"jobs": [JOB], "x": 1}), 400, "x")
        ok = c.post("/v1/queues/emails/jobs:batch", json={"jobs": [JOB, {**JOB, "idempotency_key": "b1"}]})
        assert ok.status_code == 202 and len(ok.json()["jobs"]) == 2
    with App(server.db) as app:
        assert [q.pending for q in app.admin.queues()] == [2]


def test_publish_copies_to_matching_subscriptions(server: Server) -> None:
    with App(server.db) as app:
        app.subscribe("orders", "billing", "billing.charge")
        app.subscribe("orders", "eu", "ship.eu", filter={"region": "eu"})
    with server.client("producer") as c:
        eu = c.post("/v1/topics/orders/messages", json={"payload": {"order": 1}, "headers": {"region": "eu"}})
        assert eu.status_code == 202 and len(eu.json()["jobs"]) == 2
        us = c.post("/v1/topics/orders/messages", json={"payload": {"order": 2}, "headers": {"region": "us"}})
        assert len(us.json()["jobs"]) == 1
        _error(c.post("/v1/topics/orders/messages", json={"task": "x"}), 400, "task")
        assert c.get(f"/v1/jobs/{us.json()['jobs'][0]}").json()["headers"]["sent_by"] == "shop"
        # A topic header naming another topic is the caller's mistake: a 400 naming the header (before: overwritten).
        other = c.post("/v1/topics/orders/messages", json={"headers": {"topic": "sports"}})
        assert "headers' topic is the name of the topic published to" in _error(other, 400)


def test_a_topic_whose_name_holds_a_slash_is_published_to(server: Server) -> None:
    # Hierarchical names ("orders/eu", as MQTT's) are valid topics for App.publish and the CLI. Before, the
    # route's {topic} stopped at the first '/', encoded (%2F) or not, and the publish answered 404 "Not Found".
    with App(server.db) as app:
        app.subscribe("orders/eu", "billing", "billing.charge")
    with server.client("producer") as c:
        for path in ("/v1/topics/orders%2Feu/messages", "/v1/topics/orders/eu/messages"):
            published = c.post(path, json={"payload": {"order": 1}})
            assert published.status_code == 202, (path, published.text)
            assert c.get(f"/v1/jobs/{published.json()['jobs'][0]}").json()["headers"]["topic"] == "orders/eu"
        assert "topic must not be empty" in _error(c.post("/v1/topics//messages", json={}), 400)


def test_a_queue_whose_name_holds_a_slash_takes_sends_and_batches(server: Server) -> None:
    # App.send and the CLI take "eu/orders" as a queue. Before, POST /v1/queues/eu%2Forders/jobs answered 404
    # "Not Found": uvicorn decodes %2F before routing, the single-send fast path took only four '/', and the
    # routes' {queue} stopped at a '/'. The batch route had the same 404.
    with server.client("producer") as c:
        for path in ("/v1/queues/eu%2Forders/jobs", "/v1/queues/eu/orders/jobs", "/v1/queues/a%2F%2Fb%2F/jobs"):
            sent = c.post(path, json={"task": "t", "payload": {"n": 1}})
            assert sent.status_code == 202, (path, sent.text)
            job = c.get(sent.headers["location"]).json()
            assert sent.json()["queue"] == job["queue"] == ("a//b/" if "a%2F" in path else "eu/orders"), path
        for path in ("/v1/queues/eu%2Forders/jobs:batch", "/v1/queues/eu/orders/jobs:batch"):
            batch = c.post(path, json={"jobs": [{"task": "t"}, {"task": "t"}]})
            assert batch.status_code == 202, (path, batch.text)
            assert {c.get(f"/v1/jobs/{i}").json()["queue"] for i in _ids(batch)} == {"eu/orders"}
        # A name that ends in the routes' own words is still read from the right: the last /jobs is the route's.
        tricky = c.post("/v1/queues/x%2Fjobs:batch/jobs", json={"task": "t"})
        assert tricky.status_code == 202 and tricky.json()["queue"] == "x/jobs:batch", tricky.text
        tricky = c.post("/v1/queues/x%2Fjobs/jobs:batch", json={"jobs": [{"task": "t"}]})
        assert tricky.status_code == 202, tricky.text
        assert c.get(f"/v1/jobs/{_ids(tricky)[0]}").json()["queue"] == "x/jobs"
        # Other names percent-encoded are read as before: '%', '?', '#', a space, non-ASCII.
        for name in ("50%", "why?", "#1", "a b", "caf\u00e9/\u65e5\u672c"):
            sent = c.post(f"/v1/queues/{quote(name, safe='')}/jobs", json={"task": "t"})
            assert sent.status_code == 202 and sent.json()["queue"] == name, (name, sent.text)
        assert "queue must not be empty" in _error(c.post("/v1/queues//jobs", json={"task": "t"}), 400)
        assert "queue must not be empty" in _error(c.post("/v1/queues//jobs:batch", json={"jobs": [{}]}), 400)
        wrong = c.get("/v1/queues/eu%2Forders/jobs")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST", wrong.text
    with App(server.db) as app:
        assert {q.queue: q.pending for q in app.admin.queues()}["eu/orders"] == 6
    # A token limited to the queue "emails" may not send to "emails/x", however it is spelled.
    with server.client("emails") as c:
        for path in ("/v1/queues/emails%2Fx/jobs", "/v1/queues/emails/x/jobs"):
            assert c.post(path, json={"task": "t"}).status_code == 403, path


def _ids(batch: httpx.Response) -> list[str]:
    return [job["id"] for job in batch.json()["jobs"]]


def test_a_schedule_whose_name_holds_a_slash_is_paused_and_resumed(server: Server) -> None:
    # Before: POST /v1/schedules/reports%2Fnightly:pause answered 404 "Not Found" ({name} stopped at the '/').
    with App(server.db) as app:
        app.admin.add_schedule("reports/nightly", "0 3 * * *", "reports.nightly", queue="reports", actor="test")
        app.admin.add_schedule("a:pause", "0 3 * * *", "reports.nightly", queue="reports", actor="test")
    with server.client("operator") as ops:
        for spelled in ("reports%2Fnightly", "reports/nightly"):
            paused = ops.post(f"/v1/schedules/{spelled}:pause")
            assert paused.status_code == 200 and paused.json()["paused"] is True, (spelled, paused.text)
            resumed = ops.post(f"/v1/schedules/{spelled}:resume")
            assert resumed.status_code == 200 and resumed.json()["paused"] is False, (spelled, resumed.text)
        assert ops.post("/v1/schedules/a%3Apause:pause").json()["paused"] is True
        _error(ops.post("/v1/schedules/reports/other:pause"), 404)
        assert "must not be empty" in _error(ops.post("/v1/schedules/:pause"), 400)


def test_a_token_whose_name_holds_a_slash_is_revoked(server: Server) -> None:
    # POST /v1/tokens takes "ci/deploy" as a name; before, DELETE /v1/tokens/ci%2Fdeploy answered 404 "Not Found".
    with server.client("admin") as root:
        for name, spelled in (("ci/deploy", "ci%2Fdeploy"), ("ci/release", "ci/release")):
            assert root.post("/v1/tokens", json={"name": name, "role": "producer"}).status_code == 201
            revoked = root.delete(f"/v1/tokens/{spelled}")
            assert revoked.status_code == 204, (spelled, revoked.text)
        assert {t["name"]: t["revoked_at"] is not None for t in root.get("/v1/tokens").json()["tokens"]}["ci/deploy"]
        _error(root.delete("/v1/tokens/ci/nope"), 404)


def test_a_publish_to_many_subscriptions_does_not_hold_up_other_requests(server: Server) -> None:
    # A publish encodes its payload once per subscription: 1,000 subscriptions of a 200 KB payload are 200 MB,
    # from a body within the size limit. Before, the copies were prepared on the event loop, and /healthz waited
    # 0.7 s behind them (every other request too).
    with App(server.db) as app:
        subscriptions = [Subscription("wide", f"q{i}", "t", "{}") for i in range(1000)]
        app.backend.subscriptions_upsert(SubscriptionsUpsertParams(subscriptions))
    publishing = threading.Event()
    waits: list[float] = []

    def ping() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while publishing.is_set():
                started = time.monotonic()
                assert c.get("/healthz").status_code == 200
                waits.append(time.monotonic() - started)

    publishing.set()
    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        with server.client("producer") as c:
            published = c.post("/v1/topics/wide/messages", json={"payload": {"blob": "x" * 200_000}})
    finally:
        publishing.clear()
        pinger.join()
    assert published.status_code == 202 and len(published.json()["jobs"]) == 1000
    assert len(waits) >= 5 and max(waits) < 0.3, max(waits)


TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_jobs_sent_over_http_continue_the_callers_trace(server: Server) -> None:
    # A W3C traceparent on the request becomes the job's (the handler's span is then a child of the
    # caller's); the job's own headers win; an invalid one is ignored, never a 400.
    with App(server.db) as app:
        app.subscribe("orders", "billing", "billing.charge")
    with server.client("producer") as c:

        def traceparents(response: httpx.Response) -> list[str]:
            assert response.status_code == 202, response.text
            body = response.json()
            ids = [j["id"] for j in body["jobs"]] if "jobs" in body and isinstance(body["jobs"][0], dict) else None
            ids = ids or body.get("jobs") or [body["id"]]
            return [c.get(f"/v1/jobs/{i}").json()["headers"]["traceparent"] for i in ids]

        given = {"traceparent": TRACE}
        assert traceparents(c.post("/v1/queues/emails/jobs", json=JOB, headers=given)) == [TRACE]
        batch = c.post("/v1/queues/emails/jobs:batch", json={"jobs": [JOB, JOB]}, headers=given)
        assert traceparents(batch) == [TRACE, TRACE]
        # Without one, a request is still one trace: the jobs of a batch share a fresh context.
        alone = traceparents(c.post("/v1/queues/emails/jobs:batch", json={"jobs": [JOB, JOB, JOB]}))
        again = traceparents(c.post("/v1/queues/emails/jobs:batch", json={"jobs": [JOB, JOB]}))
        assert len(set(alone)) == len(set(again)) == 1 and set(alone) != set(again) and TRACE not in alone
        assert traceparents(c.post("/v1/topics/orders/messages", json={"payload": {}}, headers=given)) == [TRACE]
        own = "00-11111111111111111111111111111111-2222222222222222-01"
        mine = c.post("/v1/queues/emails/jobs", json={**JOB, "headers": {"traceparent": own}}, headers=given)
        assert traceparents(mine) == [own]
        hostile: list[str | bytes] = [
            TRACE.upper(), "ff" + TRACE[2:], "00-" + "0" * 32 + TRACE[35:], TRACE + "-x", "nonsense", "",
            TRACE[:-1].encode() + "\u00e9".encode(), b"00-\xff\xfe" + TRACE[5:].encode(), "x" * 8000,
        ]  # fmt: skip
        for bad in hostile:
            (fresh,) = traceparents(c.post("/v1/queues/emails/jobs", json=JOB, headers={"traceparent": bad}))
            assert fresh != bad and fresh.split("-")[1] != TRACE.split("-")[1], bad
        # Two traceparent headers (one of them is taken, as for any repeated header): the job goes in.
        twice = c.post("/v1/queues/emails/jobs", json=JOB, headers=[("traceparent", TRACE), ("traceparent", own)])
        assert twice.status_code == 202, twice.text


def test_publish_filters_see_the_requests_traceparent_as_app_publish_sees_a_header(server: Server) -> None:
    # The request's traceparent is one of the published message's headers, as App.publish(headers=...)
    # gives it (the body's own win): a filter on it routed the message over Python but not over HTTP.
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    with App(server.db) as app:
        app.subscribe("orders", "billing", "billing.charge")
        app.subscribe("orders", "traced", "trace.follow", filter={"traceparent": TRACE})
        assert [j.status().queue for j in app.publish("orders", {}, headers={"traceparent": TRACE})] == [
            "billing",
            "traced",
        ]
    with server.client("producer") as c:

        def queues(response: httpx.Response) -> list[str]:
            assert response.status_code == 202, response.text
            return [c.get(f"/v1/jobs/{i}").json()["queue"] for i in response.json()["jobs"]]

        given = {"traceparent": TRACE}
        traced = c.post("/v1/topics/orders/messages", json={"payload": {}}, headers=given)
        assert queues(traced) == ["billing", "traced"]
        mine = c.post("/v1/topics/orders/messages", json={"headers": {"traceparent": own}}, headers=given)
        assert queues(mine) == ["billing"]
        assert queues(c.post("/v1/topics/orders/messages", json={"payload": {}})) == ["billing"]


def test_openapi_and_health(server: Server) -> None:
    with httpx.Client(base_url=server.url) as c:
        doc = c.get("/openapi.json").json()
        assert doc["openapi"].startswith("3.")
        assert "/v1/queues/{queue}/jobs" in doc["paths"] and "/v1/dead-letters:replay" in doc["paths"]
        # A replay takes a rate, a purge does not: each body names what the service accepts.
        schemas = doc["components"]["schemas"]
        replay = doc["paths"]["/v1/dead-letters:replay"]["post"]["requestBody"]["content"]["application/json"]
        purge = doc["paths"]["/v1/dead-letters:purge"]["post"]["requestBody"]["content"]["application/json"]
        assert schemas[replay["schema"]["$ref"].rsplit("/", 1)[1]]["properties"]["rate"]["maximum"] == 1_000_000
        assert "rate" not in schemas[purge["schema"]["$ref"].rsplit("/", 1)[1]]["properties"]
        assert c.get("/readyz").json() == {"status": "ready"}


def test_503_with_retry_after_when_the_database_is_unreachable(tmp_path: Path) -> None:
    unreachable = f"postgresql://postgres@127.0.0.1:{_closed_port()}/nowhere?connect_timeout=2"
    server = start(unreachable, tmp_path, "--insecure-no-auth", app_path=None, wait_ready=False)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert c.get("/healthz").status_code == 200
            ready = c.get("/readyz")
            _error(ready, 503)
            assert int(ready.headers["retry-after"]) >= 1
            sent = c.post("/v1/queues/emails/jobs", json=JOB)
            _error(sent, 503)
            assert int(sent.headers["retry-after"]) >= 1
            _error(c.get("/v1/queues"), 503)
        assert "WITHOUT AUTHENTICATION" in server.stderr()
    finally:
        stop(server)


def _closed_port() -> int:
    from tests.http.conftest import free_port

    return free_port()


def test_insecure_no_auth_says_so_on_every_start(sqlite_url: str, tmp_path: Path) -> None:
    server = start(sqlite_url, tmp_path, "--insecure-no-auth", "--workers", "2", app_path=None)
    try:
        with httpx.Client(base_url=server.url) as c:
            assert c.post("/v1/queues/emails/jobs", json=JOB).status_code == 202
            assert c.post("/v1/tokens", json={"name": "ci", "role": "producer"}).status_code == 201
        deadline = time.monotonic() + 10
        while server.stderr().count("WITHOUT AUTHENTICATION") < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        # Once from the command, once from each of the two server processes.
        assert server.stderr().count("WITHOUT AUTHENTICATION") == 3, server.stderr()
    finally:
        stop(server)
    with App(sqlite_url) as app:
        assert app.admin.audit(1)[0].actor == "insecure-no-auth"


def test_a_damaged_database_is_a_500_without_retry_after_and_the_service_stays_up(tmp_path: Path) -> None:
    # Before: 503 + Retry-After, which a client retries for ever: no retry repairs a damaged file.
    from tests.e2e.test_damaged_database import damage
    from tests.http.conftest import make_tokens

    db = f"sqlite:///{tmp_path}/damaged.db"
    tokens = make_tokens(db)
    damage(tmp_path / "damaged.db", "jobs_ready")  # every insert writes it; the tokens stay readable
    server = start(db, tmp_path, wait_ready=False)
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {tokens['producer']}"}) as c:
            for _ in range(2):
                sent = c.post("/v1/queues/emails/jobs", json=JOB)
                assert sent.status_code == 500, sent.text
                assert sent.json()["error"]["code"] == "database_damaged"
                assert "is damaged: database disk image is malformed" in _error(sent, 500)
                assert "retry-after" not in sent.headers
            assert c.get("/healthz").status_code == 200
        assert server.proc.poll() is None
        assert "Traceback" not in server.stderr()
    finally:
        stop(server)


def test_a_stored_result_python_cannot_read_is_null_and_said_so_not_a_result(server: Server) -> None:
    # Before: the API answered the note {"unreadable": "..."} as the job's result, which a handler can return too.
    from conveyor.testing import drain

    with App(server.db) as app:

        @app.task(name="work", queue="results")
        def work(n: int) -> dict[str, object]:
            return {"unreadable": "the handler's own word"} if n == 0 else {"n": n}

        real, bad = (str(app.send("work", {"n": n}).id) for n in range(2))
        assert drain(app, ["results"]).completed == 2
    if server.db.startswith("postgresql"):
        not_json = """('{"n": ' || repeat('9', 5000) || '}')::jsonb"""  # past Python's 4,300 digits
    else:
        not_json = "'{\"n\": 1'"
    run_statements(server.db, f"UPDATE archive SET result = {not_json} WHERE id = '{bad}'")
    with server.client("operator") as ops:
        job = ops.get(f"/v1/jobs/{real}").json()
        assert (job["result"], job["unreadable"]) == ({"unreadable": "the handler's own word"}, {})
        job = ops.get(f"/v1/jobs/{bad}").json()
        assert job["state"] == "completed" and job["result"] is None
        assert list(job["unreadable"]) == ["result"]
        assert job["unreadable"]["result"].startswith("the stored result is not JSON Python can read (")
    with httpx.Client(base_url=server.url, timeout=30.0) as page:
        assert page.post("/login", data={"token": server.tokens["operator"], "next": "/"}).status_code == 303
        shown = page.get(f"/jobs/{bad}")
        assert shown.status_code == 200 and 'id="result-unreadable"' in shown.text, shown.text[-3000:]
        assert "the stored result is not JSON Python can read (" in shown.text and 'id="result"' not in shown.text
        assert '<pre class="code" id="result">' in page.get(f"/jobs/{real}").text
