"""Procrastinate's producer side: ``Task.batch_defer_async`` is its bulk API (one statement)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any


class Adapter:
    name = "procrastinate"
    uses_postgres = True

    def __init__(self, db: str, redis: str, options: dict[str, Any]) -> None:
        os.environ["BENCH_DATABASE_URL"] = db
        from bench.apps import procrastinate_app

        self.db = db
        self.app = procrastinate_app.app
        self.task = procrastinate_app.noop
        self.loop = asyncio.new_event_loop()
        self.opened = self.app.open_async()
        self.loop.run_until_complete(self.opened.__aenter__())
        self.loop.run_until_complete(self.app.schema_manager.apply_schema_async())

    def version(self) -> str:
        from importlib.metadata import version

        return version("procrastinate")

    def bulk(self, payloads: list[dict[str, Any]]) -> None:
        self.loop.run_until_complete(self.task.batch_defer_async(*payloads))

    def single(self, payload: dict[str, Any]) -> None:
        self.loop.run_until_complete(self.task.defer_async(**payload))

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "bench.apps.procrastinate_app"]

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_DATABASE_URL": self.db}

    def close(self) -> None:
        self.loop.run_until_complete(self.opened.__aexit__(None, None, None))
        self.loop.close()
