"""The dashboard's pages over HTTP and in chromium: hostile text is shown as text on every page, the POST
forms need the session's CSRF token and this origin, a cookie never acts through the JSON API, login sends
nowhere but this site, schedules pause and resume with their buttons, and the service without auth."""

from __future__ import annotations

import re
import socket
import time
import uuid
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import httpx
from playwright.sync_api import BrowserContext, expect
from tests.dashboard.conftest import APP_PATH, log_in, shot, stop_worker, worker
from tests.http.conftest import Server, make_tokens, start, stop

from conveyor import App, JobError, JobStatus
from conveyor.backends import open_backend
from conveyor.backends.base import AlertsSetParams, AlertState, WorkerInfo, WorkersBeatParams
from conveyor.http._dashboard import LOGIN_REASONS, MAX_TEXT, environment, render_html

HOSTILE_QUEUE = 'q"><script>window.__pwned = 4</script>'
HOSTILE_TASK = '<img src=x onerror="window.__pwned = 3">'
HOSTILE_MESSAGE = "</pre><script>window.__pwned = 1</script>"
#: What none of the pages may hold as markup.
RAW = ("<script>window.__pwned", "<img src=x", "</pre><script>")


def session(server: Server, role: str) -> httpx.Client:
    """An httpx client logged in through the form (it keeps the session cookie); the caller closes it."""
    client = httpx.Client(base_url=server.url, timeout=30.0)
    done = client.post("/login", data={"token": server.tokens[role], "next": "/"})
    assert done.status_code == 303 and done.headers["location"] == "/", done.text
    assert "conveyor_session" in client.cookies
    cookie = done.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, html[:2000]
    return found.group(1)


def dead_letters(server: Server, tmp_path: Path) -> dict[str, UUID]:
    """Dead letters with hostile text: an unknown task with a hostile name on a hostile queue, and a
    ValueError whose message is hostile, holds a NUL and is far longer than a page shows."""
    huge = HOSTILE_MESSAGE + "<NUL>" + "x" * (MAX_TEXT * 2)
    with App(server.db) as app:
        ids = {
            "task": app.send(HOSTILE_TASK, {"a": 1}, queue=HOSTILE_QUEUE).id,
            "message": app.send("dash.boom", {"message": huge}, queue="fragile").id,
        }
    proc = worker(server, tmp_path, "--burst", "--queues", f"{HOSTILE_QUEUE},fragile")
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        stop_worker(proc)
    with App(server.db) as app:
        assert {name: app.job(i).state for name, i in ids.items()} == {"task": "dead", "message": "dead"}
    return ids


def test_user_controlled_text_is_text_on_every_page(served: Server, tmp_path: Path, context: BrowserContext) -> None:
    ids = dead_letters(served, tmp_path)
    with closing(session(served, "admin")) as c:
        pages = [
            "/",
            "/dead-letters",
            f"/dead-letters?queue={httpx.QueryParams({'q': HOSTILE_QUEUE})['q']}",
            f"/dead-letters?task={HOSTILE_TASK}",
            f"/dead-letters/{ids['task']}",
            f"/dead-letters/{ids['message']}",
            f"/jobs/{ids['task']}",
            f"/jobs/{ids['message']}",
            "/workers",
            "/alerts",
            "/schedules",
        ]
        for path in pages:
            page = c.get(path, params=None)
            assert page.status_code == 200, (path, page.text[:500])
            assert not any(raw in page.text for raw in RAW), path
            assert "\x00" not in page.text
            assert page.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
            assert page.headers["x-frame-options"] == "DENY"
        shown = c.get(f"/dead-letters/{ids['message']}").text
        assert "&lt;/pre&gt;&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in shown
        assert "\\u0000" in shown  # the NUL as the worker stored it: visible, not swallowed
        # The message is cut where it is stored (64 KiB) and says so; the page stays small.
        assert "more characters" in shown and len(shown) < 400_000
        listed = c.get("/dead-letters", params={"queue": HOSTILE_QUEUE}).text
        assert "&lt;img src=x onerror=&#34;window.__pwned = 3&#34;&gt;" in listed
        assert "q&#34;&gt;&lt;script&gt;window.__pwned = 4&lt;/script&gt;" in listed

    # In the browser: the text reads as written, and nothing ran (the page's own script did).
    page = log_in(context, served, "operator", "/")
    expect(page.locator("#queues")).to_have_attribute("data-polls", re.compile(r"\d"))
    expect(page.locator("#queues tbody td.name a", has_text=HOSTILE_QUEUE)).to_have_count(1)
    page.goto(f"{served.url}/dead-letters/{ids['task']}")
    expect(page.locator("#task")).to_have_text(HOSTILE_TASK)
    expect(page.locator("#queue")).to_have_text(HOSTILE_QUEUE)
    expect(page.locator("#error-type")).to_have_text("UnknownTaskError")
    page.goto(f"{served.url}/dead-letters/{ids['message']}")
    expect(page.locator("#error-message")).to_contain_text(HOSTILE_MESSAGE + "\\u0000xxx")
    assert page.evaluate("window.__pwned") is None


