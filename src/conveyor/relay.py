"""The outbox relay: jobs of an outbox queue published to RabbitMQ, at least once.

A :class:`Relay` registers one task (``conveyor.relay``) on its queue. :meth:`Relay.publish` enqueues a
message for the broker as a job, on your own connection if you give one, so that the message commits with
your business write or not at all (the transactional outbox). A worker consuming the queue
(``conveyor worker myapp:app --queues outbox``) publishes each job to RabbitMQ on a channel with publisher
confirms and ``mandatory`` set, and acks the job only after the broker confirmed the message: a broker that
refuses, returns, does not confirm in time or cannot be reached within ``confirm_timeout`` (one that refuses
connections, restarting, is tried again meanwhile) fails the attempt, and the job retries with
backoff and ends in the dead-letter queue after its attempts, where it can be replayed once the broker is
fixed. Nothing is lost; a relay that dies between the broker's confirm and the job's ack publishes the
message again, with the same ``message_id`` (the job's id): consumers deduplicate on it.

Messages of one ``ordering_key`` are published in the order they were enqueued (Conveyor's per-key FIFO: one
job per key in flight, a retrying job holds its key back). Needs the ``rabbitmq`` extra (aio-pika)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import weakref
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from conveyor._context import JobContext
from conveyor._errors import ConfigurationError, ConveyorError, PayloadError
from conveyor._ids import uuid7
from conveyor._job import Job
from conveyor._limits import check_name, check_seconds, is_utf8, preview

try:
    import aio_pika
    import aio_pika.abc
    import aiormq.exceptions
    from pamqp import commands
except ImportError as exc:  # pragma: no cover - an install without the extra
    raise ImportError(f"conveyor.relay needs aio-pika: pip install 'conveyor[rabbitmq]' ({exc})") from exc

if TYPE_CHECKING:
    from conveyor._app import App

__all__ = ["TASK_NAME", "Relay", "RelayError"]

#: The name of the task a Relay registers (one Relay per App).
TASK_NAME = "conveyor.relay"
#: AMQP's short string: an exchange name and a routing key are at most 255 bytes of UTF-8.
MAX_SHORTSTR_BYTES = 255
#: The longest exchange name the AMQP client (pamqp) sends, and the characters it allows in one.
MAX_EXCHANGE_CHARS = 127
_EXCHANGE_NAME = re.compile(r"[A-Za-z0-9\-_.:@#,/+ ]*")
#: RabbitMQ (and pamqp, which silently truncates longer ones) take header names of at most 128 bytes.
MAX_HEADER_NAME_BYTES = 128
#: AMQP tables carry integers as signed 64-bit numbers.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Seconds a worker's stop waits for the broker to close the connection.
_CLOSE_TIMEOUT = 2.0
#: Pauses between connection attempts to a broker that refuses them (restarting): 0.1 s, doubling to 1 s.
_CONNECT_PAUSE_FIRST = 0.1
_CONNECT_PAUSE_MAX = 1.0


class RelayError(ConveyorError):
    """The broker did not take a message: it was not confirmed within ``confirm_timeout``, was nacked, was
    returned as unroutable, was refused (a missing exchange, an access refused), or the broker could not be
    reached. Raised in the relay's handler: the job retries with backoff, then is dead-lettered with this
    message, never lost."""


def _check_shortstr(value: object, what: str, error: type[ConveyorError] = PayloadError) -> str:
    """``value`` as a plain ``str`` if the broker takes it as an AMQP short string (exchange name, routing
    key): at most 255 bytes of UTF-8, valid Unicode; else raise ``error``. Empty is allowed (the default
    exchange; a fanout's routing key)."""
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {type(value).__name__}")
    value = str.__str__(value)
    if not is_utf8(value):
        raise error(f"{what} is not valid Unicode (it contains a lone surrogate): {preview(value)}")
    if "\x00" in value:
        raise error(f"{what} contains a NUL character (\\x00): {preview(value)}")
    size = len(value.encode("utf-8"))
    if size > MAX_SHORTSTR_BYTES:
        raise error(f"{what} is {size} bytes of UTF-8, over AMQP's {MAX_SHORTSTR_BYTES}-byte limit: {preview(value)}")
    return value


def _check_exchange(value: object, what: str, error: type[ConveyorError] = PayloadError) -> str:
    """``value`` if the AMQP client (pamqp) will send it as an exchange name: a short string of at most
    127 characters from ``[A-Za-z0-9-_.:@#,/+ ]``; else raise ``error``. The client refuses
    any other name before it reaches the broker, so a job naming one could never be published."""
    name = _check_shortstr(value, what, error)
    if len(name) > MAX_EXCHANGE_CHARS:
        raise error(f"{what} is {len(name)} characters, over the client's {MAX_EXCHANGE_CHARS}: {preview(name)}")
    if not _EXCHANGE_NAME.fullmatch(name):
        raise error(f"{what} may hold only ASCII letters, digits, spaces and -_.:@#,/+: {preview(name)}")
    return name


def _check_table(table: Mapping[str, Any], where: str) -> None:
    """Raise PayloadError for JSON headers that an AMQP table cannot carry as they are: a name (at any
    depth) over 128 bytes of UTF-8, which the client would truncate, or an integer outside 64 bits."""
    for name, value in table.items():
        if not isinstance(name, str):
            raise PayloadError(f"{where} names must be strings, got {type(name).__name__}")
        if len(name) * 4 > MAX_HEADER_NAME_BYTES and len(name.encode("utf-8", "surrogatepass")) > MAX_HEADER_NAME_BYTES:
            raise PayloadError(
                f"{where} name {preview(name)} is over AMQP's {MAX_HEADER_NAME_BYTES}-byte limit for header names"
            )
        _check_value(value, f"{where}[{name!r}]")


def _check_value(value: Any, where: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise PayloadError(f"{where} is {value}, outside the signed 64-bit range an AMQP header can carry")
    elif isinstance(value, Mapping):
        _check_table(value, where)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]")


def _check_url(url: object) -> str:
    """``url`` with its scheme in lower case if it is an ``amqp://`` or ``amqps://`` URL (a scheme is
    case-insensitive); else ConfigurationError naming only the scheme: the URL may hold a password."""
    if not isinstance(url, str):
        raise ConfigurationError(f"the relay's url must be an amqp:// or amqps:// URL, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("amqp", "amqps"):
        got = f"scheme {scheme.lower()!r}" if sep and scheme.isalnum() else "no amqp:// scheme"
        raise ConfigurationError(f"the relay's url must be an amqp:// or amqps:// URL, got {got}")
    return f"{scheme.lower()}://{rest}"


def _read_job(payload: Mapping[str, Any], relay_exchange: str) -> tuple[str, str, bytes, str | None]:
    """The exchange, routing key, body and message id of a relay job; PayloadError (the job is dead at once)
    for a job that no retry could publish (one sent with ``app.send`` directly, or by older code)."""
    unknown = sorted(set(payload) - {"routing_key", "body", "exchange", "message_id"})
    if unknown:
        raise PayloadError(f"a {TASK_NAME} job takes routing_key, body, exchange and message_id; got also {unknown}")
    if "routing_key" not in payload:
        raise PayloadError(f"a {TASK_NAME} job needs a routing_key (send it with Relay.publish)")
    routing_key = _check_shortstr(payload["routing_key"], "routing_key")
    exchange = payload.get("exchange")
    exchange = relay_exchange if exchange is None else _check_exchange(exchange, "exchange")
    body = payload.get("body", {})
    if not isinstance(body, Mapping):
        raise PayloadError(f"a {TASK_NAME} job's body must be a JSON object, got {type(body).__name__}")
    message_id = payload.get("message_id")
    if message_id is not None:
        message_id = _check_shortstr(message_id, "message_id")
    encoded = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return exchange, routing_key, encoded, message_id


def _describe(exchange: str, routing_key: str) -> str:
    where = "the default exchange" if exchange == "" else f"exchange {exchange!r}"
    return f"{where}, routing key {routing_key!r}"


class _Link:
    """One event loop's connection to the broker and its confirm channel, opened on first use, dropped after an
    error (the next publish opens them again), closed when the loop shuts down."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.channel: aio_pika.abc.AbstractChannel | None = None
        #: Exchanges known to exist on this connection (see :meth:`Relay._exchange`).
        self.exchanges: set[str] = set()
        self.closer: AsyncIterator[None] | None = None
        #: Message ids being published on this connection: aio-pika matches a return (unroutable) to its publish
        #: by message id, so two publishes of one id at once could see each other's return.
        self.in_flight: set[str] = set()
        #: The last failed connection attempt: when it ended (the loop's clock) and its error. A slot that was
        #: waiting for the lock while it ran fails with it instead of starting an attempt of its own.
        self.failure: tuple[float, str] | None = None

    async def drop(self, channel: aio_pika.abc.AbstractChannel | None = None) -> None:
        """Close the connection (if ``channel`` is given: only if it is still the one in use, so that a slot
        whose publish failed does not close the connection another slot opened since)."""
        if channel is not None and channel is not self.channel:
            return
        connection, self.connection, self.channel = self.connection, None, None
        self.exchanges.clear()
        if connection is not None:
            await _close(connection)


async def _close(connection: aio_pika.abc.AbstractConnection) -> None:
    # A connection that fails to close (the broker is away) is gone all the same.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(connection.close(), _CLOSE_TIMEOUT)


async def _closer(link: _Link) -> AsyncIterator[None]:
    """An async generator held open for the life of the loop: asyncio closes it when the loop shuts down
    (``asyncio.run``, ``Worker.run_sync`` and the testing kit's ``drain`` all do), and closing it closes the
    connection. The worker has no stop hook for handlers; this needs none, and leaves no "Task was destroyed"
    or "Event loop is closed" noise behind."""
    try:
        yield
    finally:
        await link.drop()


class Relay:
    """Publishes the jobs of an outbox queue to RabbitMQ (see the module's docstring).

    ``url`` is the broker's (``amqp://user:password@host:5672/vhost``); ``exchange`` is the exchange a
    :meth:`publish` without one goes to (``""``: the default exchange, which routes by queue name);
    ``queue`` is the Conveyor queue of the relay's jobs; ``confirm_timeout`` bounds, in seconds, both the
    connection (a broker that refuses connections is tried again every 0.1-1 s within it) and the wait for the
    broker's confirm; ``task_options`` go to :meth:`App.task`
    (``max_attempts``, ``backoff``, ``visibility_timeout``...: how the relay retries a broker that refuses).
    Registers the task ``conveyor.relay`` on ``app`` (one Relay per App). Raises ConfigurationError for a bad
    option. Importing this module without aio-pika raises ImportError (``pip install 'conveyor[rabbitmq]'``)."""

    def __init__(
        self,
        app: App,
        url: str,
        *,
        exchange: str = "",
        queue: str = "outbox",
        confirm_timeout: float = 30.0,
        **task_options: Any,
    ) -> None:
        self.app = app
        self.url = _check_url(url)
        self.exchange = _check_exchange(exchange, "the relay's exchange", ConfigurationError)
        self.queue = check_name(queue, "the relay's queue", ConfigurationError)
        self.confirm_timeout = check_seconds(confirm_timeout, "confirm_timeout", ConfigurationError, strict=True)
        self._links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Link] = weakref.WeakKeyDictionary()
        if "name" in task_options or "queue" in task_options:
            raise ConfigurationError("the relay's task is named conveyor.relay and runs on the relay's queue")
        self.task = app.task(name=TASK_NAME, queue=self.queue, **task_options)(self._handle)

    def __repr__(self) -> str:
        return f"<Relay queue={self.queue} exchange={self.exchange!r}>"

    # -- producing -------------------------------------------------------------------------------

    def publish(
        self,
        routing_key: str,
        body: Mapping[str, Any],
        *,
        conn: Any = None,
        headers: Mapping[str, Any] | None = None,
        exchange: str | None = None,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        **envelope: Any,
    ) -> Job:
        """Enqueue ``body`` (a JSON object) for the broker, to ``exchange`` (default: the relay's) with
        ``routing_key``; return the job's handle. ``conn`` is your own open connection (psycopg, PyMySQL,
        sqlite3): the message then commits or rolls back with your transaction. ``headers`` become the AMQP
        message's headers (with the job's ``traceparent`` and ``correlation_id``); ``ordering_key`` publishes the
        messages of one key in order; ``envelope`` takes the other :class:`~conveyor.Message` fields
        (``priority``, ``delay``, ``max_attempts``...).

        Raises PayloadError, with nothing written, for what the broker would refuse later: a routing key or
        exchange that is not a string of at most 255 bytes of valid UTF-8, an exchange name the client cannot
        send (over 127 characters, or other than ASCII letters, digits, spaces and ``-_.:@#,/+``), a header
        name over 128 bytes or an integer outside 64 bits, and for anything :meth:`App.send` refuses (a body
        over the size limit)."""
        routing_key = _check_shortstr(routing_key, "routing_key")
        exchange = self.exchange if exchange is None else _check_exchange(exchange, "exchange")
        if not isinstance(body, Mapping):
            raise PayloadError(f"body must be a JSON object (a dict), got {type(body).__name__}")
        if "queue" in envelope or "task" in envelope:
            raise PayloadError(f"the relay's jobs go to its own queue ({self.queue!r}) and task: give no queue or task")
        if headers is not None:
            if not isinstance(headers, Mapping):
                raise PayloadError(f"headers must be a JSON object (a dict), got {type(headers).__name__}")
            _check_table(headers, "headers")
        if "id" in envelope:
            raise PayloadError("a relayed message's id is its job's, minted here: give no id")
        # The job's id is minted here and written into the payload as the message's id, so that a replay of
        # the dead letter (a new job) publishes the message with the id it was first published with.
        job_id = uuid7()
        payload = {"routing_key": routing_key, "body": body, "exchange": exchange, "message_id": str(job_id)}
        return self.app.send(
            TASK_NAME,
            payload,
            id=job_id,
            conn=conn,
            queue=self.queue,
            headers=headers,
            idempotency_key=idempotency_key,
            ordering_key=ordering_key,
            **envelope,
        )

    async def publish_async(
        self,
        routing_key: str,
        body: Mapping[str, Any],
        *,
        conn: Any = None,
        headers: Mapping[str, Any] | None = None,
        exchange: str | None = None,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        **envelope: Any,
    ) -> Job:
        """Like :meth:`publish`, without blocking the event loop."""
        return await asyncio.to_thread(
            lambda: self.publish(
                routing_key,
                body,
                conn=conn,
                headers=headers,
                exchange=exchange,
                idempotency_key=idempotency_key,
                ordering_key=ordering_key,
                **envelope,
            )
        )

    # -- relaying (the task's handler, run by a worker) ------------------------------------------

    async def _handle(self, ctx: JobContext, **payload: Any) -> None:
        """Publish one job's message and return once the broker confirmed it.

        A job that no retry could publish raises PayloadError (dead at once, saying what is wrong); whatever
        the broker or the network does raises RelayError (retried with backoff)."""
        exchange, routing_key, body, message_id = _read_job(payload, self.exchange)
        headers = ctx.headers
        _check_table(headers, "headers")
        message = aio_pika.Message(
            body,
            headers=headers,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            # The consumer's deduplication key: a message published again (a relay that died between the
            # broker's confirm and the job's ack, a replay of its dead letter) carries the same id.
            message_id=message_id if message_id is not None else str(ctx.job_id),
            timestamp=datetime.now(UTC),
        )
        link = self._link()
        channel = await self._channel(link)
        await self._publish(link, channel, exchange, routing_key, message)

    def _link(self) -> _Link:
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is None:
            link = self._links[loop] = _Link()
        return link

    async def _channel(self, link: _Link) -> aio_pika.abc.AbstractChannel:
        """The loop's confirm channel, opened (with its connection) if there is none or it was closed."""
        loop = asyncio.get_running_loop()
        asked = loop.time()
        async with link.lock:
            channel = link.channel
            if channel is not None and not channel.is_closed:
                return channel
            if link.failure is not None and link.failure[0] >= asked:
                # One attempt for every slot of the loop: the one that just failed was this slot's too.
                raise RelayError(link.failure[1])
            await link.drop()
            try:
                connection = await self._connect(loop)
            except RelayError as exc:
                link.failure = (loop.time(), str(exc))
                raise
            link.failure = None
            try:
                # on_return_raises: a message returned as unroutable (mandatory) fails its publish.
                channel = await asyncio.wait_for(
                    connection.channel(publisher_confirms=True, on_return_raises=True), self.confirm_timeout
                )
            except BaseException as exc:
                await _close(connection)
                if isinstance(exc, Exception):
                    raise RelayError(f"cannot open a channel on the broker: {_reason(exc)}") from exc
                raise
            link.connection, link.channel = connection, channel
            if link.closer is None:
                link.closer = _closer(link)
                await anext(link.closer)
            return channel

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> aio_pika.abc.AbstractConnection:
        """A connection to the broker, tried again while the broker refuses or drops it (it is restarting)
        until ``confirm_timeout`` has passed: an outage of seconds fails no attempt. A refused login, an
        unknown vhost and a broker that does not answer fail at once."""
        deadline = loop.time() + self.confirm_timeout
        pause = _CONNECT_PAUSE_FIRST
        tries = 0
        while True:
            tries += 1
            try:
                return await aio_pika.connect(self.url, timeout=max(deadline - loop.time(), 0.001))
            except asyncio.CancelledError:
                raise
            except TimeoutError as exc:
                raise RelayError(f"cannot connect to the broker: no answer within {self.confirm_timeout:g}s") from exc
            except Exception as exc:
                refused = isinstance(exc, ConnectionError) and not isinstance(
                    exc, aiormq.exceptions.ProbableAuthenticationError
                )
                if not refused or loop.time() + pause >= deadline:
                    during = f" ({tries} tries in {self.confirm_timeout:g}s)" if tries > 1 else ""
                    raise RelayError(f"cannot connect to the broker{during}: {_reason(exc)}") from exc
            await asyncio.sleep(pause)
            pause = min(pause * 2, _CONNECT_PAUSE_MAX)

    async def _exchange(
        self, link: _Link, channel: aio_pika.abc.AbstractChannel, name: str
    ) -> aio_pika.abc.AbstractExchange:
        """The exchange ``name``, checked to exist once per connection on a channel of its own: a publish to a
        missing exchange makes the broker close the channel, which would fail every other slot's publish on
        the shared one (one bad job must harm only itself)."""
        if name == "":
            return channel.default_exchange
        if name not in link.exchanges:
            connection = link.connection
            if connection is None:
                raise RelayError("the connection to the broker was closed")
            # Bounded as a publish is: a broker that takes the connection but answers nothing (a resource
            # alarm) must fail the attempt, not hold the job for ever.
            async with asyncio.timeout(self.confirm_timeout):
                probe = await connection.channel(publisher_confirms=False)
                try:
                    await probe.get_exchange(name, ensure=True)
                finally:
                    if not probe.is_closed:
                        await probe.close()
            link.exchanges.add(name)
        return await channel.get_exchange(name, ensure=False)

    async def _publish(
        self,
        link: _Link,
        channel: aio_pika.abc.AbstractChannel,
        exchange: str,
        routing_key: str,
        message: aio_pika.Message,
    ) -> None:
        where = _describe(exchange, routing_key)
        message_id = message.message_id or ""
        if message_id in link.in_flight:
            # A dead letter replayed twice, or a job sent by hand: one at a time, the other retries.
            raise RelayError(f"a message with id {message_id!r} is already in flight; retrying later ({where})")
        link.in_flight.add(message_id)
        try:
            await self._send(link, channel, exchange, routing_key, message, where)
        finally:
            link.in_flight.discard(message_id)

    async def _send(
        self,
        link: _Link,
        channel: aio_pika.abc.AbstractChannel,
        exchange: str,
        routing_key: str,
        message: aio_pika.Message,
        where: str,
    ) -> None:
        try:
            target = await self._exchange(link, channel, exchange)
            confirm = await target.publish(message, routing_key, mandatory=True, timeout=self.confirm_timeout)
        except asyncio.CancelledError:
            raise
        except aiormq.exceptions.PublishError as exc:
            # Returned (mandatory): no queue is bound for the key. The channel is fine; a binding added
            # later, or a replay once it is, publishes the message.
            raise RelayError(f"the broker returned the message as unroutable ({where}): {_reason(exc)}") from exc
        except aiormq.exceptions.DeliveryError as exc:
            raise RelayError(f"the broker nacked the message ({where}): {_reason(exc)}") from exc
        except aiormq.exceptions.ChannelClosed as exc:
            # A refusal (404 no exchange, 403 access refused) closes the channel it came on: the probe's, or the
            # shared one when the exchange was deleted since it was checked.
            if channel.is_closed:  # the shared one (the probe's needs nothing)
                await link.drop(channel)
            raise RelayError(f"the broker refused the message ({where}): {_reason(exc)}") from exc
        except TimeoutError as exc:
            # Not confirmed in time: the connection may be dead (a half-open socket); open another.
            await link.drop(channel)
            raise RelayError(
                f"the broker did not answer (confirm the message) within {self.confirm_timeout:g}s ({where})"
            ) from exc
        except Exception as exc:
            await link.drop(channel)
            raise RelayError(f"publishing failed ({where}): {_reason(exc)}") from exc
        if confirm is not None and not _acked(confirm):
            raise RelayError(f"the broker did not take the message ({where}): {confirm!r}")


def _acked(confirm: object) -> bool:
    """Whether a publish's confirm is the broker's ack (aio-pika raises for a nack and a return)."""
    return isinstance(confirm, commands.Basic.Ack)


def _reason(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"
