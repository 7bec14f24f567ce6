"""An idempotency key held by another payload is a 409 for every send of `conveyor serve`, and a
refused send stores nothing: a client that retries after the 409 must not enqueue anything twice."""

from __future__ import annotations

import httpx
from tests.http.conftest import Server

from conveyor import App


def _conflict(response: httpx.Response) -> str:
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["status"] == 409 and error["code"] == "conflict"
    return str(error["message"])


def _pending(db: str) -> int:
    with App(db) as app:
        return sum(q.pending for q in app.admin.queues())


def test_a_batch_refused_for_a_key_held_by_another_payload_stores_none_of_its_jobs(server: Server) -> None:
    with server.client("producer") as c:
        held = c.post("/v1/queues/q/jobs", json={"task": "a", "idempotency_key": "K"})
        assert held.status_code == 202, held.text
        refused = c.post(
            "/v1/queues/q/jobs:batch", json={"jobs": [{"task": "fresh"}, {"task": "b", "idempotency_key": "K"}]}
        )
        assert "'K'" in _conflict(refused)
        # Two jobs of one batch sharing a key with different payloads: the second is refused, and the first too.
        twins = [
            {"task": "c", "payload": {"n": 1}, "idempotency_key": "twin"},
            {"task": "c", "payload": {"n": 2}, "idempotency_key": "twin"},
        ]
        _conflict(c.post("/v1/queues/q/jobs:batch", json={"jobs": [{"task": "fresh"}, *twins]}))
        assert _pending(server.db) == 1  # "a" alone: before, each refused batch stored "fresh"
        # The same job again under its key is a resend, not a conflict: the batch is stored.
        resend = c.post(
            "/v1/queues/q/jobs:batch", json={"jobs": [{"task": "fresh"}, {"task": "a", "idempotency_key": "K"}]}
        )
        assert resend.status_code == 202, resend.text
        assert [j["duplicate"] for j in resend.json()["jobs"]] == [False, True]
        assert resend.json()["jobs"][1]["id"] == held.json()["id"]
        assert _pending(server.db) == 2


def test_a_publish_with_a_key_held_by_another_payload_is_a_409_and_stores_nothing(server: Server) -> None:
    with App(server.db) as app:
        app.subscribe("orders", "billing", "billing.charge")
    key = {"Idempotency-Key": "order-7"}
    with server.client("producer") as c:
        first = c.post("/v1/topics/orders/messages", json={"payload": {"n": 1}}, headers=key)
        assert first.status_code == 202, first.text
        again = c.post("/v1/topics/orders/messages", json={"payload": {"n": 1}}, headers=key)
        assert again.status_code == 202 and again.json() == first.json()  # a resend: the same job
        with App(server.db) as app:
            app.subscribe("orders", "shipping", "ship")  # its queue does not hold the key yet
        # Before: 202 with the old job's id, the new payload silently dropped.
        assert "'order-7'" in _conflict(c.post("/v1/topics/orders/messages", json={"payload": {"n": 2}}, headers=key))
        assert _pending(server.db) == 1  # one transaction: nor is the shipping queue's job stored
        both = c.post("/v1/topics/orders/messages", json={"payload": {"n": 1}}, headers=key)
        assert both.status_code == 202 and both.json()["jobs"][0] == first.json()["jobs"][0]
        assert _pending(server.db) == 2
