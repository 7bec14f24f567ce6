"""Dramatiq's bench app (Redis broker).

Worker: ``dramatiq bench.apps.dramatiq_app --processes 1 --threads 10 --queues bench`` with the
default middleware and prefetch (2 × threads)."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench._common import QUEUE, body_sync, record

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="noop", queue_name=QUEUE)
def noop(sent: float = 0.0, i: int = 0) -> None:
    record(sent)
    body_sync()
