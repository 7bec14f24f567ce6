"""Fan-out topics: a publish copies the message to every subscribed queue whose filter matches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor import App
from conveyor._errors import ConfigurationError
from conveyor.testing import drain


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def test_publish_fans_out_to_matching_subscriptions(app: App) -> None:
    seen: list[tuple[str, int]] = []

    @app.task(queue="billing")
    def bill(order: int) -> None:
        seen.append(("billing", order))

    @app.task(queue="eu-shipping", max_attempts=2, backoff=[0.01])
    def ship(order: int) -> None:
        raise ConnectionError("carrier down")

    @app.task(queue="audit")
    def audit(order: int) -> None:
        seen.append(("audit", order))

    app.subscribe("orders", "billing", bill)
    app.subscribe("orders", "eu-shipping", ship, filter={"region": {"in": ["eu", "uk"]}})
    app.subscribe("orders", "audit", audit, filter={"kind": "paid"})
    jobs = app.publish("orders", {"order": 1}, headers={"region": "eu", "kind": "paid"})
    assert sorted(j.status().queue for j in jobs) == ["audit", "billing", "eu-shipping"]
    assert [j.status().queue for j in app.publish("orders", {"order": 2}, headers={"region": "us"})] == ["billing"]
    assert app.publish("nobody-listens", {"order": 3}) == []
    drain(app)
    assert sorted(seen) == [("audit", 1), ("billing", 1), ("billing", 2)]
    # Each subscriber keeps its own retries and DLQ.
    shipped = next(j for j in jobs if j.status().queue == "eu-shipping").status()
    assert (shipped.state, shipped.attempts) == ("dead", 2)
    assert shipped.headers["topic"] == "orders"
    assert app.unsubscribe("orders", "audit") is True
    assert app.unsubscribe("orders", "audit") is False


def test_bad_filters_are_refused(app: App) -> None:
    with pytest.raises(ConfigurationError, match='"in"'):
        app.subscribe("t", "q", "task", filter={"region": ["eu"]})
    with pytest.raises(ConfigurationError):
        app.subscribe("t", "q", "task", filter={"region": {"like": "e%"}})
