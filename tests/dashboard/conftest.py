"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright, against a live
`conveyor serve` subprocess on PostgreSQL. A missing chromium is a failure (scripts/test.sh installs it),
never a skip; Playwright never downloads a browser of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright
from tests.http.conftest import Server, start, stop

from conveyor import App

REPO = Path(__file__).resolve().parents[2]
APP_PATH = "tests.dashboard.dash_app:app"


def chromium_path() -> str:
    """Debian's chromium (``apt-get install chromium``), or ``$CONVEYOR_TEST_CHROMIUM``."""
    for candidate in (os.environ.get("CONVEYOR_TEST_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("the dashboard tests need Debian's chromium: apt-get install chromium (scripts/test.sh does)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Module scope: Playwright's sync API runs an event loop of its own, which must be gone before tests of
    # other modules call asyncio.run().
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def served(postgres_database: str, tmp_path: Path) -> Iterator[Server]:
    """`conveyor serve --app tests.dashboard.dash_app:app` on a fresh PostgreSQL database, with an admin, an
    operator and a producer token, evaluating alerts every second."""
    with App(postgres_database, migrate=True) as app:
        app.admin.migrate()
        tokens = {
            role: app.admin.create_token(name, role, actor="test")[1]
            for name, role in (("root", "admin"), ("ops", "operator"), ("shop", "producer"))
        }
    # Alerts are evaluated every second, so that the dashboard shows them fire and resolve within a test.
    running = start(postgres_database, tmp_path, "--alert-interval", "1", app_path=APP_PATH)
    running.tokens = tokens
    try:
        yield running
    finally:
        stop(running)


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    made = browser.new_context(viewport={"width": 1440, "height": 900})
    made.set_default_timeout(15_000)
    try:
        yield made
    finally:
        made.close()


def log_in(context: BrowserContext, server: Server, role: str, path: str = "/") -> Page:
    """Open ``path``, get sent to the login form, paste the token of ``role``, land back on ``path``."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url + path)
    assert "/login" in page.url, page.url
    page.fill("input[name=token]", server.tokens[role])
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)
    assert errors == [], errors
    return page


def shot(page: Page, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot, to ``$CONVEYOR_SCREENSHOTS`` when set (to look at, or for docs/), else tmp_path."""
    directory = Path(os.environ.get("CONVEYOR_SCREENSHOTS") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a real rendering, not a blank page
    return path


def worker(server: Server, tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """``conveyor worker`` for the dashboard app, in its own process, logging to a file."""
    log = open(tmp_path / f"worker-{len(list(tmp_path.glob('worker-*')))}.log", "wb")  # noqa: SIM115
    argv = [sys.executable, "-m", "conveyor", "--db", server.db, "worker", APP_PATH, *args]
    # src/ first: the checkout under test, not whichever one the environment's editable install names.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
