"""The dashboard of ``conveyor serve``: server-rendered pages over ``app.admin``, at ``/``.

A presenter, as the JSON API is: every page checks the caller's token with the same rules
(``conveyor._tokens``), calls the operator API, and renders the result with Jinja2 (autoescaped:
every value a user controls, a task name, an error message, a traceback, is text, never markup).
The live charts are drawn in the browser by ``static/dashboard.js``, which polls ``GET /v1/queues``.

Login: the form takes a bearer token and keeps it in an ``HttpOnly``, ``SameSite=Strict`` cookie
(``Secure`` over HTTPS), so no script on the page can read it. The cookie authenticates dashboard
pages and the API's GET requests only: an API POST still needs an ``Authorization`` header, so a
cookie alone never changes anything through the API. Every dashboard POST (replay, purge, schedule
pause and resume, logout) carries a CSRF token derived from the session cookie (an attacker's page
can neither read the cookie nor compute it) and must come from this origin (``Origin`` header).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode
from uuid import UUID

import jinja2
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from conveyor import _tokens
from conveyor._errors import (
    BackendCorrupt,
    BackendError,
    ConfigurationError,
    ConveyorError,
    Forbidden,
    NotFoundError,
    PayloadError,
    Unauthenticated,
    first_line,
)
from conveyor._job import JobStatus
from conveyor._limits import check_name
from conveyor.admin import Token

if TYPE_CHECKING:
    from conveyor.http._api import Service

HERE = Path(__file__).resolve().parent
#: The cookie that holds the session: the bearer token itself (or, without auth, a random value
#: that only the CSRF token is derived from). No server-side session state, so any process of
#: ``conveyor serve --workers N`` answers any request.
SESSION_COOKIE = "conveyor_session"
#: Characters of an error message or traceback shown on a page; the rest is cut with a note
#: (the JSON API returns the full text).
MAX_TEXT = 100_000
#: Dead letters per page of the browser.
PAGE = 50
#: Why a session was sent back to the login form: the codes of ``/login?why=`` and their texts.
LOGIN_REASONS = {
    "invalid": "The token of this session is not valid (unknown, or a wrong secret): log in again.",
    "revoked": "The token of this session was revoked: log in with another one.",
    "expired": "The token of this session has expired: log in with another one.",
}
#: What a page may say after an action, by code: the redirect after a POST carries ``notice=CODE`` and
#: the parameters below, never text, so that a link cannot make a page say what an attacker wrote.
#: ``n`` must be digits, ``job`` a UUID, ``name`` a word (letters, digits, ``._:-``: a schedule name
#: with spaces gets no notice, rather than any sentence being writable); a notice whose code is
#: unknown or whose parameter does not check shows nothing.
NOTICES = {
    "already-replayed": "it was already replayed",
    "replayed-as": "replayed as job {job}",
    "replayed": "replayed {n} dead letters",
    "purged": "purged {n} dead letters",
    "purged-one": "purged {n} dead letter",
    "paused": "paused {name}",
    "resumed": "resumed {name}",
}
_NOTICE_NAME = re.compile(r"[\w.:-]{1,200}", re.ASCII)
#: Largest form body a dashboard POST may have.
MAX_FORM_BYTES = 64 * 1024
#: Headers of every dashboard page: scripts and styles from this origin only (no inline script can
#: run even if something escaped the templates), no framing, nothing cached.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}


def csrf_token(session: str) -> str:
    """The CSRF token of a session: a hash of its cookie, which a page of another origin cannot read."""
    return hashlib.sha256(b"conveyor-dashboard-csrf\x00" + session.encode("utf-8", "replace")).hexdigest()


def visible(text: object, limit: int = MAX_TEXT) -> str:
    """Text made safe to show, before escaping: NUL as ␀ (a browser would drop or replace it), and at
    most ``limit`` characters with a note of how many more there were."""
    value = "" if text is None else str(text)
    cut = ""
    if len(value) > limit:
        cut = f"\n… {len(value) - limit:,} more characters not shown (the JSON API returns the full text)"
        value = value[:limit]
    return value.replace("\x00", "\u2400") + cut


def pretty_json(value: Any) -> str:
    return visible(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str))


def when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC" if value else "—"


def age(seconds: float | None) -> str:
    """A duration for people: 0.4 s, 12 s, 3 m 20 s, 5 h 2 m."""
    if seconds is None or math.isnan(seconds):
        return "—"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} m {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} m"


def environment() -> jinja2.Environment:
    """The dashboard's templates: autoescaped, and an undefined name is an error, not an empty string."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["visible"] = visible
    env.filters["pretty_json"] = pretty_json
    env.filters["when"] = when
    env.filters["age"] = age
    env.filters["q"] = lambda value: quote(str(value), safe="")
    return env


