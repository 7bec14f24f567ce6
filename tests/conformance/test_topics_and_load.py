"""Topic subscriptions, the queue load that backpressure reads, and archive retention."""

from __future__ import annotations

from _factory import acquire, at, complete, dead, get, insert, make_dead, new_job

from conveyor.backends.base import (
    ArchivePruneParams,
    ArchiveReadParams,
    Backend,
    JobGetParams,
    QueueLoadParams,
    Subscription,
    SubscriptionsDeleteParams,
    SubscriptionsListParams,
    SubscriptionsUpsertParams,
)


def test_subscriptions_are_upserted_listed_and_deleted(backend: Backend) -> None:
    backend.subscriptions_upsert(
        SubscriptionsUpsertParams(
            [
                Subscription(topic="orders", queue="billing", task="bill"),
                Subscription(topic="orders", queue="audit", task="record", filter='{"tenant": "acme"}'),
                Subscription(topic="users", queue="mail", task="welcome"),
            ]
        )
    )
    # Upserting the same (topic, queue) replaces task and filter.
    backend.subscriptions_upsert(
        SubscriptionsUpsertParams([Subscription(topic="orders", queue="billing", task="bill.v2", filter='{"x": 1}')])
    )

    orders = backend.subscriptions_list(SubscriptionsListParams(topic="orders"))
    everything = backend.subscriptions_list(SubscriptionsListParams())

    assert [(s.queue, s.task) for s in orders] == [("audit", "record"), ("billing", "bill.v2")]
    assert orders[1].filter.replace(" ", "") == '{"x":1}'
    assert len(everything) == 3
    assert backend.subscriptions_delete(SubscriptionsDeleteParams(topic="orders", queue="audit")) is True
    assert backend.subscriptions_delete(SubscriptionsDeleteParams(topic="orders", queue="audit")) is False
    assert [s.queue for s in backend.subscriptions_list(SubscriptionsListParams(topic="orders"))] == ["billing"]


def test_queue_load_counts_live_depth_and_recent_drain(backend: Backend) -> None:
    insert(backend, *[new_job("q") for _ in range(5)], new_job("q", run_at=at(600)), new_job("other"))
    deliveries = acquire(backend, queue="q", limit=4)
    complete(backend, deliveries[0], now=at(10))  # outside the window below
    complete(backend, deliveries[1], now=at(95))
    dead(backend, deliveries[2], now=at(100))

    load = backend.queue_load(QueueLoadParams(queue="q", now=at(100), window=60))

    # Live: 1 ready pending + 1 scheduled + 1 processing; drained: two ended in [40, 100].
    assert (load.queue, load.depth, load.drained, load.window) == ("q", 3, 2, 60)
    empty = backend.queue_load(QueueLoadParams(queue="nothing", now=at(100)))
    assert (empty.depth, empty.drained) == (0, 0)


def test_queue_load_names_the_keys_held_at_now(backend: Backend) -> None:
    insert(
        backend,
        new_job("q", idempotency_key="open", dedup_until=at(60)),
        new_job("q", idempotency_key="forever"),
        new_job("q", idempotency_key="passed", dedup_until=at(5)),
        new_job("other", idempotency_key="elsewhere", dedup_until=at(60)),
    )
    asked = ("open", "forever", "passed", "elsewhere", "never", "o'pen", "")
    load = backend.queue_load(QueueLoadParams(queue="q", now=at(10), keys=asked))
    # An expired window no longer holds its key (a send may take it over); keys are per queue.
    assert load.held == frozenset({"open", "forever"})
    assert backend.queue_load(QueueLoadParams(queue="q", now=at(10))).held == frozenset()


def test_archive_prune_applies_per_queue_and_dead_letter_retention(backend: Backend) -> None:
    insert(backend, new_job("short"), new_job("short"), new_job("long"), new_job("default"))
    short_old, short_new = acquire(backend, queue="short", limit=2)
    (long_old,) = acquire(backend, queue="long")
    (default_old,) = acquire(backend, queue="default")
    complete(backend, short_old, long_old, default_old, now=at(10))
    complete(backend, short_new, now=at(500))
    (dead_old,) = make_dead(backend, 1, queue="short")  # dead letters finish at T0

    params = ArchivePruneParams(
        now=at(1000),
        default_before=at(100),
        default_dead_before=at(-1),  # dead letters: kept unless their queue says otherwise
        before={"short": at(20), "long": at(5)},
    )
    assert backend.archive_prune(params) == 2

    def exists(job_id: object) -> bool:
        return backend.job_get(JobGetParams(id=job_id)) is not None  # type: ignore[arg-type]

    assert not exists(short_old.id) and not exists(default_old.id)
    assert exists(short_new.id) and exists(long_old.id) and exists(dead_old)
    assert get(backend, dead_old).state == "dead"

    # A queue's own dead-letter retention overrides the default.
    dead_params = ArchivePruneParams(
        now=at(1000), default_before=at(0), default_dead_before=at(-1), dead_before={"short": at(1)}
    )
    assert backend.archive_prune(dead_params) == 1
    assert not exists(dead_old)


def test_archive_prune_is_bounded_by_its_limit(backend: Backend) -> None:
    insert(backend, *[new_job() for _ in range(5)])
    complete(backend, *acquire(backend, limit=5), now=at(1))
    params = ArchivePruneParams(now=at(100), default_before=at(50), default_dead_before=at(50), limit=2)

    assert [backend.archive_prune(params) for _ in range(4)] == [2, 2, 1, 0]
    assert backend.archive_read(ArchiveReadParams(after=None)) == []
