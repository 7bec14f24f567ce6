"""When a job holding an idempotency key is the same job as a send reusing the key: one rule for the
HTTP API's answer and for the engines' strict sends (``JobsInsertParams.strict_keys``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from conveyor._errors import IdempotencyConflict

if TYPE_CHECKING:
    from conveyor.backends.base import NewJob


def same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same value (``true`` is not ``1``; ``1`` is ``1.0``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if type(a) is type(b):
            return a == b
        # An int and a float: PostgreSQL's jsonb writes a float as a decimal (1e23 comes back as the
        # integer 100000000000000000000000), so a resend's float is the stored integer as a float.
        try:
            return float(a) == float(b)
        except OverflowError:
            return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def same_job(task: str, payload: str, held_task: str, held_payload: str) -> bool:
    """Whether a send of ``task`` with ``payload`` (encoded JSON) is the job that holds its key,
    of ``held_task`` with ``held_payload``: a resend, not a new job under a reused key."""
    return task == held_task and same_json(json.loads(payload), json.loads(held_payload))


def refuse_reused_keys(
    jobs: Sequence[NewJob], stored: Sequence[UUID], held: Callable[[UUID], tuple[str, str] | None]
) -> None:
    """Raise IdempotencyConflict for the first of ``jobs`` whose key is held (``stored``: the ids an
    insert answered) by a job that is not the same job; ``held`` reads a holder's task and encoded
    payload (None once it is gone: nothing left to differ from). Called by the engines inside the
    insert's transaction (``JobsInsertParams.strict_keys``), so that raising writes nothing."""
    for i, (job, job_id) in enumerate(zip(jobs, stored, strict=True)):
        if job_id == job.id or job.idempotency_key is None:
            continue
        holder = held(job_id)
        if holder is not None and not same_job(job.task, job.payload, *holder):
            raise IdempotencyConflict(
                f"idempotency key {job.idempotency_key!r:.80} (job {i} of the send) is held by job {job_id} "
                "with a different task or payload; nothing was enqueued: use a new key for a new job"
            )
