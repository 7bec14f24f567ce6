"""RQ's producer side: ``Queue.enqueue_many`` (one Redis pipeline) is its bulk API."""

from __future__ import annotations

import os
import sys
from typing import Any


class Adapter:
    name = "rq"
    uses_postgres = False

    def __init__(self, db: str, redis: str, options: dict[str, Any]) -> None:
        import redis as redis_lib
        from rq import Queue

        self.redis = redis
        self.conn = redis_lib.Redis.from_url(redis)
        self.conn.flushdb()
        self.Queue = Queue
        self.queue = Queue("bench", connection=self.conn)
        from bench.apps.rq_app import noop

        self.fn = noop

    def version(self) -> str:
        from importlib.metadata import version

        return version("rq")

    def bulk(self, payloads: list[dict[str, Any]]) -> None:
        self.queue.enqueue_many([self.Queue.prepare_data(self.fn, kwargs=p) for p in payloads])

    def single(self, payload: dict[str, Any]) -> None:
        self.queue.enqueue(self.fn, kwargs=payload)

    def worker_argv(self) -> list[str]:
        rq = os.path.join(os.path.dirname(sys.executable), "rq")
        return [
            rq,
            "worker",
            "-w",
            "rq.worker.SimpleWorker",
            "--url",
            self.redis,
            "--logging_level",
            "WARNING",
            "bench",
        ]

    def worker_env(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        self.conn.close()
