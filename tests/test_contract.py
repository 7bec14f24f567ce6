"""The queue contract: every queue's declared options and every topic's subscriptions, as md/json/yaml."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest

from conveyor import App
from conveyor._contract import build, render


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


def test_contract_lists_every_queue_options_and_topic(app: App) -> None:
    app.queue("emails", max_depth=1000, sla=timedelta(minutes=5), ordered=True)

    @app.task(queue="emails", max_attempts=7, backoff=[1, 10], visibility_timeout=45)
    def send_email() -> None:
        pass

    app.subscribe("signups", "emails", send_email, filter={"plan": "pro"})
    contract = build(app)
    emails = next(q for q in contract["queues"] if q["queue"] == "emails")
    assert emails["max_depth"] == 1000 and emails["sla_s"] == 300 and emails["ordering"].startswith("per-key")
    assert emails["tasks"][0]["max_attempts"] == 7
    assert emails["tasks"][0]["visibility_timeout_s"] == 45
    assert emails["tasks"][0]["backoff"] == "fixed 1s, 10s"
    assert contract["topics"] == [
        {"topic": "signups", "subscriptions": [{"queue": "emails", "task": send_email.name, "filter": {"plan": "pro"}}]}
    ]
    assert json.loads(render(contract, "json")) == contract
    md = render(contract, "md")
    assert "## Queue `emails`" in md and "| max_depth | 1000 |" in md
    yaml_text = render(contract, "yaml")
    assert "max_depth: 1000" in yaml_text and 'topic: "signups"' in yaml_text


def test_markdown_escapes_what_a_terminal_would_act_on(app: App) -> None:
    # Before: names sent with an ESC sequence or a bidi override were printed raw by `conveyor contract`
    # (its default, markdown), while --format json and yaml escaped them.
    queue, task = "q\x1b]0;own\x07", "ta\x1b[31msk\u202e"
    app.send(task, {}, queue=queue)
    app.subscribe("tp\x1b[5mX", queue, task)
    md = render(build(app), "md")
    assert "\x1b" not in md and "\x07" not in md and "\u202e" not in md
    assert "`q\\x1b]0;own\\x07`" in md and "`tp\\x1b[5mX`" in md
