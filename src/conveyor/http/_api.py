"""The routes of ``conveyor serve``: a presenter over the producer API and ``app.admin``.

Each endpoint reads its request (``_parse``), checks the caller's token (``conveyor._tokens``, via
``app.admin.authenticate``), calls the one Python operation it stands for, and turns the result or
the exception into a response (:func:`error_response`). Blocking calls run in worker threads so that
the event loop keeps accepting requests; producers' single-job sends go through the group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

from conveyor import _tokens
from conveyor._alerting import AlertLoop, Webhooks
from conveyor._alerts import AlertRules
from conveyor._app import App
from conveyor._errors import (
    BackendCorrupt,
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    ConveyorError,
    Forbidden,
    IdempotencyConflict,
    LockWaitTimeout,
    NotFoundError,
    PayloadError,
    PayloadTooLarge,
    QueueFull,
    Unauthenticated,
    first_line,
)
from conveyor._idempotency import same_json
from conveyor._job import JobStatus
from conveyor._limits import check_name, check_seconds
from conveyor._message import TRACEPARENT, Message, new_traceparent
from conveyor._otel import first_task, send_span, valid_traceparent
from conveyor._scaling import MAX_PROCESSES, ScalingPolicy, parse_steps
from conveyor._topics import published
from conveyor.admin import QueueStats, Schedule, Token, WorkerInfo
from conveyor.http import _parse
from conveyor.http._dashboard import SESSION_COOKIE, Dashboard, register_convertors
from conveyor.http._group import GroupCommit
from conveyor.http._held import LOCK_WAIT, HeldWaits, KeyHeld
from conveyor.http._openapi import document
from conveyor.http._parse import BadRequest
from conveyor.worker._config import DEFAULT_CONCURRENCY

log = logging.getLogger("conveyor.http")

P = ParamSpec("P")
R = TypeVar("R")

#: Seconds a client is told to wait (Retry-After) when the database cannot be reached.
UNAVAILABLE_RETRY_AFTER = 2
#: The actor of audited actions when the service runs without auth.
NO_AUTH_ACTOR = "insecure-no-auth"
#: Most jobs in one batch request, ids in one replay or purge request.
MAX_BATCH = 1000
#: Seconds the service's own shutdown may take once uvicorn has stopped serving requests: the alert
#: loop's round, webhooks in flight, group commits under way (each given what is left of it), then
#: closing the pool. uvicorn's graceful wait for requests gets the rest of the 30 s (``_serve``):
#: this work comes after that wait, so a budget of its own kept a stop under 30 s.
SHUTDOWN_SECONDS = 6.0
MAX_IDS = 10_000
#: The query parameters of ``GET /v1/scaling``.
_SCALING_PARAMS = ("queues", "min", "max", "current", "concurrency", "target", "steps")
#: Most seconds a replay over HTTP may spend waiting between chunks to keep to its ``rate``: the
#: request and a server thread are held until the replay ends, and a stopping service gives the
#: requests under way 24 s (``_serve``). A slower replay is the CLI's (``conveyor dlq replay --rate``).
MAX_REPLAY_SECONDS = 20.0


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """How ``conveyor serve`` runs. ``auth`` False (``--insecure-no-auth``) lets anyone do anything;
    ``group_commit`` False gives every single-job request its own transaction (for comparison);
    ``token_cache`` is how many seconds a token read from the database is trusted (a revoke takes
    effect within it); ``max_body_bytes`` bounds a request body (413 past it)."""

    auth: bool = True
    group_commit: bool = True
    token_cache: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_group: int = 1000
    group_concurrency: int = 1
    #: Seconds between alert evaluations (0: no alert loop in this process).
    alert_interval: float = 15.0
    #: ``RULE[:QUEUE]=NUMBER`` or ``RULE=off`` (``conveyor._alerts.AlertRules.parse``).
    alerts: tuple[str, ...] = ()
    #: URLs every alert change is POSTed to.
    webhooks: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------------
# Responses
# ------------------------------------------------------------------------------------------------


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON response. ASCII-escaped, so that no text (a name quoting a lone surrogate) can fail
    to encode."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False, default=str)
    return Response(body, status, headers=dict(headers or {}), media_type="application/json")


def _held(message: Message | None, exc: KeyHeld) -> KeyHeld:
    """The answer to a send whose idempotency key (or job id) another transaction holds uncommitted
    (``message`` None: one of a batch's or a publish's jobs)."""
    if message is None:
        what = "an idempotency key (or job id) of this request's jobs"
    elif message.idempotency_key:
        what = f"idempotency key {message.idempotency_key!r:.80}"
    else:
        what = f"job id {message.id}"
    return KeyHeld(
        f"{what} is held by another transaction that has not committed yet (a transactional enqueue still "
        f"open); nothing was written: retry once it has ended ({exc})"
    )


def _error(status: int, code: str, message: str, field: str | None = None, **headers: str) -> Response:
    error: dict[str, Any] = {"status": status, "code": code, "message": message}
    if field is not None:
        error["field"] = field
    return json_response({"error": error}, status, headers={k.replace("_", "-"): v for k, v in headers.items()})


_ROUTING_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _routing_error(request: Request, exc: Exception) -> Response:
    """A path no route serves (404) or a method it does not take (405, with ``Allow``), in JSON as
    every error of this service (Starlette's own answer is plain text)."""
    assert isinstance(exc, HTTPException)
    code = _ROUTING_CODES.get(exc.status_code, "error")
    error = _error(exc.status_code, code, exc.detail)
    if exc.headers:
        error.headers.update(exc.headers)
    return error


def error_response(exc: Exception, prefix: str = "") -> Response:
    """The response for an exception the Python API raised: 400 naming the field, 401, 403, 404,
    413, 429 with Retry-After, 503 with Retry-After, 500 for a damaged database. Messages carry no
    token or password: the API's own messages never quote a secret, and a database URL is redacted
    by the backends."""
    message = first_line(exc)
    if isinstance(exc, BadRequest):
        return _error(400, "bad_request", message, exc.field)
    if isinstance(exc, Unauthenticated):
        return _error(401, "unauthenticated", message, www_authenticate='Bearer realm="conveyor"')
    if isinstance(exc, Forbidden):
        return _error(403, "forbidden", message)
    if isinstance(exc, NotFoundError):
        return _error(404, "not_found", message)
    if isinstance(exc, PayloadTooLarge):
        return _error(413, "too_large", message, _parse.field_of(message, prefix))
    if isinstance(exc, PayloadError | ConfigurationError):
        return _error(400, "bad_request", message, _parse.field_of(message, prefix))
    if isinstance(exc, QueueFull):
        seconds = str(max(1, math.ceil(exc.retry_after)))
        return _error(429, "queue_full", message, retry_after=seconds)
    if isinstance(exc, KeyHeld):  # as Stripe's idempotency_key_in_use and the IETF Idempotency-Key draft
        return _error(409, "key_in_use", message, retry_after=str(UNAVAILABLE_RETRY_AFTER))
    if isinstance(exc, BackendCorrupt):  # no retry helps: no Retry-After
        return _error(500, "database_damaged", message)
    if isinstance(exc, BackendUnavailable):
        return _error(503, "unavailable", message, retry_after=str(UNAVAILABLE_RETRY_AFTER))
    if isinstance(exc, BackendError):
        return _error(503, "database_error", message, retry_after=str(UNAVAILABLE_RETRY_AFTER))
    raise exc


def _status_json(status: JobStatus) -> dict[str, Any]:
    return status.to_json()


def _queue_json(q: QueueStats) -> dict[str, Any]:
    return {name: getattr(q, name) for name in q.__slots__}


def _schedule_json(s: Schedule) -> dict[str, Any]:
    return {
        "name": s.name,
        "cron": s.cron,
        "task": s.task,
        "queue": s.queue,
        "payload": json.loads(s.payload),
        "priority": s.priority,
        "paused": s.paused,
        "next_run_at": s.next_run_at.isoformat(),
        "last_run_at": s.last_run_at.isoformat() if s.last_run_at else None,
    }


def _token_json(t: Token) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "role": t.role,
        "queues": list(t.queues) if t.queues is not None else None,
        "created_at": t.created_at.isoformat(),
        "expires_at": t.expires_at.isoformat() if t.expires_at else None,
        "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
    }


