"""A live `conveyor serve` (a real subprocess on a free port) on SQLite and on PostgreSQL, with tokens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from conveyor import App

REPO = Path(__file__).resolve().parents[2]
POSTGRES = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
APP_PATH = "tests.http.http_app:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running service: its URL, database, tokens by role, and its stderr so far."""

    url: str
    db: str
    proc: subprocess.Popen[bytes]
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, role: str | None = None, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, **kwargs)  # type: ignore[arg-type]

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def start(db: str, tmp: Path, *args: str, app_path: str | None = APP_PATH, wait_ready: bool = True) -> Server:
    """Start `conveyor serve` on a free port and wait until /healthz answers."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    argv = [sys.executable, "-m", "conveyor", "--db", db]
    if app_path:
        argv += ["--app", app_path]
    argv += ["serve", "--port", str(port), "--token-cache", "0", *args]
    # src/ first: the checkout under test, not whichever one the environment's editable install names.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    server = Server(f"http://127.0.0.1:{port}", db, proc, log)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"conveyor serve exited {proc.returncode}: {server.stderr()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop(server)
            raise AssertionError(f"conveyor serve did not answer in 30 s: {server.stderr()}")
        time.sleep(0.1)
    if wait_ready:
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200, server.stderr()
    return server


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


def make_tokens(db: str) -> dict[str, str]:
    """An admin, an operator, two producers (one limited to queue 'emails') and a scoped operator."""
    with App(db, migrate=True) as app:
        app.admin.migrate()
        made = {
            "admin": app.admin.create_token("root", "admin", actor="test")[1],
            "operator": app.admin.create_token("ops", "operator", actor="test")[1],
            "producer": app.admin.create_token("shop", "producer", actor="test")[1],
            "producer2": app.admin.create_token("billing", "producer", actor="test")[1],
            "emails": app.admin.create_token("mailer", "producer", queues=["emails"], actor="test")[1],
            "emails_ops": app.admin.create_token("mail-ops", "operator", queues=["emails"], actor="test")[1],
        }
    return made


@contextmanager
def serving(db: str, tmp: Path, *args: str) -> Iterator[Server]:
    """`conveyor serve` on ``db`` (options ``args``) with the test tokens in ``tokens``; stopped at the end."""
    tokens = make_tokens(db)
    running = start(db, tmp, *args)
    running.tokens = tokens
    try:
        yield running
    finally:
        stop(running)


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """`conveyor serve` with auth on the embedded SQLite engine and on PostgreSQL."""
    with serving(database_url, tmp_path, "--max-body-bytes", str(1024 * 1024)) as running:
        yield running
