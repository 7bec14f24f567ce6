"""Conveyor's producer side and worker command for the driver."""

from __future__ import annotations

import os
import sys
from typing import Any


class Adapter:
    name = "conveyor"
    uses_postgres = True

    def __init__(self, db: str, redis: str, options: dict[str, Any]) -> None:
        os.environ["CONVEYOR_DATABASE_URL"] = db
        from bench.apps import conveyor_app
        from conveyor import Message

        self.db = db
        self.app = conveyor_app.app
        self.task = conveyor_app.noop_sync if options.get("sync") else conveyor_app.noop
        self.Message = Message
        self.processes = int(options.get("processes", 1))
        self.durable_acks = bool(options.get("durable_acks"))
        self.prefetch = int(options.get("prefetch", 0))
        # --pin for one figure (options) or, for an A/B, every worker of a variant ($BENCH_PIN=1).
        self.pin = bool(options.get("pin")) or os.environ.get("BENCH_PIN") == "1"
        if not db.startswith("sqlite"):  # the embedded default migrates on first use; a server does not
            self.app.backend.migrate()

    def version(self) -> str:
        from importlib.metadata import version

        return version("conveyor")

    def bulk(self, payloads: list[dict[str, Any]]) -> None:
        # Conveyor's bulk API for many jobs of one task. A commit before it (an A/B variant of
        # bench.independent) sends one Message per payload instead.
        if hasattr(self.task, "delay_many"):
            self.task.delay_many(payloads)
        else:
            self.app.send_many([self.Message(task=self.task.name, payload=p) for p in payloads])

    def single(self, payload: dict[str, Any]) -> None:
        self.task.delay(**payload)

    def worker_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "conveyor", "--db", self.db, "worker", "bench.apps.conveyor_app:app",
            "--concurrency", "10", "--processes", str(self.processes),
        ] + (["--prefetch", str(self.prefetch)] if self.prefetch else []) + (["--pin"] if self.pin else [])  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        env = {"CONVEYOR_DATABASE_URL": self.db}
        if self.durable_acks:
            env["BENCH_DURABLE_ACKS"] = "1"
        return env

    def close(self) -> None:
        self.app.close()
