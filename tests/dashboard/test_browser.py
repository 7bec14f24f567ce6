"""The dashboard in headless chromium against a live `conveyor serve` on PostgreSQL: log in with a token,
watch a queue drain, open a dead letter and replay it with its button, and see what a producer token gets.

Every test takes screenshots (to ``$CONVEYOR_SCREENSHOTS`` when set, else the test's tmp dir); docs/dashboard.png
is one of them."""

from __future__ import annotations

import re
import time
from pathlib import Path
from uuid import UUID

import pytest
from playwright.sync_api import BrowserContext, Page, expect
from tests.dashboard.conftest import log_in, shot, stop_worker, worker
from tests.http.conftest import Server

from conveyor import App, JobNotFoundError, Message

DRAIN_JOBS = 400
#: Jobs sent in each of MORE_BURSTS bursts, a second apart, while the worker drains.
MORE_JOBS, MORE_BURSTS = 50, 6
TOTAL = DRAIN_JOBS + MORE_JOBS * MORE_BURSTS
#: An error message that would run a script if it were put on the page as HTML.
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def cell(page: Page, queue: str, field: str) -> str:
    return page.locator(f'tr[data-queue="{queue}"] [data-field="{field}"]').inner_text().strip()


def make_dead_letters(server: Server, tmp_path: Path, messages: list[str]) -> list[UUID]:
    """Send one ``dash.boom`` job per message and let a worker dead-letter them (ValueError is permanent)."""
    with App(server.db) as app:
        ids = [app.send("dash.boom", {"message": m}, queue="fragile").id for m in messages]
    proc = worker(server, tmp_path, "--burst", "--queues", "fragile")
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        stop_worker(proc)
    with App(server.db) as app:
        assert all(app.job(i).state == "dead" for i in ids)
    return ids


def test_log_in_and_watch_a_queue_drain(served: Server, context: BrowserContext, tmp_path: Path) -> None:
    with App(served.db) as app:
        app.send_many([Message("dash.work", {"n": n}, queue="drain") for n in range(DRAIN_JOBS)])
    make_dead_letters(served, tmp_path, ["card declined", HOSTILE])

    page = log_in(context, served, "operator")
    row = page.locator('tr[data-queue="drain"]')
    expect(row).to_be_visible()
    expect(row.locator('[data-field="depth"]')).to_have_text(str(DRAIN_JOBS))
    expect(page.locator('tr[data-queue="fragile"] [data-field="dead"]')).to_have_text("2")
    # The charts poll the JSON API with the session cookie: wait for two polls, so that rates are drawn.
    expect(page.locator("#queues")).to_have_attribute("data-polls", re.compile(r"^[2-9]|\d\d"))
    # The alert loop sees the dead letters, and ready jobs that no worker drains.
    expect(page.locator('#alerts li[data-rule="dlq_depth"]')).to_contain_text("fragile", timeout=20_000)
    expect(page.locator('#alerts li[data-rule="no_worker"]')).to_contain_text("drain", timeout=20_000)
    shot(page, tmp_path, "dashboard-before-drain")

    proc = worker(served, tmp_path, "--queues", "drain", "--concurrency", "2")
    try:
        depths: set[int] = set()
        enqueue_rates: set[str] = set()
        completion_rates: set[str] = set()

        held: set[str] = set()

        def sample() -> None:
            # One read of every link at once: the panel is swapped under the test every few seconds.
            held.update(page.locator("#workers td.in-flight a").evaluate_all("links => links.map(a => a.title)"))
            depths.add(int(cell(page, "drain", "depth")))
            enqueue_rates.add(cell(page, "drain", "enqueue_rate"))
            completion_rates.add(cell(page, "drain", "completion_rate"))

        # More jobs arrive while the worker drains the queue, so that both rates move.
        with App(served.db) as app:
            for burst in range(MORE_BURSTS):
                app.send_many([Message("dash.work", {"n": burst * 1000 + n}, queue="drain") for n in range(MORE_JOBS)])
                for _ in range(4):
                    sample()
                    time.sleep(0.25)
        # The worker reported itself: the workers panel lists it, alive, on its queue.
        worker_row = page.locator("#workers tbody tr").first
        expect(worker_row).to_contain_text("alive")
        expect(worker_row).to_contain_text("drain")
        expect(page.locator('#alerts li[data-rule="no_worker"]')).to_have_count(0, timeout=20_000)
        shot(page, tmp_path, "dashboard-draining")
        expect(row.locator('[data-field="depth"]')).to_have_text("0", timeout=90_000)
        expect(row.locator('[data-field="completed"]')).to_have_text(str(TOTAL))
        sample()
    finally:
        stop_worker(proc)
    # The page's numbers moved on their own, without a reload, through values between full and empty.
    assert any(0 < depth < TOTAL for depth in depths), depths
    assert 0 in depths
    assert any(r not in ("…", "0.0") for r in completion_rates), completion_rates
    assert any(r not in ("…", "0.0") for r in enqueue_rates), enqueue_rates
    points = page.locator('tr[data-queue="drain"] svg[data-chart="depth"] polyline').get_attribute("points")
    assert points is not None and len(points.split()) >= 5
    for name in ("completion_rate", "enqueue_rate"):
        chart = page.locator(f'tr[data-queue="drain"] svg[data-chart="{name}"]')
        assert float(chart.get_attribute("data-max") or 0) > 0, name
    # The workers panel is refreshed with the numbers: it showed the jobs the worker held, and then none.
    assert held and all(UUID(job_id) for job_id in held), held
    expect(page.locator('[data-inflight-queue="drain"]')).to_have_text("0")
    page.wait_for_timeout(4000)  # two more polls, so that the charts show the drain ending
    shot(page, tmp_path, "dashboard")


