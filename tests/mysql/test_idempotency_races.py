"""Producers racing for the same idempotency keys on MySQL: every batch is written, every key held once."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from uuid import UUID

from conveyor import App, Message

PRODUCERS = 8
ROUNDS = 25
KEYS = 100


def test_producers_sending_the_same_keys_in_other_orders_all_succeed(mysql_database: str) -> None:
    # Each producer sends each round's keys in its own order, in one batch. Claimed in the batch's
    # order, two producers each held a key the other waited for: InnoDB rolled one back, and after
    # DEADLOCK_RETRIES such rollbacks its send raised BackendUnavailable (about one batch in twenty).
    setup = App(mysql_database)
    setup.admin.migrate()
    setup.close()
    errors: list[BaseException] = []
    ids: dict[str, set[UUID]] = defaultdict(set)
    lock = threading.Lock()
    start = threading.Barrier(PRODUCERS)

    def produce(seed: int) -> None:
        app = App(mysql_database)
        order = random.Random(seed)
        start.wait()
        try:
            for r in range(ROUNDS):
                keys = [f"round{r}-key{i}" for i in range(KEYS)]
                order.shuffle(keys)
                try:
                    jobs = app.send_many([Message(task="t", queue="q", idempotency_key=k) for k in keys])
                except Exception as exc:
                    with lock:
                        errors.append(exc)
                    continue
                with lock:
                    for key, job in zip(keys, jobs, strict=True):
                        ids[key].add(job.id)
        finally:
            app.close()

    threads = [threading.Thread(target=produce, args=(seed,)) for seed in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert len(ids) == ROUNDS * KEYS
    assert all(len(held) == 1 for held in ids.values())
    check = App(mysql_database)
    try:
        assert [(q.queue, q.pending) for q in check.admin.queues()] == [("q", ROUNDS * KEYS)]
    finally:
        check.close()
