"""Celery's bench app (Redis broker).

Worker: ``celery -A bench.apps.celery_app worker -P threads -c 10 -Q bench --without-gossip
--without-mingle --without-heartbeat`` with Celery's defaults otherwise: prefetch multiplier 4 (40
messages reserved), early acks (acks_late off: the message is acknowledged before the task runs,
which is less work than Conveyor's at-least-once ack after the run). Results are not stored."""

from __future__ import annotations

import os

from celery import Celery

from bench._common import QUEUE, body_sync, record

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.noop")
def noop(sent: float = 0.0, i: int = 0) -> None:
    record(sent)
    body_sync()
