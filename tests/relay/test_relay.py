"""The outbox relay (conveyor.relay) against a real RabbitMQ and real databases: what commits arrives once, with its
job id as message_id; what rolls back never arrives; a broker that refuses or is away gets retries and a dead letter
that names why, never a lost message; what the broker would refuse is refused at publish, with nothing written."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import socket
import uuid
from typing import Any

import aio_pika
import pytest
from tests.conftest import driver_connection
from tests.e2e._support import wait_until

from conveyor import App, PayloadError, Worker
from conveyor._errors import ConfigurationError, PayloadTooLarge
from conveyor.backends.base import QueuesStatsParams
from conveyor.relay import TASK_NAME, Relay
from conveyor.testing import drain

from .conftest import Broker, running_worker


def _live_jobs(app: App) -> int:
    stats = app.backend.queues_stats(QueuesStatsParams(app.clock.now()))
    return sum(s.pending + s.scheduled + s.processing for s in stats)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _business_table(url: str) -> None:
    with driver_connection(url, autocommit=True) as conn:
        statement = "CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, total INT NOT NULL)"
        if url.startswith("mysql://"):
            with conn.cursor() as cur:
                cur.execute(statement)
        else:
            conn.execute(statement)


def _insert_order(conn: Any, url: str, order: str) -> None:
    if url.startswith("mysql://"):
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, total) VALUES (%s, 42)", (order,))
    else:
        conn.execute("INSERT INTO orders (id, total) VALUES (%s, 42)", (order,))


@pytest.mark.parametrize("engine", ["postgres", "mysql"])
def test_publish_in_a_transaction_arrives_once_if_it_commits_and_never_if_it_rolls_back(
    engine: str, request: pytest.FixtureRequest, broker: Broker
) -> None:
    url = str(request.getfixturevalue("postgres_database" if engine == "postgres" else "mysql_database"))
    _business_table(url)
    with App(url, migrate=True) as app:
        relay = Relay(app, broker.url, exchange=broker.exchange)
        with driver_connection(url) as conn:
            _insert_order(conn, url, "committed")
            kept = relay.publish(broker.key, {"order": "committed", "total": 42}, conn=conn, headers={"tenant": "acme"})
            conn.commit()
        with driver_connection(url) as conn:
            _insert_order(conn, url, "rolled-back")
            gone = relay.publish(broker.key, {"order": "rolled-back"}, conn=conn)
            conn.rollback()
        result = drain(app, ["outbox"])
        assert (result.completed, result.dead, result.retried) == (1, 0, 0)
        assert app.job(kept.id).state == "completed"
        with pytest.raises(LookupError):
            app.job(gone.id)
    got = broker.drain()
    assert len(got) == 1
    message = got[0]
    assert message.message_id == str(kept.id)
    assert json.loads(message.body) == {"order": "committed", "total": 42}
    assert message.content_type == "application/json"
    assert message.delivery_mode == 2  # persistent
    assert (message.exchange, message.routing_key) == (broker.exchange, broker.key)
    assert message.headers["tenant"] == "acme"
    assert message.headers["correlation_id"] == str(kept.id)
    assert message.headers["traceparent"].startswith("00-")


def test_publish_on_sqlite_through_the_default_exchange(sqlite_url: str, broker: Broker) -> None:
    """Without ``conn``: the message is its own transaction. The default exchange routes by queue name."""
    with App(sqlite_url) as app:
        relay = Relay(app, broker.url)
        jobs = [relay.publish(broker.queue, {"n": n}, ordering_key="one-key") for n in range(20)]
        assert drain(app, ["outbox"]).completed == 20
    got = broker.drain()
    # One ordering key: published in the order they were enqueued.
    assert [r.message_id for r in got] == [str(j.id) for j in jobs]
    assert [json.loads(r.body) for r in got] == [{"n": n} for n in range(20)]


def test_a_missing_exchange_retries_then_dead_letters_naming_it_and_a_replay_after_it_exists_publishes(
    sqlite_url: str, broker: Broker
) -> None:
    missing = f"{broker.exchange}-later"
    with App(sqlite_url) as app:
        relay = Relay(app, broker.url, backoff=[0.05])
        job = relay.publish(broker.key, {"n": 1}, exchange=missing, max_attempts=3)
        # Good messages on the same worker at the same time are not harmed by the bad one: the broker closes a
        # channel that publishes to a missing exchange, so the relay checks the exchange on a channel of its own.
        good = [relay.publish(broker.key, {"n": n}, exchange=broker.exchange) for n in range(10)]
        result = drain(app, ["outbox"])
        assert (result.completed, result.dead, result.retried) == (10, 1, 2)
        assert all(app.job(g.id).attempts == 1 for g in good)
        status = app.job(job.id)
        assert (status.state, status.attempts) == ("dead", 3)
        assert status.error is not None and status.error.type == "RelayError"
        assert repr(missing) in status.error.message and "NOT_FOUND" in status.error.message
        assert repr(broker.key) in status.error.message
        assert len(broker.drain()) == 10

        broker.extra_exchanges.append(missing)
        broker.declare(exchange=missing)  # the test's queue bound to it by the test's key
        assert len(app.admin.replay([job.id], reason="exchange created", actor="test").replayed) == 1
        assert drain(app, ["outbox"]).completed == 1
    got = broker.drain()
    assert len(got) == 1 and json.loads(got[0].body) == {"n": 1}
    assert (got[0].exchange, got[0].message_id) == (missing, str(job.id))


def test_an_unroutable_message_is_retried_then_dead_lettered_naming_the_routing_key(
    sqlite_url: str, broker: Broker
) -> None:
    """mandatory=True: a message no queue is bound for is returned, not dropped by the broker."""
    with App(sqlite_url) as app:
        relay = Relay(app, broker.url, exchange=broker.exchange, backoff=[0.05])
        job = relay.publish("no-queue-bound-for-this", {"n": 1}, max_attempts=2)
        result = drain(app, ["outbox"])
        assert (result.dead, result.retried) == (1, 1)
        status = app.job(job.id)
        assert status.error is not None
        assert "unroutable" in status.error.message and "'no-queue-bound-for-this'" in status.error.message
        assert repr(broker.exchange) in status.error.message and "NO_ROUTE" in status.error.message
    assert broker.drain() == []


def test_an_unreachable_broker_is_retried_not_lost_and_a_replay_publishes_once_it_is_back(
    sqlite_url: str, broker: Broker
) -> None:
    closed = f"amqp://guest:guest@127.0.0.1:{_closed_port()}/"
    with App(sqlite_url) as app:
        relay = Relay(app, closed, exchange=broker.exchange, confirm_timeout=2, backoff=[0.05], max_attempts=4)
        job = relay.publish(broker.key, {"n": 7})
        result = drain(app, ["outbox"])
        assert (result.dead, result.retried, result.completed) == (1, 3, 0)
        status = app.job(job.id)
        assert (status.state, status.attempts) == ("dead", 4)
        assert status.error is not None and status.error.type == "RelayError"
        assert "cannot connect to the broker" in status.error.message
    # The broker is back (another relay on the same database, pointed at the real one): replay publishes it.
    with App(sqlite_url) as app:
        Relay(app, broker.url, exchange=broker.exchange)
        [(_, new_id)] = app.admin.replay([job.id], reason="broker back", actor="test").replayed
        assert new_id != job.id
        assert drain(app, ["outbox"]).completed == 1
    got = broker.drain()
    assert [json.loads(r.body) for r in got] == [{"n": 7}]
    # The replay is a new job, but the message keeps the id it was first sent with: a consumer that saw it
    # (a confirm lost on the way back) drops the copy.
    assert got[0].message_id == str(job.id)


@pytest.mark.parametrize(
    ("routing_key", "exchange", "why"),
    [
        ("é" * 128, None, "256 bytes of UTF-8, over AMQP's 255-byte limit"),
        ("a\x00b", None, "NUL"),
        ("a\ud800", None, "lone surrogate"),
        (b"bytes", None, "must be a string, got bytes"),
        (42, None, "must be a string, got int"),
        (None, None, "must be a string, got NoneType"),
        ("ok", "x" * 256, "exchange is 256 bytes"),
        ("ok", "\udfff", "exchange is not valid Unicode"),
        ("ok", 3.5, "exchange must be a string, got float"),
        # The client (pamqp) refuses to send these exchange names, so no retry could ever publish them.
        ("ok", "café", "exchange may hold only"),
        ("ok", "orders\tnew", "exchange may hold only"),
        ("ok", "x" * 128, "exchange is 128 characters"),
    ],
)
def test_publish_refuses_what_the_broker_would_refuse_with_nothing_written(
    sqlite_url: str, routing_key: Any, exchange: Any, why: str
) -> None:
    with App(sqlite_url) as app:
        relay = Relay(app, "amqp://guest:guest@127.0.0.1:5672/")
        with pytest.raises(PayloadError, match=why):
            relay.publish(routing_key, {"n": 1}, exchange=exchange)
        assert _live_jobs(app) == 0


def test_publish_refuses_bad_bodies_and_headers_with_nothing_written(sqlite_url: str) -> None:
    with App(sqlite_url) as app:
        relay = Relay(app, "amqp://guest:guest@127.0.0.1:5672/")
        relay.publish("k" * 255, {"n": 1})  # 255 bytes: the limit itself is fine
        assert _live_jobs(app) == 1
        with pytest.raises(PayloadTooLarge, match="over the 262144-byte limit"):
            relay.publish("k", {"blob": "x" * 300_000})
        with pytest.raises(PayloadError, match="body must be a JSON object"):
            relay.publish("k", ["not", "an", "object"])  # type: ignore[arg-type]
        with pytest.raises(PayloadError, match="not JSON-serialisable"):
            relay.publish("k", {"n": float("nan")})
        with pytest.raises(PayloadError, match="NUL"):
            relay.publish("k", {"s": "a\x00b"})
        with pytest.raises(PayloadError, match="over AMQP's 128-byte limit for header names"):
            relay.publish("k", {}, headers={"h" * 129: 1})
        with pytest.raises(PayloadError, match="over AMQP's 128-byte limit for header names"):
            relay.publish("k", {}, headers={"outer": {"h" * 129: 1}})
        with pytest.raises(PayloadError, match="signed 64-bit"):
            relay.publish("k", {}, headers={"big": 2**64})
        with pytest.raises(PayloadError, match="its own queue"):
            relay.publish("k", {}, queue="elsewhere")
        with pytest.raises(PayloadError, match="give no id"):
            relay.publish("k", {}, id=uuid.uuid4())
        with pytest.raises(PayloadError, match="bad send option"):
            relay.publish("k", {}, no_such_option=1)
        assert _live_jobs(app) == 1


def test_a_bad_job_sent_around_publish_is_dead_at_once_saying_what_is_wrong(sqlite_url: str, broker: Broker) -> None:
    """A job that no retry could publish (sent with app.send directly, or by older code) never loops."""
    bad = [
        ({"body": {}}, "needs a routing_key"),
        ({"routing_key": "é" * 200, "body": {}}, "over AMQP's 255-byte limit"),
        ({"routing_key": 5, "body": {}}, "routing_key must be a string"),
        ({"routing_key": "k", "body": [1, 2]}, "body must be a JSON object"),
        ({"routing_key": "k", "body": {}, "exchange": 7}, "exchange must be a string"),
        ({"routing_key": "k", "body": {}, "colour": "red"}, "got also \\['colour'\\]"),
        ({"routing_key": "k", "body": {}, "message_id": "m" * 256}, "message_id is 256 bytes"),
    ]
    with App(sqlite_url) as app:
        Relay(app, broker.url, exchange=broker.exchange)
        jobs = [(app.send(TASK_NAME, payload, queue="outbox"), why) for payload, why in bad]
        huge_header = app.send(TASK_NAME, {"routing_key": broker.key, "body": {}}, queue="outbox", headers={"n": 2**70})
        result = drain(app, ["outbox"])
        assert (result.dead, result.retried, result.completed) == (len(bad) + 1, 0, 0)
        for job, why in jobs:
            status = app.job(job.id)
            assert (status.state, status.attempts) == ("dead", 1)
            assert status.error is not None and status.error.type == "PayloadError"
            assert re.search(why, status.error.message), (why, status.error.message)
        status = app.job(huge_header.id)
        assert status.error is not None and "signed 64-bit" in status.error.message
    assert broker.drain() == []


def test_relay_options_are_checked(sqlite_url: str) -> None:
    with App(sqlite_url) as app:
        for bad, why in [
            ({"url": "http://broker"}, "amqp://"),
            ({"exchange": "x" * 300}, "255-byte"),
            ({"queue": ""}, "must not be empty"),
            ({"confirm_timeout": float("nan")}, "confirm_timeout"),
            ({"confirm_timeout": 0}, "confirm_timeout"),
            ({"name": "other"}, "named conveyor.relay"),
        ]:
            options: dict[str, Any] = {"url": "amqp://guest:guest@127.0.0.1:5672/", **bad}
            url = options.pop("url")
            with pytest.raises(ConfigurationError, match=why):
                Relay(app, url, **options)
        Relay(app, "amqp://guest:guest@127.0.0.1:5672/")
        with pytest.raises(ConfigurationError, match="already registered"):
            Relay(app, "amqp://guest:guest@127.0.0.1:5672/", queue="other")


def test_a_relay_url_refused_for_its_scheme_does_not_show_the_password(sqlite_url: str) -> None:
    with App(sqlite_url) as app:
        for url in ["http://guest:s3cret-pw@broker/", "amqp:/guest:s3cret-pw@broker/", "amqp//guest:s3cret-pw@broker/"]:
            with pytest.raises(ConfigurationError, match="amqp://") as caught:
                Relay(app, url)
            assert "s3cret-pw" not in str(caught.value)
        # A scheme is case-insensitive (RFC 3986): AMQP:// is the broker's URL all the same.
        assert Relay(app, "AMQP://guest:guest@127.0.0.1:5672/").queue == "outbox"


def test_publish_async_enqueues_like_publish(sqlite_url: str, broker: Broker) -> None:
    with App(sqlite_url) as app:
        relay = Relay(app, broker.url, exchange=broker.exchange)
        job = asyncio.run(relay.publish_async(broker.key, {"n": 1}, headers={"tenant": "t"}, priority=5))
        with pytest.raises(PayloadError, match="NUL"):
            asyncio.run(relay.publish_async("a\x00", {}))
        assert drain(app, ["outbox"]).completed == 1
    got = broker.drain()
    assert [(r.message_id, r.headers["tenant"]) for r in got] == [(str(job.id), "t")]


def test_the_connection_closes_with_the_event_loop_of_a_worker_run(sqlite_url: str, broker: Broker) -> None:
    """The worker has no stop hook for handlers: the relay's connection (one per event loop, shared by the slots)
    is closed when the loop shuts down, as Worker.run_sync, asyncio.run and the testing kit's drain do it, and
    nothing is left for the garbage collector to complain about."""
    with App(sqlite_url) as app:
        relay = Relay(app, broker.url, exchange=broker.exchange)
        for n in range(30):
            relay.publish(broker.key, {"n": n})
        worker = Worker(app, ["outbox"], burst=True, concurrency=5)
        with asyncio.Runner() as runner:
            runner.run(worker.run())
            link = relay._links[runner.get_loop()]
            connection = link.connection
            assert connection is not None and not connection.is_closed  # kept open across the jobs
        assert connection.is_closed
        assert worker.counters.completed == 30
        gc.collect()  # an unclosed connection's tasks would be reported here (warnings are errors)
    assert len(broker.drain()) == 30


@pytest.mark.timeout(60)
def test_an_exchange_deleted_after_it_was_checked_fails_its_jobs_and_the_relay_recovers(
    sqlite_url: str, broker: Broker
) -> None:
    """The relay checks an exchange once per connection; deleted later, the broker closes the shared channel on
    the next publish to it: that attempt fails, the connection is reopened, and the other messages go on."""
    doomed = f"{broker.exchange}-doomed"
    broker.extra_exchanges.append(doomed)
    broker.declare(exchange=doomed)
    with App(sqlite_url) as app:
        relay = Relay(app, broker.url, backoff=[0.05])
        first = relay.publish(broker.key, {"n": 1}, exchange=doomed)
        with running_worker(app):
            wait_until(lambda: broker.depth() >= 1, 10, "the first message at the broker")
            broker.delete([doomed], [])
            later = relay.publish(broker.key, {"n": 2}, exchange=doomed, max_attempts=2)
            wait_until(lambda: app.job(later.id).state == "dead", 20, "the job of the deleted exchange dead")
            after = relay.publish(broker.key, {"n": 3}, exchange=broker.exchange)
            wait_until(lambda: app.job(after.id).state == "completed", 20, "the next message's job completed")
        assert app.job(first.id).state == "completed"
        status = app.job(later.id)
        assert (status.state, status.attempts) == ("dead", 2)
        assert status.error is not None and f"no exchange {doomed!r}" in status.error.message
    assert sorted(json.loads(r.body)["n"] for r in broker.drain()) == [1, 3]


def test_a_refused_login_is_retried_and_its_dead_letter_does_not_show_the_password(
    sqlite_url: str, broker: Broker
) -> None:
    wrong = broker.url.replace("guest:guest@", "guest:hunter2@")
    assert wrong != broker.url
    with App(sqlite_url) as app:
        relay = Relay(app, wrong, exchange=broker.exchange, backoff=[0.05], max_attempts=2)
        job = relay.publish(broker.key, {"n": 1})
        assert drain(app, ["outbox"]).dead == 1
        status = app.job(job.id)
        assert status.attempts == 2 and status.error is not None
        assert "cannot connect to the broker" in status.error.message and "ACCESS_REFUSED" in status.error.message
        assert "hunter2" not in status.error.message + status.error.traceback


def test_a_returned_message_is_never_acked_for_a_publish_of_the_same_id_in_flight(
    sqlite_url: str, broker: Broker
) -> None:
    """aio-pika matches a return to its publish by message_id: with two publishes of one id in flight on the
    shared channel (a dead letter replayed twice, a job sent by hand), the return of the unroutable one failed the
    routable one and the unroutable one was confirmed, its job acked with its message dropped (lost)."""
    with App(sqlite_url) as app:
        relay = Relay(app, broker.url, exchange=broker.exchange)

        async def both() -> list[BaseException | None]:
            link = relay._link()
            channel = await relay._channel(link)

            def message() -> Any:
                return aio_pika.Message(b"{}", message_id="same-id")

            results = await asyncio.gather(
                relay._publish(link, channel, broker.exchange, "no-queue-bound-for-this", message()),
                relay._publish(link, channel, broker.exchange, broker.key, message()),
                return_exceptions=True,
            )
            await link.drop()
            return list(results)

        for _ in range(5):
            unroutable, routable = asyncio.run(both())
            # Never: the unroutable publish taken as confirmed. A routable one failing is a retry (at least once).
            assert isinstance(unroutable, Exception), "a returned message was taken as confirmed"
            assert "unroutable" in str(unroutable) or "in flight" in str(unroutable)
            assert routable is None or "in flight" in str(routable)
    assert len(broker.drain()) <= 5


@pytest.mark.parametrize("suffix", [" with spaces", "-a_b.c:d@e#f,g/h+i"])
def test_an_exchange_name_with_spaces_or_punctuation_is_published_to(
    sqlite_url: str, broker: Broker, suffix: str
) -> None:
    exchange = broker.exchange + suffix
    broker.declare(exchange=exchange)
    try:
        with App(sqlite_url) as app:
            job = Relay(app, broker.url).publish(broker.key, {"n": 1}, exchange=exchange)
            assert drain(app, ["outbox"]).completed == 1
        assert [(r.message_id, r.exchange) for r in broker.drain()] == [(str(job.id), exchange)]
    finally:
        broker.delete([exchange], [])


def test_a_relay_exchange_the_client_cannot_send_is_a_configuration_error(sqlite_url: str) -> None:
    with App(sqlite_url) as app, pytest.raises(ConfigurationError, match="may hold only"):
        Relay(app, "amqp://guest:guest@127.0.0.1:5672/", exchange="événements")
