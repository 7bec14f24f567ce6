"""Consumer-side idempotency (processed keys) and the pruning of expired keys of both kinds."""

from __future__ import annotations

from _factory import T0, at, insert, live_ids, new_job

from conveyor.backends.base import Backend, KeysPruneParams, ProcessedKeyClaimParams


def _claim(backend: Backend, key: str, now_s: float, ttl: float = 3600) -> bool:
    return backend.processed_keys_claim(ProcessedKeyClaimParams(key=key, expires_at=at(now_s + ttl), now=at(now_s)))


def test_a_key_is_claimed_once_until_it_expires(backend: Backend) -> None:
    assert _claim(backend, "charge:42", now_s=0, ttl=100) is True
    assert _claim(backend, "charge:42", now_s=50) is False
    assert _claim(backend, "charge:43", now_s=50) is True
    # After expiry the key may be claimed again, and is then held for its new window.
    assert _claim(backend, "charge:42", now_s=101, ttl=100) is True
    assert _claim(backend, "charge:42", now_s=150) is False


def test_prune_deletes_only_expired_keys(backend: Backend) -> None:
    _claim(backend, "old", now_s=0, ttl=10)
    _claim(backend, "fresh", now_s=0, ttl=1000)
    insert(backend, new_job(idempotency_key="old-idem", dedup_until=at(10)), now=T0)
    held = new_job(idempotency_key="held-idem", dedup_until=at(1000))
    insert(backend, held, now=T0)

    assert backend.keys_prune(KeysPruneParams(now=at(100))) == 2
    assert backend.keys_prune(KeysPruneParams(now=at(100))) == 0

    # The unexpired keys are still held; the pruned processed key can be claimed again.
    assert _claim(backend, "fresh", now_s=100) is False
    assert _claim(backend, "old", now_s=100) is True
    assert insert(backend, new_job(idempotency_key="held-idem", dedup_until=at(2000)), now=at(100)) == [held.id]
    assert len(live_ids(backend)) == 2


def test_prune_is_bounded_by_its_limit(backend: Backend) -> None:
    for n in range(5):
        _claim(backend, f"k{n}", now_s=0, ttl=1)

    assert backend.keys_prune(KeysPruneParams(now=at(10), limit=3)) == 3
    assert backend.keys_prune(KeysPruneParams(now=at(10), limit=3)) == 2
    assert backend.keys_prune(KeysPruneParams(now=at(10), limit=3)) == 0