def render_html(env: jinja2.Environment, name: str, **context: Any) -> bytes:
    """A template rendered to UTF-8. A lone surrogate (a payload quoting one) cannot be UTF-8: it is
    shown as ``?`` rather than failing the page."""
    return env.get_template(name).render(**context).encode("utf-8", "replace")


class Page(Exception):
    """Stop handling a request and answer with this response (a redirect, an error page)."""

    def __init__(self, response: Response) -> None:
        super().__init__("page")
        self.response = response


class Dashboard:
    """The dashboard's routes over one :class:`~conveyor.http._api.Service` (its App, config and tokens)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.app = service.app
        self.env = environment()

    # -- plumbing ----------------------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        session = request.cookies.get(SESSION_COOKIE) or ""
        context.setdefault("token", None)
        context.setdefault("error", None)
        context.setdefault("notice", _notice(request.query_params))
        html = render_html(
            self.env,
            name,
            csrf=csrf_token(session) if session else "",
            auth=self.service.config.auth,
            path=request.url.path,
            **context,
        )
        response = Response(html, status, media_type="text/html; charset=utf-8")
        response.headers.update(SECURITY_HEADERS)
        if not session and not self.service.config.auth:
            # Without auth there is no login: a random session still anchors the CSRF tokens.
            self._set_session(request, response, "anon_" + secrets.token_urlsafe(24))
        return response

    def _set_session(self, request: Request, response: Response, value: str) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            value,
            httponly=True,
            samesite="strict",
            # The scheme the browser used: https behind a TLS-terminating proxy only when conveyor serve
            # believes the proxy's X-Forwarded-Proto (--forwarded-allow-ips).
            secure=request.url.scheme == "https",
            path="/",
        )

    async def token(self, request: Request) -> Token:
        """The token of the session; a redirect to the login page when there is none (or it is no
        longer valid: revoked, expired)."""
        bearer = request.cookies.get(SESSION_COOKIE) or ""
        try:
            if not self.service.config.auth:
                return await self.service.token_of("")
            if not bearer:
                raise Unauthenticated("log in with a token", "missing")
            return await self.service.token_of(f"Bearer {bearer}")
        except Unauthenticated as exc:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            fields = {"next": target}
            if bearer and exc.kind in LOGIN_REASONS:
                fields["why"] = exc.kind
            raise Page(RedirectResponse(f"/login?{urlencode(fields)}", 303)) from None

    async def form(self, request: Request) -> dict[str, str]:
        """A POST's form fields, after the CSRF and same-origin checks (403 page when they fail)."""
        fields = await _read_form(request)
        session = request.cookies.get(SESSION_COOKIE) or ""
        if not session or not hmac.compare_digest(fields.get("csrf", ""), csrf_token(session)):
            raise Forbidden("the form's CSRF token is missing or stale: reload the page and try again")
        return fields

    def page(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a page so that the Python API's errors become error pages with their status code."""

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except Page as stop:
                return stop.response
            except ConveyorError as exc:
                status, title = _status_of(exc)
                token = None
                # The header shows who is logged in, if that can still be read (not when the database is down).
                with contextlib.suppress(Page, ConveyorError):
                    token = await self.token(request)
                message = first_line(exc)
                return self.render(request, "error.html", status, title=title, message=message, token=token)

        answer.__doc__ = handler.__doc__
        return answer

    def _can(self, token: Token, role: _tokens.Role, queue: str | None = None) -> bool:
        return _tokens.allows(token, role, queue)

    # -- login -------------------------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        """GET /login: the token form."""
        # The reason is a code, shown as this site's own text: a link to /login cannot put words of its
        # author's choosing on this site's login page (an unknown code shows nothing).
        why = LOGIN_REASONS.get(request.query_params.get("why") or "")
        return self.render(request, "login.html", error=why, next=_safe_next(request.query_params.get("next")))

    async def login(self, request: Request) -> Response:
        """POST /login: check the token, keep it in the session cookie, go on to the page asked for."""
        # No CSRF token here (there is no session yet); the same-origin check stops another site from
        # logging a browser in with the other site's token.
        fields = await _read_form(request)
        bearer = fields.get("token", "").strip()
        target = _safe_next(fields.get("next"))
        try:
            await self.service.token_of(f"Bearer {bearer}")
        except Unauthenticated as exc:
            message = str(exc).splitlines()[0]
            return self.render(request, "login.html", 401, error=message, next=target)
        response = RedirectResponse(target, 303)
        if self.service.config.auth:
            self._set_session(request, response, bearer)
        return response

    async def logout(self, request: Request) -> Response:
        """POST /logout: forget the session cookie."""
        await self.form(request)
        response = RedirectResponse("/login", 303)
        response.delete_cookie(
            SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
        )
        return response

    # -- pages -------------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        """GET /: every queue with live charts, workers, alerts."""
        token = await self.token(request)
        queues = None
        # A token limited to queues sees its own ones (allows(token, role, None) means every queue).
        if _tokens.has_role(token, "operator"):
            rows = await self.service.run(self.app.admin.queues)
            queues = [q for q in rows if self._can(token, "operator", q.queue)]
        workers = await self._workers(token)
        alerts = await self._alerts(token)
        return self.render(request, "overview.html", token=token, queues=queues, workers=workers, alerts=alerts)

    async def workers_page(self, request: Request) -> Response:
        """GET /workers: the workers and their in-flight jobs."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        return self.render(request, "workers.html", token=token, workers=await self._workers(token))

    async def alerts_page(self, request: Request) -> Response:
        """GET /alerts: the alerts, firing and resolved."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        return self.render(request, "alerts.html", token=token, alerts=await self._alerts(token))

    async def panel(self, request: Request) -> Response:
        """GET /panels/workers and /panels/alerts: one panel's HTML alone, which the overview's script
        swaps in every few seconds (rendered and escaped here, as the page is)."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        if request.path_params["name"] == "workers":
            return self.render(request, "_workers.html", token=token, workers=await self._workers(token))
        return self.render(request, "_alerts.html", token=token, alerts=await self._alerts(token))

    async def _workers(self, token: Token) -> dict[str, Any] | None:
        """What the workers panel shows (None: the token may not see it): the worker registry, each worker
        with the jobs it holds leases on, and the jobs in flight per queue (which also counts jobs held by a
        worker that does not report itself). A token limited to queues sees the workers of those queues."""
        if not _tokens.has_role(token, "operator"):
            return None
        workers = await self.service.visible_workers(token)
        rows = await self.service.run(self.app.admin.queues)
        in_flight = [(q.queue, q.processing) for q in rows if self._can(token, "operator", q.queue)]
        return {"workers": workers, "in_flight": in_flight}

    async def _alerts(self, token: Token) -> dict[str, Any] | None:
        """What the alerts panel shows (None: the token may not see it): the alerts as the service last
        evaluated them, firing first. A token limited to queues sees theirs and the database-wide ones."""
        if not _tokens.has_role(token, "operator"):
            return None
        found = await self.service.run(self.app.admin.alerts)
        visible_alerts = [a for a in found if a.queue is None or self._can(token, "operator", a.queue)]
        firing = [a for a in visible_alerts if a.state == "firing"]
        resolved = sorted((a for a in visible_alerts if a.state != "firing"), key=lambda a: a.since, reverse=True)
        return {"firing": firing, "resolved": resolved[:20], "evaluated": bool(visible_alerts)}

    async def find_job(self, request: Request) -> Response:
        """GET /jobs?id=...: go to a job's page."""
        await self.token(request)
        raw = (request.query_params.get("id") or "").strip()
        try:
            job_id = UUID(raw)
        except ValueError:
            raise ConfigurationError(f"not a job id: {raw[:80]!r}") from None
        return RedirectResponse(f"/jobs/{job_id}", 303)

    async def job(self, request: Request) -> Response:
        """GET /jobs/{id}: state, attempts, error with traceback, history."""
        token = await self.token(request)
        job_id = _uuid(request.path_params["id"])
        status = await self.service.run(self.app.admin.job, job_id)
        if self.service.config.auth and not _tokens.may_read(token, status.queue, status.headers):
            # As the API: a token does not learn which ids exist outside what it may read.
            raise NotFoundError(f"no job {job_id}")
        audit = []
        if self._can(token, "operator", None):
            # The actions naming this job, however many others came after (read as the last 1,000 of all, an
            # older job's replay or purge was missing from its history).
            audit = await self.service.run(self.app.admin.audit, 1000, job=job_id)
        holder = None
        if status.state == "processing" and self._can(token, "operator", status.queue):
            workers = await self.service.run(self.app.admin.workers)
            holder = next((w for w in workers if job_id in w.in_flight), None)
        dead = status.state == "dead"
        return self.render(
            request,
            "job.html",
            token=token,
            job=status,
            holder=holder,
            history=_history(status, audit),
            can_replay=dead and status.replayed_by is None and self._can(token, "operator", status.queue),
            can_purge=dead and self._can(token, "admin", status.queue),
        )

    async def dead_letters(self, request: Request) -> Response:
        """GET /dead-letters: the DLQ browser, filtered by queue, task and error type, newest first."""
        token = await self.token(request)
        params = request.query_params
        filters = {name: (params.get(name) or "").strip() or None for name in ("queue", "task", "error_type")}
        for name, value in filters.items():
            if value is not None:
                check_name(value, name.replace("_", " "), ConfigurationError)
        _tokens.require(token, "operator", filters["queue"])
        before = _cursor(params.get("before"))
        rows = await self.service.run(
            self.app.admin.dead_letters,
            queue=filters["queue"],
            task=filters["task"],
            error_type=filters["error_type"],
            limit=PAGE,
            before=before,
        )
        following = None
        if len(rows) == PAGE and rows[-1].finished_at is not None:
            last = rows[-1]
            assert last.finished_at is not None
            cursor = f"{last.finished_at.isoformat()}|{last.id}"
            following = "/dead-letters?" + urlencode({**{k: v for k, v in filters.items() if v}, "before": cursor})
        queues = await self.service.run(self.app.admin.queues)
        acting = filters["queue"] is not None and bool(rows)
        return self.render(
            request,
            "dead_letters.html",
            token=token,
            rows=rows,
            filters=filters,
            following=following,
            queue_names=[q.queue for q in queues if q.dead > 0 and self._can(token, "operator", q.queue)],
            can_replay_all=acting and self._can(token, "operator", filters["queue"]),
            can_purge_all=acting and self._can(token, "admin", filters["queue"]),
        )

    async def dead_letter(self, request: Request) -> Response:
        """GET /dead-letters/{id}: the full dead-letter record, with replay and purge as the role allows."""
        token = await self.token(request)
        job_id = _uuid(request.path_params["id"])
        _tokens.require_role(token, "operator")
        status = await self.service.run(self.app.admin.dead_letter, job_id)
        if not self._can(token, "operator", status.queue):
            raise NotFoundError(f"no dead letter {job_id}")
        return self.render(
            request,
            "dead_letter.html",
            token=token,
            job=status,
            can_replay=status.replayed_by is None and self._can(token, "operator", status.queue),
            can_purge=self._can(token, "admin", status.queue),
        )

    async def dead_letter_action(self, request: Request) -> Response:
        """POST /dead-letters/{id}/replay and /purge: the buttons of a dead letter (audited)."""
        token = await self.token(request)
        fields = await self.form(request)
        job_id = _uuid(request.path_params["id"])
        action = request.path_params["action"]
        role: _tokens.Role = "operator" if action == "replay" else "admin"
        _tokens.require_role(token, role)
        status = await self.service.run(self.app.admin.dead_letter, job_id)
        if not self._can(token, "operator", status.queue):
            raise NotFoundError(f"no dead letter {job_id}")
        _tokens.require(token, role, status.queue)
        reason = (fields.get("reason") or "").strip() or f"{action} from the dashboard"
        actor = self.service.actor(token)
        if action == "replay":
            result = await self.service.run(self.app.admin.replay, [job_id], reason=reason, actor=actor)
            if not result.replayed:
                return _redirect(f"/dead-letters/{job_id}", "already-replayed")
            new_id = result.replayed[0][1]
            return _redirect("/dead-letters?" + urlencode({"queue": status.queue}), "replayed-as", job=str(new_id))
        purged = await self.service.run(self.app.admin.purge, [job_id], reason=reason, actor=actor)
        return _redirect("/dead-letters?" + urlencode({"queue": status.queue}), "purged-one", n=str(purged.purged))

    async def dead_letters_action(self, request: Request) -> Response:
        """POST /dead-letters/replay and /purge: every dead letter of a filter (a queue, narrowed by
        task and error type), as the API's selection does (audited)."""
        token = await self.token(request)
        fields = await self.form(request)
        action = request.path_params["action"]
        role: _tokens.Role = "operator" if action == "replay" else "admin"
        filters = {name: (fields.get(name) or "").strip() or None for name in ("queue", "task", "error_type")}
        if filters["queue"] is None:
            raise ConfigurationError("acting on dead letters by filter needs a queue")
        _tokens.require(token, role, filters["queue"])
        reason = (fields.get("reason") or "").strip() or f"{action} from the dashboard"
        actor = self.service.actor(token)
        back = "/dead-letters?" + urlencode({k: v for k, v in filters.items() if v})
        queue, task, error_type = filters["queue"], filters["task"], filters["error_type"]
        if action == "replay":
            result = await self.service.run(
                self.app.admin.replay, queue=queue, task=task, error_type=error_type, reason=reason, actor=actor
            )
            return _redirect(back, "replayed", n=str(len(result.replayed)))
        purged = await self.service.run(
            self.app.admin.purge, queue=queue, task=task, error_type=error_type, reason=reason, actor=actor
        )
        return _redirect(back, "purged", n=str(purged.purged))

    async def schedules(self, request: Request) -> Response:
        """GET /schedules: every schedule with pause/resume."""
        token = await self.token(request)
        _tokens.require_role(token, "operator")
        rows = await self.service.run(self.app.admin.schedules)
        visible_rows = [s for s in rows if self._can(token, "operator", s.queue)]
        return self.render(request, "schedules.html", token=token, schedules=visible_rows)

    async def schedule_action(self, request: Request) -> Response:
        """POST /schedules/{name}/pause and /resume (audited)."""
        token = await self.token(request)
        await self.form(request)
        name = check_name(request.path_params["name"], "schedule name", ConfigurationError)
        _tokens.require_role(token, "operator")
        found = next((s for s in await self.service.run(self.app.admin.schedules) if s.name == name), None)
        if found is None or not self._can(token, "operator", found.queue):
            raise NotFoundError(f"no schedule named {name!r}")
        actor = self.service.actor(token)
        if request.path_params["action"] == "pause":
            await self.service.run(self.app.admin.pause_schedule, name, actor=actor)
            return _redirect("/schedules", "paused", name=name)
        await self.service.run(self.app.admin.resume_schedule, name, actor=actor)
        return _redirect("/schedules", "resumed", name=name)

    # -- routes ------------------------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        p = self.page
        return [
            Route("/", p(self.overview), methods=["GET"]),
            Route("/login", p(self.login_page), methods=["GET"]),
            Route("/login", p(self.login), methods=["POST"]),
            Route("/logout", p(self.logout), methods=["POST"]),
            Route("/workers", p(self.workers_page), methods=["GET"]),
            Route("/alerts", p(self.alerts_page), methods=["GET"]),
            Route("/panels/{name:workers_or_alerts}", p(self.panel), methods=["GET"]),
            Route("/jobs", p(self.find_job), methods=["GET"]),
            Route("/jobs/{id}", p(self.job), methods=["GET"]),
            Route("/dead-letters", p(self.dead_letters), methods=["GET"]),
            Route("/dead-letters/{action:replay_or_purge}", p(self.dead_letters_action), methods=["POST"]),
            Route("/dead-letters/{id}", p(self.dead_letter), methods=["GET"]),
            Route("/dead-letters/{id}/{action:replay_or_purge}", p(self.dead_letter_action), methods=["POST"]),
            Route("/schedules", p(self.schedules), methods=["GET"]),
            # {name:path}: a schedule's name may hold a '/', which uvicorn has decoded from the form's %2F.
            Route("/schedules/{name:path}/{action:pause_or_resume}", p(self.schedule_action), methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]


async def _read_form(request: Request) -> dict[str, str]:
    """The fields of a urlencoded form posted from this origin (a page of another site is refused),
    read up to :data:`MAX_FORM_BYTES`."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise Forbidden("this form was posted from another site")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        raise ConfigurationError("the form is too large")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ConfigurationError("the form is too large")
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in parsed.items()}


def _status_of(exc: ConveyorError) -> tuple[int, str]:
    if isinstance(exc, Forbidden):
        return 403, "Not allowed"
    if isinstance(exc, Unauthenticated):
        return 401, "Not logged in"
    if isinstance(exc, NotFoundError):
        return 404, "Not found"
    if isinstance(exc, ConfigurationError | PayloadError):
        return 400, "Bad request"
    if isinstance(exc, BackendCorrupt):
        return 500, "The database is damaged"
    if isinstance(exc, BackendError):
        return 503, "The database is unavailable"
    return 400, "Refused"


def _redirect(target: str, notice: str, **params: str) -> Response:
    joiner = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{joiner}{urlencode({'notice': notice, **params})}", 303)


def _notice(query: Mapping[str, str]) -> str | None:
    """The sentence of a ``notice`` code (see :data:`NOTICES`), or None."""
    template = NOTICES.get(query.get("notice") or "")
    if template is None:
        return None
    values: dict[str, str] = {}
    for name in ("n", "job", "name"):
        if "{" + name + "}" not in template:
            continue
        value = query.get(name) or ""
        try:
            if name == "n" and not (value.isascii() and value.isdigit() and len(value) <= 12):
                return None
            if name == "job":
                value = str(UUID(value))
        except ValueError:
            return None
        if name == "name" and not _NOTICE_NAME.fullmatch(value):
            return None
        values[name] = value
    return template.format(**values)


def _safe_next(target: str | None) -> str:
    """A page of this site to go on to after login (never another site: ``//host`` or a scheme)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _uuid(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise NotFoundError(f"not a job id: {raw[:80]!r}") from None


def _cursor(raw: str | None) -> tuple[datetime, UUID] | None:
    if not raw:
        return None
    at, _, job_id = raw.partition("|")
    try:
        moment = datetime.fromisoformat(at)
        if moment.tzinfo is None:
            raise ValueError(at)
        return moment, UUID(job_id)
    except ValueError:
        raise ConfigurationError("bad page cursor (before): follow the page's own link") from None


def _history(status: JobStatus, audit: list[Any]) -> list[Mapping[str, Any]]:
    """What happened to a job, in order, from what the job row keeps (the times it was enqueued,
    due, last started and finished, and its replay links) and the audit rows that name it."""
    events: list[dict[str, Any]] = [{"at": status.enqueued_at, "what": "enqueued", "detail": f"queue {status.queue}"}]
    if status.replay_of is not None:
        events[0]["detail"] += " (a replay)"
        events[0]["link"] = f"/jobs/{status.replay_of}"
        events[0]["link_text"] = f"replay of {status.replay_of}"
    if status.run_at > status.enqueued_at and (status.started_at is None or status.run_at <= status.started_at):
        events.append({"at": status.run_at, "what": "due", "detail": f"attempt {status.attempts + 1} may start"})
    if status.started_at is not None:
        detail = f"delivery {status.deliveries}, attempt {status.attempts}"
        if status.rescues:
            detail += f"; {status.rescues} lease(s) expired and were rescued before"
        events.append({"at": status.started_at, "what": "last started", "detail": detail})
    if status.finished_at is not None:
        detail = status.reason or ""
        if status.error is not None:
            detail = f"{detail} {status.error.type}".strip()
        events.append({"at": status.finished_at, "what": status.state, "detail": detail})
    for entry in audit:
        events.append({"at": entry.at, "what": entry.action, "detail": f"by {entry.actor}: {entry.reason}".strip()})
    if status.replayed_by is not None:
        events.append(
            {
                "at": None,
                "what": "replayed",
                "detail": "",
                "link": f"/jobs/{status.replayed_by}",
                "link_text": f"as job {status.replayed_by}",
            }
        )
    dated = sorted((e for e in events if e["at"] is not None), key=lambda e: e["at"])
    return dated + [e for e in events if e["at"] is None]


def register_convertors() -> None:
    """The path convertors of the dashboard: ``replay_or_purge`` (dead-letter actions) and
    ``workers_or_alerts`` (panels)."""
    from starlette.convertors import CONVERTOR_TYPES, Convertor

    def one_of(*words: str) -> Convertor[str]:
        class OneOf(Convertor[str]):
            regex = "|".join(words)

            def convert(self, value: str) -> str:
                return value

            def to_string(self, value: str) -> str:
                return value

        return OneOf()

    for name, words in (("replay_or_purge", ("replay", "purge")), ("workers_or_alerts", ("workers", "alerts"))):
        if name not in CONVERTOR_TYPES:
            CONVERTOR_TYPES[name] = one_of(*words)


__all__ = ["SESSION_COOKIE", "Dashboard", "csrf_token", "environment", "register_convertors", "render_html", "visible"]
