"""Fan-out topics: a publish copies the message to every subscribed queue whose filter matches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conveyor import App
from conveyor._errors import ConfigurationError, PayloadError, QueueFull
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


def test_a_filter_that_can_match_nothing_or_cannot_be_stored_is_a_configuration_error(app: App) -> None:
    # Before: {"in": []} was taken and the subscription never received a message; a NaN, a NUL or a lone
    # surrogate in a filter raised PayloadError, worded for a payload ("send plain data, or a reference ...").
    with pytest.raises(ConfigurationError, match=r"""filter on 'region': \{"in": \[\]\} matches no message"""):
        app.subscribe("t", "q", "task", filter={"region": {"in": []}})
    for bad, wording in (
        ({"x": float("nan")}, "subscription filter is not JSON"),
        ({"x": {"in": [float("inf")]}}, "subscription filter is not JSON"),
        ({"x": "a\x00"}, "subscription filter holds a string with a NUL"),
        ({"x": "\udc80"}, "subscription filter holds a string that is not valid Unicode"),
    ):
        with pytest.raises(ConfigurationError, match=wording) as caught:
            app.subscribe("t", "q", "task", filter=bad)
        assert "pickle" not in str(caught.value) and "payload" not in str(caught.value)
    assert app.admin.subscriptions("t") == []


def test_filters_compare_json_values_not_python_equality(app: App) -> None:
    app.subscribe("flags", "ones", "one", filter={"x": 1})
    app.subscribe("flags", "offs", "off", filter={"flag": False})
    app.subscribe("flags", "zeros", "zero", filter={"n": {"in": [0]}})

    def queues(headers: dict[str, object]) -> list[str]:
        return sorted(j.status().queue for j in app.publish("flags", {}, headers=headers))

    # true is not 1, 0 is not false (Python's == says they are); 1.0 is the JSON number 1.
    assert queues({"x": True, "flag": 0, "n": False}) == []
    assert queues({"x": 1.0, "flag": False, "n": 0}) == ["offs", "ones", "zeros"]


def test_a_publish_key_is_held_per_queue_as_a_sends(app: App) -> None:
    # Documented (README, "Fan-out topics"): a queue subscribed to two topics holds one key for both.
    app.subscribe("orders", "audit", "record")
    app.subscribe("refunds", "audit", "record")
    (order,) = app.publish("orders", {"order": 1}, idempotency_key="evt-1")
    assert [j.id for j in app.publish("refunds", {"refund": 1}, idempotency_key="evt-1")] == [order.id]
    assert [j.id for j in app.publish("refunds", {"refund": 1}, idempotency_key="refund-evt-1")] != [order.id]
    assert order.status().idempotency_key == "evt-1"


def test_a_publish_checks_its_headers_and_options_with_no_subscriber(app: App) -> None:
    # Publishing is sending: what a subscriber's job would refuse is refused with none (before: []).
    for bad in (
        {"headers": {"x": float("nan")}},
        {"headers": {"x": "a\x00b"}},
        {"headers": {"x": object()}},
        {"priority": "high"},
        {"bogus": 1},
        {"idempotency_key": ""},
    ):
        with pytest.raises(PayloadError):
            app.publish("nobody-listens", {}, **bad)  # type: ignore[arg-type]
    assert app.publish("nobody-listens", {}, headers={"x": 1}, priority=3) == []


def test_a_publish_given_a_queue_or_task_is_refused_with_subscribers_or_none(app: App) -> None:
    # Each subscription names the queue and task of its copy. Before: queue= was taken with no subscriber ([]),
    # and the same call raised "Message() got multiple values for keyword argument 'queue'" once an operator
    # subscribed a queue to the topic: a producer's publish broke in production on a `conveyor topics subscribe`.
    for subscribed in (False, True):
        if subscribed:
            app.subscribe("orders", "billing", "bill")
        for option in ("queue", "task"):
            with pytest.raises(PayloadError, match=f"publish takes no {option}=: each subscription names"):
                app.publish("orders", {}, **{option: "billing"})
    assert app.admin.queues() == []


def test_a_publish_given_a_topic_header_naming_another_topic_is_refused(app: App) -> None:
    # The topic header says which topic a copy was published to. Before, a producer's own "topic" header was
    # overwritten with the topic's name without a word; its value was lost.
    for subscribed in (False, True):
        if subscribed:
            app.subscribe("orders", "billing", "bill")
        with pytest.raises(PayloadError, match=r"headers' topic is the name of the topic published to \('orders'\)"):
            app.publish("orders", {}, headers={"topic": "sports", "region": "eu"})
    assert app.admin.queues() == []
    # The same name states the same fact: a handler may publish again the headers of a copy it received.
    (job,) = app.publish("orders", {}, headers={"topic": "orders"})
    assert job.status().headers["topic"] == "orders"


def test_a_publish_one_of_whose_subscribers_is_full_is_refused_whole(app: App) -> None:
    # Documented (README, "Fan-out topics"): a publish is one transaction, so a subscriber past its max_depth
    # refuses it whole, naming its queue; no subscriber gets a copy the others miss.
    app.queue("audit", max_depth=1, shedding={"low": 1.0, "normal": 1.0, "high": 1.0})
    app.subscribe("orders", "billing", "bill")
    app.subscribe("orders", "audit", "record")
    assert len(app.publish("orders", {"order": 1})) == 2
    with pytest.raises(QueueFull, match="'audit'") as full:
        app.publish("orders", {"order": 2})
    assert full.value.queue == "audit" and full.value.retry_after > 0
    assert {q.queue: q.pending for q in app.admin.queues()} == {"audit": 1, "billing": 1}


def test_a_filter_nested_past_the_stack_or_with_a_huge_key_is_refused_in_a_short_line(app: App) -> None:
    # Before: the message quoted the whole condition: nested 5,000 deep, its repr overflowed the stack (a
    # RecursionError traceback); a 10 MB key made a 10 MB message.
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(ConfigurationError, match="a condition object must be") as caught:
        app.subscribe("t", "q", "task", filter={"x": deep})
    assert len(str(caught.value)) < 300
    with pytest.raises(ConfigurationError, match="to match one of several values") as caught:
        app.subscribe("t", "q", "task", filter={"k" * 10_000_000: ["eu"]})
    assert len(str(caught.value)) < 300
    assert app.admin.subscriptions("t") == []
