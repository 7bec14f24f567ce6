"""``GET /v1/scaling``: the recommendation for an external autoscaler over HTTP (operator), and a 400 naming
the parameter for every bad one; never a 500."""

from __future__ import annotations

import pytest
from tests.http.conftest import Server

from conveyor import App, Message


def _send(server: Server, queue: str, n: int) -> None:
    with App(server.db) as app:
        app.send_many([Message(task="emails.send", queue=queue, payload={"n": i}) for i in range(n)])


def test_scaling_answers_the_policy_for_the_queues(server: Server) -> None:
    _send(server, "emails", 25)
    _send(server, "reports", 7)
    with server.client("operator") as c:
        got = c.get("/v1/scaling", params={"queues": "emails", "max": 8, "current": 3})
        assert got.status_code == 200, got.text
        assert got.json() == {
            "desired": 3,
            "current": 3,
            "ready": 25,
            "in_flight": 0,
            "reason": "ready 25, in flight 0: 25 jobs at 10 per process want 3",
        }
        # Every queue; a target; steps; the bounds.
        assert c.get("/v1/scaling", params={"max": 8}).json()["ready"] == 32
        assert c.get("/v1/scaling", params={"max": 8, "concurrency": 4}).json()["desired"] == 8
        assert (
            c.get("/v1/scaling", params={"queues": "emails,reports", "max": 8, "target": "2.5"}).json()["desired"] == 8
        )
        assert c.get("/v1/scaling", params={"queues": "reports", "max": 8, "target": "2.5"}).json()["desired"] == 3
        stepped = c.get("/v1/scaling", params={"queues": "emails", "max": 8, "current": 2, "steps": "10:1,20:3"})
        assert stepped.json()["desired"] == 5
        assert c.get("/v1/scaling", params={"queues": "none", "min": 2, "max": 8}).json()["desired"] == 2
    # A token limited to queues asks about its own queues only.
    with server.client("emails_ops") as c:
        assert c.get("/v1/scaling", params={"queues": "emails", "max": 4}).json()["ready"] == 25
        assert c.get("/v1/scaling", params={"max": 4}).status_code == 403
        assert c.get("/v1/scaling", params={"queues": "emails,reports", "max": 4}).status_code == 403
    with server.client("producer") as c:
        assert c.get("/v1/scaling", params={"max": 4}).status_code == 403
    with server.client() as c:
        assert c.get("/v1/scaling", params={"max": 4}).status_code == 401


@pytest.mark.parametrize(
    ("query", "field", "fragment"),
    [
        ("", "max", "max is required"),
        ("max=0", "max", "max must be an integer from 1 to 256"),
        ("max=257", "max", "max must be an integer from 1 to 256"),
        ("max=99999999999999999999", "max", "max must be"),
        ("max=nan", "max", "max must be"),
        ("max=%00", "max", "max must be"),
        ("max=1.5", "max", "max must be"),
        ("max=2&min=3", None, "minimum 3 is above its maximum 2"),
        ("max=2&min=0", "min", "min must be"),
        ("max=2&current=-1", "current", "current must be"),
        ("max=2&concurrency=0", "concurrency", "concurrency must be"),
        ("max=2&target=nan", "target", "target must be a positive decimal"),
        ("max=2&target=inf", "target", "target must be a positive decimal"),
        ("max=2&target=0", "target", "target must be a positive decimal"),
        ("max=2&target=1e3", "target", "target must be a positive decimal"),
        ("max=2&target=2&steps=1:1", None, "not both"),
        ("max=2&steps=abc", None, "scale steps must be BACKLOG:ADD"),
        ("max=2&steps=10:1,10:2", None, "backlog 10 is given twice"),
        ("max=2&steps=%FF:1", None, "query of the URL is not UTF-8"),
        ("max=2&queues=a,,b", None, "queues must not be empty"),
        ("max=2&queues=" + "q" * 400, None, "queues"),
        ("max=2&queues=a%00b", None, "queues"),
        ("max=2&bogus=1", None, "unknown parameter 'bogus'"),
    ],
)
def test_bad_parameters_are_400_with_a_message(server: Server, query: str, field: str | None, fragment: str) -> None:
    with server.client("operator") as c:
        got = c.get(f"/v1/scaling?{query}")
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert fragment in error["message"], error
    if field is not None:
        assert error.get("field") == field, error
