"""Dramatiq's producer side: ``group(...).run()`` (it enqueues the messages one by one; Dramatiq
has no bulk enqueue)."""

from __future__ import annotations

import sys
from typing import Any


class Adapter:
    name = "dramatiq"
    uses_postgres = False

    def __init__(self, db: str, redis: str, options: dict[str, Any]) -> None:
        import os

        os.environ["BENCH_REDIS_URL"] = redis
        import redis as redis_lib

        redis_lib.Redis.from_url(redis).flushdb()
        from bench.apps import dramatiq_app

        self.redis = redis
        self.actor = dramatiq_app.noop
        self.broker = dramatiq_app.broker

    def version(self) -> str:
        from importlib.metadata import version

        return version("dramatiq")

    def bulk(self, payloads: list[dict[str, Any]]) -> None:
        from dramatiq import group

        group(self.actor.message_with_options(kwargs=p) for p in payloads).run()

    def single(self, payload: dict[str, Any]) -> None:
        self.actor.send_with_options(kwargs=payload)

    def worker_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "dramatiq", "bench.apps.dramatiq_app", "--processes", "1", "--threads", "10",
            "--queues", "bench",
        ]  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_REDIS_URL": self.redis}

    def close(self) -> None:
        self.broker.close()
