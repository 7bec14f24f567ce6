"""A replay's rate (finite, 0.01 to 1,000,000 jobs per second; over HTTP, at most 20 s of pacing) and the
reach of a token limited to queues when it names dead letters by id: in the operator API and over HTTP."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.conftest import make_dead_letters
from tests.http.conftest import Server, make_tokens, start, stop

from conveyor import App, ConfigurationError, Reject
from conveyor.testing import drain


def unreplayed(db: str, queue: str) -> set[str]:
    with App(db) as app:
        return {str(s.id) for s in app.admin.dead_letters(queue=queue)}


def test_the_operator_api_refuses_a_rate_that_is_not_finite_or_out_of_range(sqlite_url: str) -> None:
    dead = make_dead_letters(sqlite_url, 2)
    with App(sqlite_url) as app:
        # 1e-6 waited 11 days between the two jobs; NaN fails every comparison; True is an int to Python.
        for rate in (math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-6, 0.009, 1_000_001.0, True, 10**400, "fast"):
            with pytest.raises(ConfigurationError, match=r"^rate "):
                app.admin.replay(dead, reason="r", actor="test", rate=rate)
        # The waits come between chunks: two jobs at 0.1 per second wait 10 s once.
        with pytest.raises(ConfigurationError, match=r"^rate 0.1 per second would spread .* over 10 s"):
            app.admin.replay(dead, reason="r", actor="test", rate=0.1, max_seconds=5)
        assert unreplayed(sqlite_url, "doomed") == set(dead), "a refused replay wrote nothing"
        # One chunk of two at 2 per second: no wait at all, so any bound is met.
        done = app.admin.replay(dead, reason="r", actor="test", rate=2, max_seconds=0)
        assert sorted(str(d) for d, _ in done.replayed) == sorted(dead)


@pytest.fixture
def served(sqlite_url: str, tmp_path: Path) -> Iterator[Server]:
    """`conveyor serve` on SQLite (what is tested here does not depend on the engine), with tokens."""
    tokens = make_tokens(sqlite_url)
    with App(sqlite_url) as app:
        tokens["emails_admin"] = app.admin.create_token("mail-root", "admin", queues=["emails"], actor="test")[1]
    running = start(sqlite_url, tmp_path)
    running.tokens = tokens
    try:
        yield running
    finally:
        stop(running)


def _bad_rate(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == "rate", error
    return str(error["message"])


def test_http_refuses_a_rate_out_of_range_or_whose_pacing_would_hold_the_request(served: Server) -> None:
    dead = make_dead_letters(served.db, 2)
    with served.client("operator") as ops:

        def replay(rate: object) -> httpx.Response:
            return ops.post("/v1/dead-letters:replay", json={"ids": dead, "reason": "r", "rate": rate})

        for rate in (0, -5, 1e-6, 0.009, 2_000_000):
            assert "0.01 to 1000000" in _bad_rate(replay(rate))
        for rate in ("fast", [1], True):  # refused by the operator API's own check, by name
            assert "finite number" in _bad_rate(replay(rate))
        # A 400-digit integer is valid JSON; converting it to a float raised OverflowError (a 500).
        huge = ops.post(
            "/v1/dead-letters:replay",
            content='{"ids": ' + json.dumps(dead) + ', "reason": "r", "rate": ' + "9" * 400 + "}",
            headers={"content-type": "application/json"},
        )
        assert "0.01 to 1000000" in _bad_rate(huge)
        # Two jobs at 0.04 per second wait 25 s between them: past the 20 s a request may be held.
        message = _bad_rate(replay(0.04))
        assert "25 s" in message and "20 s" in message and "conveyor dlq replay" in message
        assert unreplayed(served.db, "doomed") == set(dead)
        done = replay(100)
        assert done.status_code == 200, done.text
        assert sorted(p["dead_id"] for p in done.json()["replayed"]) == sorted(dead)


def test_a_bad_reason_is_a_400_that_names_the_field(served: Server) -> None:
    # Before: the 400 had no "field" (every other refused field of these requests names itself).
    dead = make_dead_letters(served.db, 1)
    with served.client("admin") as admin:
        for path in ("/v1/dead-letters:replay", "/v1/dead-letters:purge"):
            for reason in (" ", "r" * 2001, "a\u0000b"):
                answer = admin.post(path, json={"ids": dead, "reason": reason})
                assert answer.status_code == 400, answer.text
                error = answer.json()["error"]
                assert error["field"] == "reason" and error["message"].startswith("reason "), error
    assert unreplayed(served.db, "doomed") == set(dead)


def test_a_token_limited_to_queues_learns_nothing_from_replaying_another_queues_ids(served: Server) -> None:
    # Replaying a dead letter of another queue by id answered 403 naming that queue, while GET of the
    # same id answered 404: the token learnt that the id exists and where.
    mine = make_dead_letters(served.db, 1, queue="emails")
    other = make_dead_letters(served.db, 2, queue="billing")
    unknown = str(uuid.uuid4())
    with served.client("emails_ops") as scoped:
        assert scoped.get(f"/v1/dead-letters/{other[0]}").status_code == 404
        for ids in ([other[0]], [unknown]):
            answer = scoped.post("/v1/dead-letters:replay", json={"ids": ids, "reason": "r"})
            assert (answer.status_code, answer.json()) == (200, {"replayed": [], "skipped": ids}), answer.text
        mixed = scoped.post("/v1/dead-letters:replay", json={"ids": [other[1], mine[0], unknown], "reason": "r"})
        assert mixed.status_code == 200, mixed.text
        assert [p["dead_id"] for p in mixed.json()["replayed"]] == mine
        assert mixed.json()["skipped"] == [other[1], unknown]
    with served.client("emails_admin") as scoped_admin:
        for ids in ([other[0]], [unknown]):
            answer = scoped_admin.post("/v1/dead-letters:purge", json={"ids": ids, "reason": "r"})
            assert (answer.status_code, answer.json()) == (200, {"purged": 0, "selected": 1}), answer.text
    assert unreplayed(served.db, "billing") == set(other), "another queue's dead letters were not touched"
    with served.client("operator") as ops:
        # A token of every queue still replays them.
        everyone = ops.post("/v1/dead-letters:replay", json={"ids": other, "reason": "r"})
        assert len(everyone.json()["replayed"]) == 2, everyone.text


def test_a_replay_by_filter_re_enqueues_the_dead_letters_in_their_original_order(served: Server) -> None:
    # Dead letters are listed newest first, and a replay by filter minted the new ids in that order:
    # jobs of one ordering key then ran newest first (4 3 2 1 0) after the replay.
    ran: list[int] = []
    with App(served.db) as app:

        @app.task(name="fifo", queue="fifo", max_attempts=1)
        def fifo(n: int) -> None:
            if not ran_once:
                raise Reject("first time")
            ran.append(n)

        ran_once = False
        for n in range(5):
            app.send("fifo", {"n": n}, ordering_key="customer-1")
        assert drain(app, ["fifo"]).dead == 5
        with served.client("operator") as ops:
            done = ops.post("/v1/dead-letters:replay", json={"queue": "fifo", "reason": "fixed"})
            assert done.status_code == 200, done.text
            assert len(done.json()["replayed"]) == 5
        ran_once = True
        assert drain(app, ["fifo"]).completed == 5
    assert ran == [0, 1, 2, 3, 4]