# ------------------------------------------------------------------------------------------------
# The service
# ------------------------------------------------------------------------------------------------


class Service:
    """The HTTP face of one App: its routes, the caller's token, and the group commit."""

    def __init__(self, app: App, config: ServiceConfig) -> None:
        self.app = app
        self.config = config
        self.group: GroupCommit[Any] | None = None
        #: The inserts waiting on their own for a key another transaction holds (see conveyor.http._held).
        self.held = HeldWaits()
        #: The /metrics registry and its DatabaseCollector, made at the first scrape (prometheus_client is
        #: imported then).
        self.registry: Any = None
        self.collector: Any = None
        self._anonymous = Token(NO_AUTH_ACTOR, NO_AUTH_ACTOR, "admin", None, "", datetime.now(UTC))

    # -- plumbing ----------------------------------------------------------------------------------

    @staticmethod
    async def run(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a blocking call of the Python API in a worker thread."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def insert(self, jobs: list[Any], strict_keys: bool = False) -> list[UUID]:
        """Insert prepared jobs in one transaction, outside the group commit (a batch, a publish,
        ``--no-group-commit``): a key another transaction holds is waited for on its own, as in a group
        (:mod:`conveyor.http._held`), so that it holds up none of the threads the other requests use."""
        insert = self.app.producer.insert_prepared
        try:
            return await self.run(insert, jobs, strict_keys=strict_keys, lock_wait=LOCK_WAIT)
        except LockWaitTimeout as exc:
            return await self.held.run(lambda wait: insert(jobs, strict_keys=strict_keys, lock_wait=wait), exc)

    async def token(
        self, request: Request, last_known_if_unavailable: bool = False, within: float | None = None
    ) -> Token:
        """The caller's token; raises Unauthenticated. Without auth, an anonymous admin.

        A GET without an ``Authorization`` header may present the dashboard's session cookie (the
        dashboard's charts poll ``GET /v1/queues`` with it); a request that changes something always
        needs the header, so that a cookie a browser sends on its own can never act (no CSRF).
        ``last_known_if_unavailable``: see :meth:`Admin.authenticate`; with it, ``within`` is how many
        seconds the database may take to answer before the last verdict decides (0: do not ask it)."""
        authorization = request.headers.get("authorization", "")
        if not authorization and request.method == "GET":
            session = request.cookies.get(SESSION_COOKIE)
            if session:
                authorization = f"Bearer {session}"
        return await self.token_of(authorization, last_known_if_unavailable, within)

    async def token_of(
        self, authorization: str, last_known_if_unavailable: bool = False, within: float | None = None
    ) -> Token:
        """The token an ``Authorization`` header presents (see :meth:`token`)."""
        if not self.config.auth:
            return self._anonymous
        scheme, _, bearer = authorization.partition(" ")
        bearer = bearer.strip()
        if scheme.lower() != "bearer" or not bearer:
            raise Unauthenticated("a bearer token is required (Authorization: Bearer cvy_...)", "missing")
        admin = self.app.admin
        cached = admin.authenticate_cached(bearer, max_age=self.config.token_cache)
        if cached is not None:
            return cached

        def read() -> Awaitable[Token]:
            return self.run(
                admin.authenticate,
                bearer,
                max_age=self.config.token_cache,
                last_known_if_unavailable=last_known_if_unavailable,
            )

        if not last_known_if_unavailable or within is None:
            return await read()
        with contextlib.suppress(TimeoutError):
            if within > 0:
                return await asyncio.wait_for(read(), within)
        # The database did not answer (or its last read is stuck): it is away, and the last verdict decides.
        last = admin.authenticate_cached(bearer, max_age=math.inf)
        if last is None:
            raise BackendUnavailable(f"the database did not answer within {within:g}s")
        return last

    async def body(self, request: Request) -> Any:
        """The request body as strict JSON, at most ``max_body_bytes`` (else PayloadTooLarge)."""
        return await self.body_of(request.headers.get("content-length", ""), request.stream())

    async def body_of(self, declared: str, chunks: AsyncIterator[bytes]) -> Any:
        """The body that ``chunks`` stream, as strict JSON (see :meth:`body`)."""
        limit = self.config.max_body_bytes
        if declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"the body is {int(declared)} bytes, over the {limit}-byte limit of a request")
        parts: list[bytes] = []
        size = 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"the body is over the {limit}-byte limit of a request")
            parts.append(chunk)
        return _parse.loads(b"".join(parts))

    def actor(self, token: Token) -> str:
        """Who an action is audited as: the token's name."""
        return token.name

    # -- health ------------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        """The process answers."""
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """The database answers and its schema is current."""
        try:
            pending = await self.run(self.app.admin.ready)
        except BackendCorrupt as exc:
            return error_response(exc)
        except BackendError as exc:
            return _error(503, "unavailable", first_line(exc), retry_after=str(UNAVAILABLE_RETRY_AFTER))
        if pending:
            return _error(
                503,
                "not_migrated",
                f"the database lacks migrations {', '.join(pending)}: run `conveyor migrate`",
                retry_after=str(UNAVAILABLE_RETRY_AFTER),
            )
        return json_response({"status": "ready"})

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document of this service."""
        return json_response(document(auth=self.config.auth))

    # -- producer ----------------------------------------------------------------------------------

    def _headers_of(self, fields: Mapping[str, Any], token: Token, prefix: str = "") -> dict[str, Any] | None:
        headers = fields.get("headers")
        if headers is not None and not isinstance(headers, dict):
            raise BadRequest(f"{prefix}headers must be a JSON object", f"{prefix}headers")
        if not self.config.auth:
            return headers
        return _tokens.stamp(headers, token)

    async def send(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/queues/{queue}/jobs: enqueue one job; 202 once it is committed.

        The hot path of the service, so a plain ASGI handler: Starlette's routing, request and
        response objects cost about as much as the rest of the request (see docs/http.md)."""
        headers = {k: v for k, v in scope["headers"] if k in _SEND_HEADERS}
        try:
            body, status, extra = await self._send(scope, receive, headers)
        except IdempotencyConflict as exc:
            await _error(409, "conflict", str(exc))(scope, receive, send)
            return
        except ConveyorError as exc:  # KeyHeld among them: 409 key_in_use with Retry-After
            await error_response(exc)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status, "headers": [_JSON_TYPE, *extra]})
        await send({"type": "http.response.body", "body": body})

    async def _send(
        self, scope: Scope, receive: Receive, headers: Mapping[bytes, bytes]
    ) -> tuple[bytes, int, list[tuple[bytes, bytes]]]:
        token = await self.token_of(headers.get(b"authorization", b"").decode("latin-1"))
        queue = check_name(scope["path"][len("/v1/queues/") : -len("/jobs")], "queue")
        _tokens.require(token, "producer", queue)
        fields = _parse.obj(await self.body_of(headers.get(b"content-length", b"").decode("latin-1"), _chunks(receive)))
        key = headers.get(b"idempotency-key")
        message = _parse.message(
            fields,
            queue=queue,
            idempotency_key=_parse.header_text(key, "idempotency_key") if key is not None else None,
            headers=self._headers_of(fields, token),
        )
        with send_span(message.task, queue, 1, valid_traceparent(headers.get(b"traceparent"))) as traceparent:
            job = self.app.producer.prepare(message, traceparent=traceparent)
            if self.app.queue_options(queue).max_depth is not None:
                await self.run(self.app.producer.admit, [job])
            try:
                stored = await self.group.submit(job) if self.group is not None else (await self.insert([job]))[0]
            except KeyHeld as exc:
                raise _held(message, exc) from exc
        duplicate = stored != message.id
        if duplicate:
            await self._check_same(stored, message, job.payload)
        name = json.dumps(queue, ensure_ascii=True)
        body = f'{{"id":"{stored}","queue":{name},"duplicate":{"true" if duplicate else "false"}}}'
        return body.encode("ascii"), 202, [(b"location", f"/v1/jobs/{stored}".encode("ascii"))]

    async def _check_same(self, stored: UUID, message: Message, payload: str) -> None:
        """Raise 409 if the job holding the idempotency key is not this request's job (another
        task, or another payload: ``payload`` is this request's, encoded)."""
        existing = await self.run(self.app.job, stored)
        if existing.task != message.task or not same_json(existing.payload, json.loads(payload)):
            raise IdempotencyConflict(
                f"idempotency key {message.idempotency_key!r:.80} is held by job {stored} with a different "
                "task or payload; use a new key for a new job"
            )

    async def send_batch(self, request: Request) -> Response:
        """POST /v1/queues/{queue}/jobs:batch: enqueue up to 1,000 jobs in one transaction (all or none)."""
        token = await self.token(request)
        queue = check_name(request.path_params["queue"], "queue")
        _tokens.require(token, "producer", queue)
        if "idempotency-key" in request.headers:
            # It was ignored: a client retrying the batch under the header's protection enqueued every job again.
            raise BadRequest(
                "the Idempotency-Key header names one job: give each job of a batch its own idempotency_key",
                "Idempotency-Key",
            )
        fields = _parse.obj(await self.body(request))
        unknown = [k for k in fields if k != "jobs"]
        if unknown:
            raise BadRequest(f"unknown field {unknown[0]!r:.60}; a batch has: jobs", unknown[0][:200])
        items = fields.get("jobs")
        if not isinstance(items, list) or not items or len(items) > MAX_BATCH:
            raise BadRequest(f"jobs must be an array of 1 to {MAX_BATCH} jobs", "jobs")
        messages: list[Message] = []
        for i, item in enumerate(items):
            prefix = f"jobs[{i}]."
            try:
                body = _parse.obj(item, f"jobs[{i}]")
                message = _parse.message(
                    body, queue=queue, prefix=prefix, headers=self._headers_of(body, token, prefix)
                )
            except (PayloadError, ConfigurationError) as exc:
                return error_response(exc, prefix)
            messages.append(message)
        parent = valid_traceparent(request.headers.get("traceparent"))
        with send_span(first_task([m.task for m in messages]), queue, len(messages), parent) as traceparent:
            # One request is one send: its jobs share one trace context, a fresh one if none came.
            shared = traceparent or new_traceparent()
            jobs = []
            for i, message in enumerate(messages):
                try:
                    jobs.append(self.app.producer.prepare(message, traceparent=shared))
                except (PayloadError, ConfigurationError) as exc:
                    return error_response(exc, f"jobs[{i}].")
            if self.app.queue_options(queue).max_depth is not None:
                await self.run(self.app.producer.admit, jobs)  # one verdict, as a Python send_many gets
            # strict_keys: a key held by another payload is refused inside the insert's transaction,
            # so that a 409 leaves no job of the batch stored (a client retrying it would send them twice).
            try:
                stored = await self.insert(jobs, strict_keys=True)
            except KeyHeld as exc:
                raise _held(None, exc) from exc
        return json_response(
            {"jobs": [{"id": str(j), "duplicate": j != m.id} for j, m in zip(stored, messages, strict=True)]},
            202,
        )

    async def job(self, request: Request) -> Response:
        """GET /v1/jobs/{id}: a job's state, attempts, result or error."""
        token = await self.token(request)
        job_id = _parse.uuid_of(request.path_params["id"], "id")
        status = await self.run(self.app.admin.job, job_id)
        if self.config.auth and not _tokens.may_read(token, status.queue, status.headers):
            # 404, not 403: a token must not learn which ids exist outside what it may read.
            raise NotFoundError(f"no job {job_id}")
        return json_response(_status_json(status))

    async def publish(self, request: Request) -> Response:
        """POST /v1/topics/{topic}/messages: one job per matching subscription, in one transaction."""
        token = await self.token(request)
        topic = check_name(request.path_params["topic"], "topic")
        # A topic's subscriptions span queues: a token limited to queues cannot publish.
        _tokens.require(token, "producer", None)
        fields = _parse.obj(await self.body(request))
        raw_key = request.headers.get("idempotency-key")
        # Starlette decodes a header as Latin-1: its bytes back, then read as the client wrote them.
        key = _parse.header_text(raw_key.encode("latin-1"), "idempotency_key") if raw_key is not None else None
        envelope = _parse.fields(
            fields, allowed=_parse.PUBLISH_FIELDS, idempotency_key=key, headers=self._headers_of(fields, token)
        )
        payload = envelope.pop("payload", {})
        headers = envelope.pop("headers", None)
        parent = valid_traceparent(request.headers.get("traceparent"))
        if parent is not None:
            # The caller's trace context is a header of the message, as if given in its headers (whose own
            # traceparent wins): subscription filters see it as they see App.publish(headers=...)'s, and
            # the jobs carry it.
            headers = {TRACEPARENT: parent, **(headers or {})}
        subscriptions, prepare = self.app.admin.subscriptions, self.app.producer.prepare
        messages = await self.run(published, topic, payload, headers, envelope, subscriptions, prepare)
        if not messages:
            return json_response({"jobs": []}, 202)
        # Sent as a batch is (App.publish's messages, one transaction), with strict_keys: an idempotency
        # key held by another payload is a 409 with nothing stored, as for a send (before, the holder's
        # id was answered with 202 and the new payload dropped).
        queues = {m.queue for m in messages}
        queue = next(iter(queues)) if len(queues) == 1 else None
        with send_span(first_task([m.task for m in messages]), queue, len(messages), parent) as traceparent:
            shared = traceparent or new_traceparent()
            # On a thread, not the event loop: a publish encodes its payload once per subscription, so a body
            # within the size limit costs what a batch of thousands would (1,000 subscriptions of a 200 KB payload
            # held every other request up for 0.7 s).
            prepare = self.app.producer.prepare
            jobs = await self.run(lambda: [prepare(message, traceparent=shared) for message in messages])
            if any(self.app.queue_options(job.queue).max_depth is not None for job in jobs):
                await self.run(self.app.producer.admit, jobs)  # one verdict for the copies, as App.publish gets
            try:
                stored = await self.insert(jobs, strict_keys=True)
            except KeyHeld as exc:
                raise _held(None, exc) from exc
        return json_response({"jobs": [str(j) for j in stored]}, 202)

    # -- operator ----------------------------------------------------------------------------------

    async def queues(self, request: Request) -> Response:
        """GET /v1/queues: counts per queue (a token limited to queues sees those)."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        rows = await self.run(self.app.admin.queues)
        return json_response({"queues": [_queue_json(q) for q in rows if _tokens.allows(token, "operator", q.queue)]})

    async def workers(self, request: Request) -> Response:
        """GET /v1/workers (also /api/workers): worker processes with their in-flight job ids (a
        token limited to queues sees the workers that drain one of them)."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        return json_response({"workers": [w.to_json() for w in await self.visible_workers(token)]})

    async def visible_workers(self, token: Token) -> list[WorkerInfo]:
        """The workers ``token`` may see: every one for a token of all queues; for a token limited to
        queues, those draining one of them (or every queue), each showing only those queues and the jobs
        it holds of them: the other queues' names and job ids are not the token's to read."""
        rows = await self.run(self.app.admin.workers)
        if token.queues is None:
            return rows
        visible: list[WorkerInfo] = []
        for w in rows:
            queues = tuple(q for q in w.queues if _tokens.allows(token, "operator", q))
            if w.queues and not queues:
                continue
            held: list[UUID] = []
            # One read per held job, for scoped tokens only: the registry keeps job ids, not their queues.
            for job_id in w.in_flight:
                try:
                    status = await self.run(self.app.admin.job, job_id)
                except NotFoundError:  # finished since
                    continue
                if _tokens.allows(token, "operator", status.queue):
                    held.append(job_id)
            visible.append(dataclasses.replace(w, queues=queues, in_flight=tuple(held)))
        return visible

    async def scaling(self, request: Request) -> Response:
        """GET /v1/scaling: the worker processes the load of ``queues`` asks for now under the policy the
        parameters give (``min``, ``max``, ``current``, ``concurrency``, ``target`` or ``steps``): the
        recommendation for an external autoscaler. Stateless: no cool-downs (the autoscaler has its own)."""
        token = await self.token(request)
        params = request.query_params
        unknown = sorted(set(params) - set(_SCALING_PARAMS))
        if unknown:
            raise BadRequest(f"unknown parameter {unknown[0]!r:.60}; /v1/scaling takes {', '.join(_SCALING_PARAMS)}")
        text = _parse.str_param(params, "queues")
        queues = [check_name(q.strip(), "queues") for q in text.split(",")] if text is not None else None
        if queues is not None:
            for queue in queues:
                _tokens.require(token, "operator", queue)
        else:
            _tokens.require(token, "operator", None)
        maximum = _parse.int_param(params, "max", -1, 1, MAX_PROCESSES)
        if maximum < 0:
            raise BadRequest("max is required: the most processes (1 to 256)", "max")
        try:
            policy = ScalingPolicy(
                _parse.int_param(params, "min", 1, 1, MAX_PROCESSES),
                maximum,
                target=_parse.float_param(params, "target"),
                steps=parse_steps(params["steps"]) if params.get("steps") is not None else (),
            )
        except ConfigurationError as exc:
            raise BadRequest(first_line(exc)) from None
        decision = await self.run(
            self.app.admin.scaling,
            policy,
            queues=queues,
            current=_parse.int_param(params, "current", policy.minimum, 0, MAX_PROCESSES),
            concurrency=_parse.int_param(params, "concurrency", DEFAULT_CONCURRENCY, 1, 10_000),
        )
        return json_response(decision.to_json())

    async def alerts(self, request: Request) -> Response:
        """GET /v1/alerts (also /api/alerts): alert states, firing and resolved (a token limited to
        queues sees theirs and the database-wide ones)."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        rows = await self.run(self.app.admin.alerts)
        visible = [a for a in rows if a.queue is None or _tokens.allows(token, "operator", a.queue)]
        return json_response({"alerts": [a.to_json() for a in visible]})

    async def metrics(self, request: Request) -> Response:
        """GET /metrics: Prometheus text format, read from the database at each scrape (operator).

        While the database is away, a token is judged as it was last read (else no scrape could
        answer ``conveyor_database_up 0``, the alert documented in docs/observability.md). A database
        that does not answer is away too: the token read is waited for as long as the collector's read
        (``conveyor.metrics.SCRAPE_TIMEOUT``), and not at all while the collector's last read is stuck, so
        that a scrape answers within Prometheus's default scrape timeout."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        from conveyor.metrics import DatabaseCollector, database_registry

        if self.registry is None:
            self.collector = DatabaseCollector(self.app.admin)
            self.registry = database_registry(self.app.admin, self.collector)
        within = 0.0 if self.collector.stalled else self.collector.timeout
        token = await self.token(request, last_known_if_unavailable=True, within=within)
        _tokens.require(token, "operator", None)
        body = await self.run(generate_latest, self.registry)
        return Response(body, 200, media_type=CONTENT_TYPE_LATEST)

    async def dead_letters(self, request: Request) -> Response:
        """GET /v1/dead-letters: unreplayed dead letters, newest first, a page at a time."""
        token = await self.token(request)
        params = request.query_params
        queue = _parse.str_param(params, "queue")
        _tokens.require(token, "operator", queue)
        limit = _parse.int_param(params, "limit", 100, 1, 1000)
        before_text = _parse.str_param(params, "before")
        before = _parse.parse_cursor(before_text) if before_text else None
        rows = await self.run(
            self.app.admin.dead_letters,
            queue=queue,
            task=_parse.str_param(params, "task"),
            error_type=_parse.str_param(params, "error_type"),
            limit=limit,
            before=before,
        )
        last = rows[-1] if len(rows) == limit else None
        following = _parse.cursor((last.finished_at, last.id)) if last and last.finished_at else None
        return json_response({"dead_letters": [r.dead_letter_json() for r in rows], "next_before": following})

    async def dead_letter(self, request: Request) -> Response:
        """GET /v1/dead-letters/{id}: one dead letter in full."""
        token = await self.token(request)
        job_id = _parse.uuid_of(request.path_params["id"], "id")
        _tokens.require_role(token, "operator")
        status = await self.run(self.app.admin.dead_letter, job_id)
        if not _tokens.allows(token, "operator", status.queue):
            raise NotFoundError(f"no dead letter {job_id}")
        return json_response(_status_json(status))

    async def _selection(self, token: Token, fields: Mapping[str, Any], role: _tokens.Role) -> _Selection:
        """The selection of a replay or purge body: ``ids``, or ``queue`` (with ``task`` and
        ``error_type``); checked against the token's role and queues.

        An id of a dead letter outside the token's queues is left out of the action and answered as
        an unknown id is (skipped, or counted as selected and not purged): a 403 naming its queue
        told the token that the id exists, which ``GET`` of that id (404) does not."""
        allowed = ("ids", "queue", "task", "error_type", "reason", "rate")
        for name in fields:
            if name not in allowed or (name == "rate" and role == "admin"):
                raise BadRequest(f"unknown field {name!r:.60}", name[:200])
        ids = fields.get("ids")
        filters = {name: fields.get(name) for name in ("queue", "task", "error_type")}
        for name, value in filters.items():
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"{name} must be a string", name)
        if not isinstance(fields.get("reason"), str):
            raise BadRequest("reason is required: why (it is kept in the audit log)", "reason")
        if ids is not None:
            if not isinstance(ids, list) or not ids or len(ids) > MAX_IDS:
                raise BadRequest(f"ids must be an array of 1 to {MAX_IDS} job ids", "ids")
            parsed = [_parse.uuid_of(i, f"ids[{n}]") if isinstance(i, str) else _bad_id(n) for n, i in enumerate(ids)]
            if any(v is not None for v in filters.values()):
                raise BadRequest("give ids or a filter (queue, task, error_type), not both", "ids")
            hidden: set[UUID] = set()
            if token.queues is not None:
                _tokens.require_role(token, role)
                for job_id in dict.fromkeys(parsed):
                    try:
                        status = await self.run(self.app.admin.dead_letter, job_id)
                    except NotFoundError:
                        continue
                    if not _tokens.allows(token, role, status.queue):
                        hidden.add(job_id)
            else:
                _tokens.require(token, role, None)
            return _Selection({"ids": [i for i in parsed if i not in hidden]}, parsed, hidden)
        if filters["queue"] is None:
            raise BadRequest("give ids, or a queue (with task and error_type to narrow it)", "queue")
        _tokens.require(token, role, filters["queue"])
        return _Selection({"ids": None, **filters}, [], set())

    async def replay(self, request: Request) -> Response:
        """POST /v1/dead-letters:replay: re-enqueue dead letters (audited with the token's name)."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        fields = _parse.obj(await self.body(request))
        selected = await self._selection(token, fields, "operator")
        try:
            # The operator API checks the rate (its type too) before anything is written.
            result = await self.run(
                self.app.admin.replay,
                **selected.kwargs,
                reason=fields["reason"],
                actor=self.actor(token),
                rate=fields.get("rate"),
                max_seconds=MAX_REPLAY_SECONDS,
            )
        except ConfigurationError as exc:
            if str(exc).startswith("rate "):
                raise BadRequest(str(exc), "rate") from None
            raise
        skipped = result.skipped
        if selected.hidden:
            # In the order asked, as the operator API orders its own skipped ids.
            left_out = selected.hidden.union(skipped)
            skipped = [i for i in dict.fromkeys(selected.asked) if i in left_out]
        return json_response(
            {
                "replayed": [{"dead_id": str(d), "new_id": str(n)} for d, n in result.replayed],
                "skipped": [str(s) for s in skipped],
            }
        )

    async def purge(self, request: Request) -> Response:
        """POST /v1/dead-letters:purge: delete dead letters for good (admin; audited)."""
        token = await self.token(request)
        _tokens.require_role(token, "admin")
        fields = _parse.obj(await self.body(request))
        selected = await self._selection(token, fields, "admin")
        result = await self.run(
            self.app.admin.purge, **selected.kwargs, reason=fields["reason"], actor=self.actor(token)
        )
        # An id left out as outside the token's queues counts as selected, as an unknown id does.
        hidden = len(selected.hidden)
        return json_response({"purged": result.purged, "selected": result.selected + hidden})

    async def audit(self, request: Request) -> Response:
        """GET /v1/audit: operator actions, newest first (``?job=ID``: those naming that job)."""
        token = await self.token(request)
        _tokens.require(token, "operator", None)
        limit = _parse.int_param(request.query_params, "limit", 100, 1, 10_000)
        job = _parse.str_param(request.query_params, "job")
        entries = await self.run(self.app.admin.audit, limit, job=None if job is None else _parse.uuid_of(job, "job"))
        return json_response({"audit": [e.to_json() for e in entries]})

    async def schedules(self, request: Request) -> Response:
        """GET /v1/schedules: every schedule (of the token's queues) with its next tick."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        rows = await self.run(self.app.admin.schedules)
        visible = [s for s in rows if _tokens.allows(token, "operator", s.queue)]
        return json_response({"schedules": [_schedule_json(s) for s in visible]})

    async def schedule_action(self, request: Request) -> Response:
        """POST /v1/schedules/{name}:pause and :resume (audited)."""
        token = await self.token(request)
        name = check_name(request.path_params["name"], "schedule name")
        action = request.path_params["action"]
        _tokens.require_role(token, "operator")
        if token.queues is not None:
            found = next((s for s in await self.run(self.app.admin.schedules) if s.name == name), None)
            if found is None or not _tokens.allows(token, "operator", found.queue):
                raise NotFoundError(f"no schedule named {name!r}")
        change = self.app.admin.pause_schedule if action == "pause" else self.app.admin.resume_schedule
        schedule = await self.run(change, name, actor=self.actor(token))
        return json_response(_schedule_json(schedule))

    # -- admin -------------------------------------------------------------------------------------

    async def tokens(self, request: Request) -> Response:
        """GET /v1/tokens: every token (never a secret)."""
        token = await self.token(request)
        _tokens.require(token, "admin", None)
        rows = await self.run(self.app.admin.tokens)
        return json_response({"tokens": [_token_json(t) for t in rows]})

    async def create_token(self, request: Request) -> Response:
        """POST /v1/tokens: make a token; its bearer string is in this response only."""
        token = await self.token(request)
        _tokens.require(token, "admin", None)
        fields = _parse.obj(await self.body(request))
        for key in fields:
            if key not in ("name", "role", "queues", "expires_in"):
                raise BadRequest(f"unknown field {key!r:.60}; a token has: name, role, queues, expires_in", key[:200])
        queues = fields.get("queues")
        if queues is not None and (not isinstance(queues, list) or not all(isinstance(q, str) for q in queues)):
            raise BadRequest("queues must be an array of queue names", "queues")
        expires_in = fields.get("expires_in")
        expires_at = None
        if expires_in is not None:
            if isinstance(expires_in, bool) or not isinstance(expires_in, int | float) or not 0 < expires_in <= 3.2e9:
                raise BadRequest("expires_in must be a positive number of seconds (at most 100 years)", "expires_in")
            expires_at = self.app.clock() + timedelta(seconds=expires_in)
        name, role = fields.get("name"), fields.get("role")
        if not isinstance(name, str):
            raise BadRequest("name is required (a string)", "name")
        if not isinstance(role, str):
            raise BadRequest("role is required: producer, operator or admin", "role")
        made, bearer = await self.run(
            self.app.admin.create_token, name, role, queues=queues, expires_at=expires_at, actor=self.actor(token)
        )
        return json_response({**_token_json(made), "token": bearer}, 201)

    async def revoke_token(self, request: Request) -> Response:
        """DELETE /v1/tokens/{name}: revoke a token for good (audited)."""
        token = await self.token(request)
        _tokens.require(token, "admin", None)
        await self.run(self.app.admin.revoke_token, request.path_params["name"], actor=self.actor(token))
        return Response(status_code=204)


_SEND_HEADERS = frozenset((b"authorization", b"content-length", b"idempotency-key", b"traceparent"))
_JSON_TYPE = (b"content-type", b"application/json")


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    """The chunks of a request body, as the ASGI server hands them over."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("the client went away before sending the whole body")
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


@dataclass(frozen=True, slots=True)
class _Selection:
    """What a replay or purge body selects: the operator API's arguments (``kwargs``), the ids asked
    for in order (``asked``, empty for a filter), and those left out as outside the token's queues."""

    kwargs: dict[str, Any]
    asked: list[UUID]
    hidden: set[UUID]


def _bad_id(n: int) -> UUID:
    raise BadRequest(f"ids[{n}] must be a job id (a string)", f"ids[{n}]")


Endpoint = Callable[[Request], Awaitable[Response]]


class _Asgi:
    """A plain ASGI handler as a route's endpoint (Starlette calls a function or method with a Request)."""

    def __init__(self, handler: ASGIApp) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


def _answering(endpoint: Endpoint) -> Endpoint:
    """Wrap an endpoint so that every error the Python API raises becomes its status code."""

    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except IdempotencyConflict as exc:
            return _error(409, "conflict", str(exc))
        except ConveyorError as exc:
            return error_response(exc)

    answer.__doc__ = endpoint.__doc__
    return answer


def routes(service: Service) -> list[Route]:
    """The service's routes; see the OpenAPI document (``conveyor.http._openapi``)."""
    s = service

    def r(path: str, endpoint: Endpoint, methods: Sequence[str]) -> Route:
        return Route(path, _answering(endpoint), methods=list(methods))

    return [
        r("/healthz", s.healthz, ["GET"]),
        r("/readyz", s.readyz, ["GET"]),
        r("/openapi.json", s.openapi, ["GET"]),
        r("/metrics", s.metrics, ["GET"]),
        r("/v1/queues", s.queues, ["GET"]),
        r("/v1/workers", s.workers, ["GET"]),
        r("/v1/alerts", s.alerts, ["GET"]),
        r("/v1/scaling", s.scaling, ["GET"]),
        # The dashboard's names for the same two reads.
        r("/api/workers", s.workers, ["GET"]),
        r("/api/alerts", s.alerts, ["GET"]),
        # {queue:path}, {topic:path}, {name:path}: a name may hold a '/' ("orders/eu"), which uvicorn has decoded
        # from %2F before routing, so "a%2Fb" and "a/b" are one name. The name runs to the route's literal end
        # ("/jobs", ":pause"; the last one, as the match is anchored) or to the end of the path.
        # Single-job sends are answered before Starlette (create_app); this route is what answers a
        # method they do not take with 405 and ``Allow``, as every other route does (it was a 404).
        Route("/v1/queues/{queue:path}/jobs", _Asgi(s.send), methods=["POST"]),
        r("/v1/queues/{queue:path}/jobs:batch", s.send_batch, ["POST"]),
        r("/v1/jobs/{id}", s.job, ["GET"]),
        r("/v1/topics/{topic:path}/messages", s.publish, ["POST"]),
        r("/v1/dead-letters", s.dead_letters, ["GET"]),
        r("/v1/dead-letters:replay", s.replay, ["POST"]),
        r("/v1/dead-letters:purge", s.purge, ["POST"]),
        r("/v1/dead-letters/{id}", s.dead_letter, ["GET"]),
        r("/v1/audit", s.audit, ["GET"]),
        r("/v1/schedules", s.schedules, ["GET"]),
        r("/v1/schedules/{name:path}:{action:pause_or_resume}", s.schedule_action, ["POST"]),
        r("/v1/tokens", s.tokens, ["GET"]),
        r("/v1/tokens", s.create_token, ["POST"]),
        r("/v1/tokens/{name:path}", s.revoke_token, ["DELETE"]),
    ]


def create_app(app: App, config: ServiceConfig | None = None) -> ASGIApp:
    """The ASGI application of ``conveyor serve`` for ``app`` (run it under uvicorn).

    It opens the database when it starts (and migrates the embedded SQLite default, as the App
    does), runs the group commit on its event loop, and waits for the transactions under way
    when it stops."""
    config = config or ServiceConfig()
    service = Service(app, config)

    alert_loop = _alert_loop(app, config)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        if config.group_commit:
            service.group = GroupCommit(
                lambda jobs, lock_wait: app.producer.insert_prepared(jobs, lock_wait=lock_wait),
                max_group=config.max_group,
                concurrency=config.group_concurrency,
                held=service.held,
                key_of=lambda job: (job.queue, job.idempotency_key) if job.idempotency_key is not None else None,
            )
        alerting = asyncio.create_task(alert_loop.run(), name="alerts") if alert_loop is not None else None
        try:
            yield
        finally:
            loop = asyncio.get_running_loop()
            # Two seconds of the budget are kept for closing the pool.
            deadline = loop.time() + SHUTDOWN_SECONDS - 2.0

            def left() -> float:
                return max(0.0, deadline - loop.time())

            if alert_loop is not None and alerting is not None:
                alert_loop.stop()
                await asyncio.wait({alerting}, timeout=left())
                if alert_loop.webhooks is not None:
                    await alert_loop.webhooks.drain(timeout=left())
            if service.group is not None:
                # A request gets its 202 only after its commit, so a commit not waited for here
                # answered nobody: cutting the wait short loses no acknowledged job.
                await asyncio.wait({asyncio.ensure_future(service.group.drain())}, timeout=left())
            service.held.close()
            await asyncio.to_thread(app.close)

    _register_convertor()
    register_convertors()
    dashboard = Dashboard(service)
    starlette = Starlette(
        routes=[*routes(service), *dashboard.routes()],
        lifespan=lifespan,
        exception_handlers={HTTPException: _routing_error},
    )

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await starlette(scope, receive, send)
            return
        started = False

        async def sending(message: ASGIMessage) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            # Single-job sends skip Starlette (see Service.send); everything else is routed by it.
            path: str = scope["path"]
            undecodable = _parse.undecodable_url(path, scope.get("raw_path") or b"", scope.get("query_string", b""))
            if not config.auth and scope["method"] not in ("GET", "HEAD") and path.startswith("/v1/"):
                foreign = _foreign_origin(scope)
                if foreign is not None:
                    message = f"a request from a page of another site ({foreign[:100]}) may not change anything here"
                    await _error(403, "forbidden", message)(scope, receive, sending)
                    return
            if undecodable is not None:
                message = (
                    f"the {undecodable} of the URL is not UTF-8 once percent-decoded: percent-encode a name's UTF-8"
                )
                await _error(400, "bad_request", message)(scope, receive, sending)
                return
            if (
                scope["method"] == "POST"
                and path.startswith("/v1/queues/")
                and path.endswith("/jobs")
                and len(path) > 16
            ):
                await service.send(scope, receive, sending)
            else:
                await starlette(scope, receive, sending)
        except asyncio.CancelledError:
            # uvicorn cancels a request still running when a stop's graceful wait ends, and answers it
            # with a plain-text 500. Say what happened instead, in JSON as every error of this service.
            if started:
                raise
            await _stopped(scope, receive, send)
            # Answered, so the request ends here: raised on, the cancellation was logged as "Exception in ASGI
            # application" with a traceback, one per request cut, after uvicorn's own line saying it cut them.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()

    return asgi


def _foreign_origin(scope: Scope) -> str | None:
    """The ``Origin`` a browser sent with this request if it is not this service's own, else None.

    A page of any site can make a browser POST to this service (a form sends ``text/plain``, which the body reader
    takes as JSON). With tokens that is harmless, since such a request cannot carry an ``Authorization`` header and
    a POST never takes the dashboard's cookie, so only ``--insecure-no-auth`` asks (it could send jobs, replay, purge
    and make tokens): a same-origin page behind a TLS proxy not named by ``--forwarded-allow-ips`` is then refused,
    as the dashboard's forms, which have the same check, are."""
    origin: str | None = None
    host = ""
    for name, value in scope["headers"]:
        if name == b"origin":
            origin = value.decode("latin-1")
        elif name == b"host":
            host = value.decode("latin-1")
    if origin is None or origin == f"{scope['scheme']}://{host}":
        return None
    return origin


async def _stopped(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer to a request that the service stopped before it finished (503)."""
    message = (
        "the service stopped before this request finished; it may or may not have taken effect: retry "
        "(a send with an Idempotency-Key is safe to retry)"
    )
    await _error(503, "stopping", message, retry_after=str(UNAVAILABLE_RETRY_AFTER))(scope, receive, send)


def _alert_loop(app: App, config: ServiceConfig) -> AlertLoop | None:
    """The alert loop the config asks for (None: off). Raises ConfigurationError for a bad rule,
    threshold or webhook, before the service starts."""
    rules = AlertRules.parse(config.alerts, app.catalogue.queues)
    webhooks = Webhooks(list(config.webhooks)) if config.webhooks else None
    # NaN is truthy and waits no time: the loop would evaluate without a pause.
    check_seconds(config.alert_interval, "alert_interval", ConfigurationError)
    if not config.alert_interval:
        return None
    return AlertLoop(app.admin, rules, webhooks, config.alert_interval)


def _register_convertor() -> None:
    from starlette.convertors import CONVERTOR_TYPES, Convertor

    if "pause_or_resume" in CONVERTOR_TYPES:
        return

    class PauseOrResume(Convertor[str]):
        regex = "pause|resume"

        def convert(self, value: str) -> str:
            return value

        def to_string(self, value: str) -> str:
            return value

    CONVERTOR_TYPES["pause_or_resume"] = PauseOrResume()
