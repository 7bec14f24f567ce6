"""The documented alert ``conveyor_database_up == 0`` can fire with auth on: while PostgreSQL cannot be
reached, /metrics judges a token as it was last read (a real service, its database behind a proxy that
is cut), and a revoke made while the database was up still holds."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.chaos._proxy import TcpProxy
from tests.http.conftest import free_port, serving

from conveyor import App


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}", query="connect_timeout=2"))


def test_metrics_answers_database_up_0_to_a_token_seen_before_while_the_database_is_away(
    postgres_database: str, tmp_path: Path
) -> None:
    target = urlsplit(postgres_database)
    with (
        TcpProxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy,
        # --token-cache 0 (the helper's): every request reads its token, as one does once 5 s passed.
        serving(_through(postgres_database, proxy.port), tmp_path) as server,
    ):
        with App(postgres_database) as app:
            server.tokens["ops2"] = app.admin.create_token("ops2", "operator", actor="test")[1]
        with server.client("operator") as ops, server.client("ops2") as revoked:
            assert "conveyor_database_up 1.0" in ops.get("/metrics").text
            assert revoked.get("/metrics").status_code == 200
            with App(postgres_database) as app:
                app.admin.revoke_token("ops2", actor="test")
            assert revoked.get("/metrics").status_code == 401  # revoked while the database is up
            # The database goes away: nothing listens where the proxy forwards, every connection cut.
            proxy.target = ("127.0.0.1", free_port())
            proxy.cut()
            scrape = ops.get("/metrics")
            # Before: 503 (checking the token needed the database), so the alert could never fire.
            assert scrape.status_code == 200, scrape.text
            assert "conveyor_database_up 0.0" in scrape.text
            assert revoked.get("/metrics").status_code == 401  # the last verdict known: revoked
            with server.client("admin") as never_seen:
                assert never_seen.get("/metrics").status_code == 503  # no verdict known: cannot tell
            assert ops.get("/v1/queues").status_code == 503  # only /metrics judges by the last verdict


def test_metrics_answers_database_up_0_within_a_scrape_timeout_while_the_database_does_not_answer(
    postgres_database: str, tmp_path: Path
) -> None:
    """A database that holds its connections open and answers nothing (a server frozen, a network that
    swallows every byte) is away too: the scrape answers ``conveyor_database_up 0`` before Prometheus's
    default scrape timeout (10 s), every time, and reads the database again once it answers."""
    target = urlsplit(postgres_database)
    with (
        TcpProxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy,
        serving(_through(postgres_database, proxy.port), tmp_path) as server,
        server.client("operator") as ops,
        server.client("admin") as never_seen,
    ):
        assert "conveyor_database_up 1.0" in ops.get("/metrics").text
        proxy.swallowing = True
        for _ in range(2):  # the first waits for the token read, the second does not
            # Before: the first scrape hung (httpx.ReadTimeout here; for as long as the socket stays open).
            scrape = ops.get("/metrics", timeout=10.0)
            assert scrape.status_code == 200, scrape.text
            assert "conveyor_database_up 0.0" in scrape.text
        assert never_seen.get("/metrics", timeout=10.0).status_code == 503  # no verdict known: cannot tell
        proxy.swallowing = False
        proxy.cut()  # the connections that lost their bytes fail; new ones answer
        deadline = time.monotonic() + 20
        while "conveyor_database_up 1.0" not in (text := ops.get("/metrics").text):
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