def test_open_a_dead_letter_and_replay_it_with_the_button(
    served: Server, context: BrowserContext, tmp_path: Path
) -> None:
    first, hostile = make_dead_letters(served, tmp_path, ["card declined", HOSTILE])
    page = log_in(context, served, "operator", "/dead-letters?queue=fragile")
    rows = page.locator("#dead-letters tbody tr")
    expect(rows).to_have_count(2)
    # The hostile message is shown as text, and ran nothing.
    expect(page.locator(f'tr[data-id="{hostile}"] .error-cell')).to_contain_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None

    # The filters narrow the list: by error type, by task.
    page.fill("#filters input[name=error_type]", "KeyError")
    page.click("#filters button[type=submit]")
    expect(page.locator("#empty")).to_contain_text("No dead letter matches these filters")
    page.fill("#filters input[name=error_type]", "ValueError")
    page.fill("#filters input[name=task]", "dash.boom")
    page.click("#filters button[type=submit]")
    expect(rows).to_have_count(2)
    assert "error_type=ValueError" in page.url and "task=dash.boom" in page.url

    page.click(f'tr[data-id="{first}"] a.open')
    expect(page.locator("#error-type")).to_have_text("ValueError")
    expect(page.locator("#error-message")).to_have_text("card declined")
    expect(page.locator("#traceback")).to_contain_text("raise ValueError(")
    expect(page.locator("#payload")).to_contain_text('"message": "card declined"')
    expect(page.locator("#task")).to_have_text("dash.boom")
    expect(page.locator("#purge")).to_have_count(0)  # purge is for admin tokens
    expect(page.locator("#no-actions")).to_have_text("Purge needs an admin token.")
    shot(page, tmp_path, "dead-letter")

    page.fill("form[action$='/replay'] input[name=reason]", "the card service is back")
    page.click("#replay")
    expect(page.locator(".notice")).to_contain_text("replayed as job")
    # It left the DLQ: the browser lists only the other one.
    expect(page.locator("#dead-letters tbody tr")).to_have_count(1)
    expect(page.locator(f'tr[data-id="{first}"]')).to_have_count(0)
    shot(page, tmp_path, "dead-letters-after-replay")
    with App(served.db) as app:
        remaining = [d.id for d in app.admin.dead_letters(queue="fragile")]
        assert remaining == [hostile]
        replayed = app.job(first)
        assert replayed.replayed_by is not None
        new = app.job(replayed.replayed_by)
        assert new.replay_of == first and new.state == "pending" and new.queue == "fragile"
        entry = app.admin.audit(10)[0]
        assert entry.actor == "ops" and entry.reason == "the card service is back" and first in entry.job_ids

    # The new job's page links back to the dead letter it replays; the history names the replay.
    page.goto(f"{served.url}/jobs/{first}")
    expect(page.locator("#replayed-by")).to_have_text(str(replayed.replayed_by))
    expect(page.locator("#history")).to_contain_text("by ops: the card service is back")
    shot(page, tmp_path, "job")