def test_nul_and_lone_surrogates_render_as_text() -> None:
    """Text that the database never hands back today (the worker stores NUL as ``\\u0000``) still cannot break
    a page: NUL shows as ␀, a lone surrogate as ``?``, markup as text."""
    now = datetime.now(UTC)
    job = JobStatus(
        id=uuid.uuid4(),
        queue="q",
        task="t<b>",
        state="dead",
        attempts=1,
        deliveries=1,
        max_attempts=1,
        priority=0,
        payload={"s": "lone \ud800 surrogate", "n": "a\x00b"},
        headers={},
        enqueued_at=now,
        run_at=now,
        started_at=now,
        finished_at=now,
        stored_result=None,
        error=JobError("E\x00rror", "<script>x</script>\x00", "Traceback\x00" + "y" * (MAX_TEXT + 5)),
        reason="permanent_error",
        idempotency_key=None,
        ordering_key=None,
        replay_of=None,
        replayed_by=None,
    )
    html = render_html(environment(), "_record.html", job=job, history=[]).decode("utf-8")
    assert "\x00" not in html and "E\u2400rror" in html
    assert "&lt;script&gt;x&lt;/script&gt;\u2400" in html and "<script>" not in html
    assert "t&lt;b&gt;" in html
    assert "lone ? surrogate" in html
    assert "a\u2400b" not in html and "a\\u0000b" in html  # JSON escapes NUL in the payload itself
    assert "5 more characters not shown" in html


