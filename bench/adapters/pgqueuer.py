"""PgQueuer's producer side: ``Queries.enqueue`` with lists is its bulk API (one statement)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


class Adapter:
    name = "pgqueuer"
    uses_postgres = True

    def __init__(self, db: str, redis: str, options: dict[str, Any]) -> None:
        import psycopg
        from pgqueuer import PsycopgDriver, Queries

        self.db = db
        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(psycopg.AsyncConnection.connect(db, autocommit=True))
        self.queries = Queries(PsycopgDriver(self.conn))
        self.loop.run_until_complete(self.queries.install())

    def version(self) -> str:
        from importlib.metadata import version

        return version("pgqueuer")

    def bulk(self, payloads: list[dict[str, Any]]) -> None:
        n = len(payloads)
        blobs: list[bytes | None] = [json.dumps(p).encode() for p in payloads]
        self.loop.run_until_complete(self.queries.enqueue(["noop"] * n, blobs, [0] * n))

    def single(self, payload: dict[str, Any]) -> None:
        self.loop.run_until_complete(self.queries.enqueue("noop", json.dumps(payload).encode()))

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "bench.apps.pgqueuer_app"]

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_DATABASE_URL": self.db}

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()