def test_a_producer_token_gets_no_replay_button_and_is_refused(
    served: Server, context: BrowserContext, tmp_path: Path
) -> None:
    (dead,) = make_dead_letters(served, tmp_path, ["card declined"])
    page = log_in(context, served, "producer", f"/dead-letters/{dead}")
    expect(page.locator("h1")).to_have_text("Not allowed")
    expect(page.locator(".error")).to_contain_text("producer token")
    expect(page.locator("#replay")).to_have_count(0)
    expect(page.locator("#purge")).to_have_count(0)
    shot(page, tmp_path, "producer-dead-letter")

    # The producer reads the jobs it sent (through the API, which stamps them with its token's name).
    sent = page.request.post(
        f"{served.url}/v1/queues/drain/jobs",
        data={"task": "dash.work", "payload": {"n": 7}},
        headers={"Authorization": f"Bearer {served.tokens['producer']}"},
    )
    assert sent.status == 202, sent.text()
    page.goto(f"{served.url}/jobs/{sent.json()['id']}")
    expect(page.locator("#state")).to_have_text("pending")
    expect(page.locator("#task")).to_have_text("dash.work")
    expect(page.locator("#headers")).to_contain_text('"sent_by": "shop"')

    # The job page of a job the producer did not send is not revealed either.
    page.goto(f"{served.url}/jobs/{dead}")
    expect(page.locator("h1")).to_have_text("Not found")
    expect(page.locator("#replay")).to_have_count(0)

    # The overview shows no queues to a producer (reading queues is for operators).
    page.goto(served.url + "/")
    expect(page.locator("#queues")).to_have_count(0)

    # Posting the replay form anyway, with the session's own valid CSRF token, is refused by the server.
    csrf = page.locator("form[action='/logout'] input[name=csrf]").get_attribute("value")
    assert csrf
    refused = page.request.post(
        f"{served.url}/dead-letters/{dead}/replay", form={"csrf": csrf, "reason": "sneaky"}, max_redirects=0
    )
    assert refused.status == 403, refused.text()
    assert "producer" in refused.text()
    refused = page.request.post(f"{served.url}/dead-letters/{dead}/purge", form={"csrf": csrf}, max_redirects=0)
    assert refused.status == 403
    with App(served.db) as app:
        status = app.admin.dead_letter(dead)
        assert status.replayed_by is None

    # An admin sees both buttons; purging with the button deletes the dead letter for good.
    admin_page = log_in(context.browser.new_context(), served, "admin", f"/dead-letters/{dead}")  # type: ignore[union-attr]
    expect(admin_page.locator("#replay")).to_be_visible()
    expect(admin_page.locator("#purge")).to_be_visible()
    admin_page.click("#purge")
    assert admin_page.url.endswith(f"/dead-letters/{dead}")  # purging for good needs a reason: nothing sent
    admin_page.fill("form[action$='/purge'] input[name=reason]", "test data")
    admin_page.click("#purge")
    expect(admin_page.locator(".notice")).to_contain_text("purged 1 dead letter")
    with App(served.db) as app, pytest.raises(JobNotFoundError):
        app.job(dead)
    admin_page.context.close()