def test_posts_need_the_csrf_token_and_this_origin(served: Server, tmp_path: Path) -> None:
    with App(served.db) as app:
        dead = app.send("dash.boom", {"message": "no"}, queue="fragile").id
    proc = worker(served, tmp_path, "--burst", "--queues", "fragile")
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        stop_worker(proc)
    with closing(session(served, "operator")) as c:
        page = c.get(f"/dead-letters/{dead}")
        csrf = csrf_of(page.text)
        replay = f"/dead-letters/{dead}/replay"
        assert c.post(replay, data={"reason": "x"}).status_code == 403  # no CSRF token
        assert c.post(replay, data={"reason": "x", "csrf": "0" * 64}).status_code == 403  # a wrong one
        foreign = c.post(replay, data={"reason": "x", "csrf": csrf}, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403 and "another site" in foreign.text
        # The JSON API never acts on the cookie alone: its POSTs need the Authorization header.
        api = c.post("/v1/dead-letters:replay", json={"ids": [str(dead)], "reason": "x"})
        assert api.status_code == 401
        with App(served.db) as app:
            assert app.job(dead).replayed_by is None
        # A GET of the API does take the cookie (the charts poll /v1/queues with it).
        assert c.get("/v1/queues").status_code == 200
        done = c.post(replay, data={"reason": "fixed", "csrf": csrf}, headers={"Origin": served.url})
        assert done.status_code == 303 and "notice=replayed-as&job=" in done.headers["location"]
        with App(served.db) as app:
            assert app.job(dead).replayed_by is not None

        # Logging out forgets the cookie: the next page asks for a token again.
        out = c.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert "conveyor_session" not in c.cookies
        again = c.get("/")
        assert again.status_code == 303 and again.headers["location"].startswith("/login")


def test_login_refuses_bad_tokens_and_goes_nowhere_but_this_site(served: Server) -> None:
    with httpx.Client(base_url=served.url) as c:
        foreign = c.post("/login", data={"token": served.tokens["operator"]}, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403 and "conveyor_session" not in c.cookies
        bad = c.post("/login", data={"token": "cvy_000000000000_nope", "next": "/"})
        assert bad.status_code == 401 and "unknown token" in bad.text
        assert "conveyor_session" not in c.cookies
        for target, lands in (("//evil.example/x", "/"), ("https://evil.example", "/"), ("/schedules", "/schedules")):
            done = c.post("/login", data={"token": served.tokens["operator"], "next": target})
            assert done.status_code == 303 and done.headers["location"] == lands, target
        # A session whose token is revoked is sent back to the login form, which says why.
        with App(served.db) as app:
            app.admin.revoke_token("ops", actor="test")
        back = c.get("/dead-letters")
        assert back.status_code == 303 and httpx.URL(back.headers["location"]).params["why"] == "revoked"
        form = c.get(back.headers["location"])
        assert form.status_code == 200 and LOGIN_REASONS["revoked"] in form.text


def test_login_says_why_in_this_sites_own_words_only(served: Server) -> None:
    # /login?why= showed whatever text the link carried (escaped, but on this site's login form: a phishing
    # line such as "Session expired: call +1 555 0100"). It now takes a code from a fixed set.
    with App(served.db) as app:
        expiring = app.admin.create_token(
            "brief", "operator", expires_at=datetime.now(UTC) + timedelta(seconds=1), actor="test"
        )[1]
    with httpx.Client(base_url=served.url) as c:
        assert c.post("/login", data={"token": expiring, "next": "/"}).status_code == 303
        time.sleep(1.2)
        back = c.get("/schedules")
        assert back.status_code == 303
        assert dict(httpx.URL(back.headers["location"]).params) == {"next": "/schedules", "why": "expired"}
        assert LOGIN_REASONS["expired"] in c.get(back.headers["location"]).text
        # No session at all: no reason given.
        c.cookies.clear()
        assert "why" not in httpx.URL(c.get("/schedules").headers["location"]).params
        phishing = "Your session expired. Call +1 555 0100 to restore access"
        for why in (phishing, "Revoked", "", "expired "):
            page = c.get("/login", params={"why": why})
            assert page.status_code == 200
            assert "Call +1" not in page.text and 'class="error"' not in page.text, why


def test_notices_are_this_sites_own_words_with_checked_parameters(served: Server) -> None:
    # ?notice= showed whatever text the link carried on every page (the redirect after an action
    # wrote its sentence into the URL). It now takes a code and parameters that must check.
    phishing = "Your session expired. Call +1 555 0100 to restore access"
    job = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
    cases = {
        (("notice", "replayed"), ("n", "3")): "replayed 3 dead letters",
        (("notice", "replayed-as"), ("job", job)): f"replayed as job {job}",
        (("notice", "paused"), ("name", "nightly-report")): "paused nightly-report",
        (("notice", phishing),): None,
        (("notice", "replayed"), ("n", phishing)): None,
        (("notice", "replayed"), ("n", "-1")): None,
        (("notice", "replayed-as"), ("job", phishing)): None,
        (("notice", "paused"), ("name", phishing)): None,
        (("notice", "paused"),): None,
    }
    with httpx.Client(base_url=served.url) as c:
        assert c.post("/login", data={"token": served.tokens["operator"], "next": "/"}).status_code == 303
        for params, shown in cases.items():
            page = c.get("/schedules", params=dict(params))
            assert page.status_code == 200, params
            assert "Call +1" not in page.text, params
            if shown is None:
                assert 'class="notice"' not in page.text, params
            else:
                assert f'<p class="notice" role="status">{shown}</p>' in page.text, params


def test_schedules_pause_and_resume_with_their_buttons(served: Server, context: BrowserContext) -> None:
    with App(served.db) as app:
        app.admin.add_schedule("nightly-report", "0 3 * * *", "dash.work", queue="drain", actor="test")
    page = log_in(context, served, "operator", "/schedules")
    row = page.locator('tr[data-schedule="nightly-report"]')
    expect(row.locator(".state-cell")).to_have_text("active")
    row.get_by_role("button", name="Pause").click()
    expect(page.locator(".notice")).to_have_text("paused nightly-report")
    expect(row.locator(".state-cell")).to_have_text("paused")
    with App(served.db) as app:
        assert [s.paused for s in app.admin.schedules()] == [True]
    row.get_by_role("button", name="Resume").click()
    expect(row.locator(".state-cell")).to_have_text("active")
    with App(served.db) as app:
        assert [s.paused for s in app.admin.schedules()] == [False]
        actions = [(e.actor, e.action) for e in app.admin.audit(2)]
        assert actions == [("ops", "schedule.resume"), ("ops", "schedule.pause")]


def test_a_schedule_whose_name_holds_a_slash_is_paused_from_its_button(served: Server) -> None:
    # The button's form posts to /schedules/reports%2Fnightly/pause. Before, the route's {name} stopped at the
    # '/' that uvicorn decodes from %2F, and the button answered 404 "Not Found".
    with App(served.db) as app:
        app.admin.add_schedule("reports/nightly", "0 3 * * *", "dash.work", queue="drain", actor="test")
    with closing(session(served, "operator")) as c:
        page = c.get("/schedules").text
        assert 'action="/schedules/reports%2Fnightly/pause"' in page, page
        done = c.post("/schedules/reports%2Fnightly/pause", data={"csrf": csrf_of(page)})
        assert done.status_code == 303, done.text
    with App(served.db) as app:
        assert [s.paused for s in app.admin.schedules()] == [True]


def test_without_auth_the_dashboard_opens_and_still_needs_csrf(postgres_database: str, tmp_path: Path) -> None:
    with App(postgres_database, migrate=True) as app:
        app.admin.migrate()
        app.admin.add_schedule("hourly", "0 * * * *", "dash.work", queue="drain", actor="test")
    server = start(postgres_database, tmp_path, "--insecure-no-auth", app_path=APP_PATH)
    try:
        with httpx.Client(base_url=server.url) as c:
            home = c.get("/")
            assert home.status_code == 200 and 'id="queues"' in home.text
            assert c.cookies["conveyor_session"].startswith("anon_")
            schedules = c.get("/schedules").text
            assert c.post("/schedules/hourly/pause", data={}).status_code == 403
            done = c.post("/schedules/hourly/pause", data={"csrf": csrf_of(schedules)})
            assert done.status_code == 303
        with App(postgres_database) as app:
            assert [s.paused for s in app.admin.schedules()] == [True]
            assert app.admin.audit(1)[0].actor == "insecure-no-auth"
    finally:
        stop(server)


def test_workers_and_alerts_panels_follow_the_registry_live(
    served: Server, context: BrowserContext, tmp_path: Path
) -> None:
    """The panels render Admin.workers and Admin.alerts (rows written here as a worker's heartbeat and the
    alert evaluator write them), and the overview swaps fresh panels in without a reload."""
    now = datetime.now(UTC)
    backend = open_backend(served.db)
    try:
        backend.workers_beat(WorkersBeatParams(WorkerInfo("w-1", "host-a", 4242, ("drain",), 8, now, now), now))
        backend.alerts_set(
            AlertsSetParams([AlertState("dlq_depth", "fragile", "firing", now, 3.0, 0.0, HOSTILE_MESSAGE)], now)
        )
        page = log_in(context, served, "operator", "/")
        expect(page.locator('#workers tr[data-worker="w-1"]')).to_contain_text("host-a:4242")
        expect(page.locator('#workers tr[data-worker="w-1"]')).to_contain_text("alive")
        expect(page.locator('#alerts li[data-rule="dlq_depth"]')).to_contain_text(HOSTILE_MESSAGE)
        assert page.evaluate("window.__pwned") is None

        # A new alert fires and the first resolves; the page shows both without a reload.
        later = datetime.now(UTC)
        backend.alerts_set(
            AlertsSetParams(
                [
                    AlertState("dlq_depth", "fragile", "resolved", later, 0.0, 0.0, "the DLQ is empty"),
                    AlertState("depth", "drain", "firing", later, 900.0, 500.0, "900 jobs over the mark of 500"),
                ],
                later,
            )
        )
        expect(page.locator('#alerts li[data-rule="depth"]')).to_contain_text("900 jobs over the mark of 500")
        expect(page.locator('#alerts li[data-rule="dlq_depth"]')).to_have_count(0)
        expect(page.locator("#resolved-alerts")).to_contain_text("the DLQ is empty")
        shot(page, tmp_path, "workers-and-alerts")
        page.goto(f"{served.url}/workers")
        expect(page.locator('#workers tr[data-worker="w-1"]')).to_contain_text("drain")
        page.goto(f"{served.url}/alerts")
        expect(page.locator("#alerts")).to_contain_text("depth")
    finally:
        backend.close()


def test_a_running_job_names_the_worker_that_holds_it(served: Server, context: BrowserContext, tmp_path: Path) -> None:
    with App(served.db) as app:
        job_id = app.send("dash.hold", {"seconds": 30}, queue="slow").id
    proc = worker(served, tmp_path, "--queues", "slow", "--graceful-timeout", "0")
    try:
        page = log_in(context, served, "operator", "/workers")
        row = page.locator("#workers tbody tr").first
        expect(row).to_contain_text("slow")
        page.goto(f"{served.url}/jobs/{job_id}")
        expect(page.locator("#state")).to_have_text("processing")
        expect(page.locator("#holder")).to_contain_text(f":{proc.pid}")
        # The workers page links the job it holds.
        page.goto(f"{served.url}/workers")
        page.locator(f'#workers a[href="/jobs/{job_id}"]').click()
        expect(page.locator("#holder")).to_be_visible()
    finally:
        stop_worker(proc)


def test_pages_answer_503_when_the_database_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        unreachable = f"postgresql://postgres@127.0.0.1:{port}/nowhere?connect_timeout=2"
        server = start(unreachable, tmp_path, app_path=None, wait_ready=False)
        try:
            with httpx.Client(base_url=server.url, timeout=30) as c:
                assert c.get("/login").status_code == 200  # the form itself needs no database
                well_formed = "cvy_0123456789ab_" + "s" * 43
                login = c.post("/login", data={"token": well_formed})
                assert login.status_code == 503 and "The database is unavailable" in login.text
                c.cookies.set("conveyor_session", well_formed)
                for path in ("/", "/dead-letters"):
                    page = c.get(path)
                    assert page.status_code == 503, (path, page.text[:300])
                    assert "<h1>The database is unavailable</h1>" in page.text
        finally:
            stop(server)


def test_behind_a_tls_proxy_the_session_cookie_is_secure_once_the_proxy_is_believed(
    sqlite_url: str, tmp_path: Path
) -> None:
    # The cookie got Secure only when the request's own scheme was https, and uvicorn ran with
    # proxy_headers off: behind a proxy that ends TLS it never had it (and the forms' Origin check, which
    # compares with the request's scheme, refused every form posted from https://).
    token = make_tokens(sqlite_url)["operator"]
    for believed in (False, True):
        server = start(sqlite_url, tmp_path, *(("--forwarded-allow-ips", "127.0.0.1") if believed else ()))
        origin = "https://" + server.url.removeprefix("http://")
        proxied = {"X-Forwarded-Proto": "https", "Origin": origin}
        try:
            with httpx.Client(base_url=server.url) as c:
                done = c.post("/login", data={"token": token, "next": "/"}, headers=proxied)
                if not believed:
                    # Anyone may send X-Forwarded-Proto: it is ignored unless the proxy is named.
                    assert done.status_code == 403, done.text
                    plain = c.post("/login", data={"token": token, "next": "/"})
                    assert plain.status_code == 303 and "secure" not in plain.headers["set-cookie"].lower()
                    continue
                assert done.status_code == 303, done.text
                assert "; secure" in done.headers["set-cookie"].lower()
                # httpx keeps a Secure cookie for https only: send it by hand, as the browser would.
                session = {"Cookie": f"conveyor_session={token}"}
                page = c.get("/schedules", headers={**proxied, **session})
                assert page.status_code == 200, page.text
                csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
                assert csrf is not None
                out = c.post("/logout", data={"csrf": csrf.group(1)}, headers={**proxied, **session})
                assert out.status_code == 303 and "; secure" in out.headers["set-cookie"].lower()
                # A request the proxy did not mark https is plain HTTP: no Secure.
                direct = c.post("/login", data={"token": token, "next": "/"})
                assert direct.status_code == 303 and "secure" not in direct.headers["set-cookie"].lower()
        finally:
            stop(server)


def test_a_jobs_page_shows_its_replay_however_many_actions_came_after(served: Server, tmp_path: Path) -> None:
    # Before: the page read the last 1,000 actions of all and kept those naming the job, so an older dead
    # letter's replay was missing from its history once 1,000 other actions had been audited.
    from conveyor.backends.base import AuditInsertParams

    dead_id = dead_letters(served, tmp_path)["message"]
    with App(served.db) as app:
        app.admin.replay([dead_id], reason="the fix is out", actor="carol")
        now = datetime.now(UTC)
        for n in range(1_001):
            app.backend.audit_insert(AuditInsertParams("ops", "schedule.pause", "", now + timedelta(seconds=n), ()))
    with closing(session(served, "operator")) as c:
        page = c.get(f"/jobs/{dead_id}")
        assert page.status_code == 200, page.text[:500]
        assert "by carol: the fix is out" in page.text
        assert "schedule.pause" not in page.text
