"""Celery's producer side: ``group(...).apply_async()`` is its closest thing to a bulk API."""

from __future__ import annotations

import sys
from typing import Any


class Adapter:
    name = "celery"
    uses_postgres = False

    def __init__(self, db: str, redis: str, options: dict[str, Any]) -> None:
        import os

        os.environ["BENCH_REDIS_URL"] = redis
        import redis as redis_lib

        redis_lib.Redis.from_url(redis).flushdb()
        from bench.apps import celery_app

        self.redis = redis
        self.task = celery_app.noop
        self.app = celery_app.app

    def version(self) -> str:
        from importlib.metadata import version

        return version("celery")

    def bulk(self, payloads: list[dict[str, Any]]) -> None:
        from celery import group

        group(self.task.s(**p) for p in payloads).apply_async()

    def single(self, payload: dict[str, Any]) -> None:
        self.task.apply_async(kwargs=payload)

    def worker_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "bench.apps.celery_app", "worker", "-P", "threads", "-c", "10",
            "-Q", "bench", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING",
        ]  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_REDIS_URL": self.redis}

    def close(self) -> None:
        self.app.close()
