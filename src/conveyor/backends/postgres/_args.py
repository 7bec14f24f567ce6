"""The arguments of the worker's hot statements, built once for both ways of running them: on a
pooled connection in a database thread (``_backend``) and on the worker's event loop (``_loop``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from conveyor.backends._promotion import PROMOTE_BATCH
from conveyor.backends.base import JobsAcquireParams, JobsFinishParams, one_outcome_per_job


def receipt_of(value: str) -> UUID | None:
    """A receipt as the database stores it; None for text that cannot be one (it is stale)."""
    try:
        return UUID(value)
    except (ValueError, TypeError, AttributeError):
        return None


def promote_args(params: JobsAcquireParams) -> dict[str, Any]:
    """``jobs_promote``'s arguments, for the queue an acquire is about to lease from."""
    return {"queue": params.queue, "now": params.now, "limit": PROMOTE_BATCH}


def acquire_args(params: JobsAcquireParams) -> dict[str, Any]:
    return {
        "queue": params.queue,
        "limit": params.limit,
        "visibility_timeout": float(params.visibility_timeout),
        "worker_id": params.worker_id,
        "now": params.now,
    }


def finish_args(params: JobsFinishParams) -> dict[str, Any] | None:
    """The finish statement's arguments; None when no item has a well-formed receipt.

    A column whose every item has its default (completed, no result, no reason, no error, ran, not
    counted: a batch of plain completions) goes as NULL, which the statement reads as that default:
    psycopg dumps an array element by element in Python, ~0.6 µs each, and the ten columns of a
    completion cost a worker ~6 µs a job where the ids and receipts alone cost ~1.5."""
    items = [(item, receipt_of(item.receipt)) for item in one_outcome_per_job(params.items)]
    items = [(item, receipt) for item, receipt in items if receipt is not None]
    if not items:
        return None
    plain = all(item.state == "completed" and item.reason is None and item.error is None for item, _ in items)
    errors = not plain and any(item.error is not None for item, _ in items)
    return {
        "ids": [item.id for item, _ in items],
        "receipts": [receipt for _, receipt in items],
        "states": None if plain else [item.state for item, _ in items],
        "results": None if all(item.result is None for item, _ in items) else [item.result for item, _ in items],
        "reasons": None if plain else [item.reason for item, _ in items],
        "error_types": [item.error.type if item.error else None for item, _ in items] if errors else None,
        "error_messages": [item.error.message if item.error else None for item, _ in items] if errors else None,
        "tracebacks": [item.error.traceback if item.error else None for item, _ in items] if errors else None,
        "ran": None if all(item.ran for item, _ in items) else [item.ran for item, _ in items],
        "counted": [item.counted for item, _ in items] if any(item.counted for item, _ in items) else None,
        "now": params.now,
    }
