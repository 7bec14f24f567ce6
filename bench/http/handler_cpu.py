"""The HTTP service's own CPU per request, without uvicorn: ``.venv/bin/python bench/http/handler_cpu.py``.

1. The plain ASGI ``send`` path (``POST /v1/queues/bench/jobs``: token from the cache, JSON parse, message,
   ``prepare``, the 202) called in a loop on an embedded SQLite App, with the group commit's ``submit``
   replaced by a stub: the handler's CPU per request.
2. ``Producer.insert_prepared`` of groups of 8, 32 and 64 jobs in a loop on a default-configured PostgreSQL
   cluster of its own: the group insert's CPU per job (best of 5) and its wall time per group.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._cluster import Cluster

BODY = b'{"task":"bench.noop","payload":{"user_id":42,"template":"welcome"}}'


def handler_cpu(n: int) -> float:
    from starlette.types import Message, Scope

    from conveyor import App
    from conveyor.http._api import Service, ServiceConfig

    with tempfile.TemporaryDirectory() as tmp:
        app = App(f"sqlite:///{tmp}/h.db")
        app.backend.migrate()
        _, bearer = app.admin.create_token("bench", role="producer", actor="bench")
        service = Service(app, ServiceConfig())

        class Stub:
            async def submit(self, job: Any) -> Any:
                return job.id

        service.group = Stub()  # type: ignore[assignment]
        headers = [
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer " + bearer.encode()),
            (b"content-length", str(len(BODY)).encode()),
        ]
        scope: Scope = {"type": "http", "method": "POST", "path": "/v1/queues/bench/jobs", "headers": headers}

        async def receive() -> Message:
            return {"type": "http.request", "body": BODY, "more_body": False}

        answers: list[Message] = []

        async def send(message: Message) -> None:
            answers.append(message)

        async def run() -> float:
            await service.token_of("Bearer " + bearer)  # reads the token once: later requests hit the cache
            for _ in range(1000):
                await service.send(scope, receive, send)
            assert answers[0]["status"] == 202, answers[:2]
            cpu0 = time.process_time()
            for _ in range(n):
                await service.send(scope, receive, send)
            return (time.process_time() - cpu0) / n

        try:
            return asyncio.run(run())
        finally:
            app.close()


def insert_cpu(db: str) -> None:
    from conveyor import App, Message

    app = App(db)
    app.backend.migrate()
    for size in (8, 32, 64):
        best, wall = 1e9, 0.0
        for _ in range(5):
            jobs = [
                app.producer.prepare(Message(task="bench.noop", queue="bench", payload={"user_id": 42}))
                for _ in range(size * 50)
            ]
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for i in range(0, len(jobs), size):
                app.producer.insert_prepared(jobs[i : i + size])
            best = min(best, (time.process_time() - cpu0) / len(jobs))
            wall = (time.perf_counter() - wall0) / 50
        print(f"group insert of {size}: {1e6 * best:.1f} µs of CPU per job (best of 5), {1000 * wall:.2f} ms per group")
    app.close()


def main() -> None:
    print(f"handler: {1e6 * handler_cpu(20_000):.1f} µs of CPU per request (group commit stubbed)")
    cluster = Cluster()
    try:
        insert_cpu(cluster.database("handler_cpu"))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
