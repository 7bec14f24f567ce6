"""schemathesis against the OpenAPI document a live `conveyor serve` serves, on SQLite and PostgreSQL:
no generated input (valid or not) gets a 5xx, and the database holds exactly the jobs that got a 2xx."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from psycopg import sql
from schemathesis import GenerationMode
from tests.http.conftest import POSTGRES, Server, make_tokens, start, stop

from conveyor import App

ACCEPTED: dict[str, set[str]] = {}


def _job_ids(body: Any) -> set[str]:
    """The ids of the jobs a 2xx response says were enqueued (sent, batched, published, replayed)."""
    if not isinstance(body, dict):
        return set()
    found: set[str] = set()
    if isinstance(body.get("id"), str) and "queue" in body and "duplicate" in body:
        found.add(body["id"])
    for item in body.get("jobs") or []:
        found.add(item["id"] if isinstance(item, dict) else item)
    for pair in body.get("replayed") or []:
        found.add(pair["new_id"])
    return found


def _stored(db: str) -> set[str]:
    with App(db) as app:
        backend = app.backend
        from conveyor.backends.base import ArchiveReadParams, JobsListParams

        live = {str(r.id) for r in backend.jobs_list(JobsListParams(limit=1_000_000))}
        archived = {str(r.id) for r in backend.archive_read(ArchiveReadParams(None, limit=1_000_000))}
    return live | archived


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("schemathesis")
    name = None
    if request.param == "sqlite":
        db = f"sqlite:///{tmp}/conveyor.db"
    else:
        name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        db = f"{POSTGRES.rpartition('/')[0]}/{name}"
    tokens = make_tokens(db)
    server = start(db, tmp, "--max-body-bytes", str(1024 * 1024))
    server.tokens = tokens
    ACCEPTED[server.url] = set()
    try:
        yield server
        assert server.proc.poll() is None, server.stderr()
        # Exactly the jobs that got a 2xx: nothing lost, nothing extra.
        assert _stored(db) == ACCEPTED[server.url]
    finally:
        stop(server)
        if name is not None:
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_5xx_and_only_2xx_jobs_are_stored(live: Server, mode: GenerationMode) -> None:
    api = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    auth = {"Authorization": f"Bearer {live.tokens['admin']}"}
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=live.url, headers=auth, timeout=30)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
            )
            if 200 <= response.status_code < 300 and response.content:
                ACCEPTED[live.url] |= _job_ids(response.json())

        try:
            run()
        except Unsatisfiable:
            # An operation with nothing to make invalid (GET /healthz takes no input).
            assert mode is GenerationMode.NEGATIVE and not operation.body and not operation.query
