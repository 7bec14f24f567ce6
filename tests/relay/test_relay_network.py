"""The relay behind a real TCP proxy to the real broker: a network that swallows everything (no confirm ever
comes) fails the attempt after ``confirm_timeout`` and the message waits in the DLQ for a replay; a connection cut
under a running worker is reopened by the next attempt on the same event loop."""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import pytest
from tests.chaos._proxy import TcpProxy
from tests.e2e._support import wait_until

from conveyor import App
from conveyor.relay import Relay
from conveyor.testing import drain

from .conftest import Broker, running_worker


def _through(proxy: TcpProxy, url: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@pytest.fixture
def proxy(broker: Broker) -> TcpProxy:
    parts = urlsplit(broker.url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672) as p:
        yield p  # type: ignore[misc]


def _state(app: App, job_id: UUID, state: str) -> bool:
    return app.job(job_id).state == state


@pytest.mark.timeout(60)
def test_no_confirm_within_confirm_timeout_fails_the_attempt_and_a_replay_publishes(
    sqlite_url: str, broker: Broker, proxy: TcpProxy
) -> None:
    with App(sqlite_url) as app:
        relay = Relay(app, _through(proxy, broker.url), exchange=broker.exchange, confirm_timeout=1)
        first = relay.publish(broker.key, {"n": 1})
        with running_worker(app):
            wait_until(lambda: broker.depth() >= 1, 10, "the first message at the broker")
            # The connection is open and stays so; from now on nothing gets through, no confirm comes back.
            proxy.swallowing = True
            swallowed = relay.publish(broker.key, {"n": 2}, max_attempts=1)
            wait_until(lambda: _state(app, swallowed.id, "dead"), 20, "the swallowed message's job dead")
        assert app.job(first.id).state == "completed"
        status = app.job(swallowed.id)
        assert status.error is not None and status.error.type == "RelayError"
        assert "did not answer (confirm the message) within 1s" in status.error.message
        assert repr(broker.key) in status.error.message
        # A fresh connection attempt is refused the same way, in one line.
        dead_connect = relay.publish(broker.key, {"n": 3}, max_attempts=1)
        assert drain(app, ["outbox"]).dead == 1
        error = app.job(dead_connect.id).error
        assert error is not None and error.message == "cannot connect to the broker: no answer within 1s"
        # The network is back: a replay publishes both, with the ids they were first sent with.
        proxy.swallowing = False
        assert len(app.admin.replay([swallowed.id, dead_connect.id], reason="network back", actor="test").replayed) == 2
        assert drain(app, ["outbox"]).completed == 2
    got = broker.drain()
    assert sorted((r.message_id or "", json.loads(r.body)["n"]) for r in got) == sorted(
        [(str(first.id), 1), (str(swallowed.id), 2), (str(dead_connect.id), 3)]
    )


@pytest.mark.timeout(60)
def test_a_connection_cut_under_a_running_worker_is_reopened_by_the_next_attempt(
    sqlite_url: str, broker: Broker, proxy: TcpProxy
) -> None:
    with App(sqlite_url) as app:
        relay = Relay(app, _through(proxy, broker.url), exchange=broker.exchange, backoff=[0.05])
        first = relay.publish(broker.key, {"n": 1})
        with running_worker(app):
            wait_until(lambda: broker.depth() >= 1, 10, "the first message at the broker")
            assert proxy.cut() == 1  # the loop's one connection, shared by its slots
            second = relay.publish(broker.key, {"n": 2})
            wait_until(lambda: _state(app, second.id, "completed"), 20, "the second message's job completed")
        assert app.job(first.id).state == "completed"
        assert proxy.connections_total == 2
    assert {r.message_id for r in broker.drain()} == {str(first.id), str(second.id)}
