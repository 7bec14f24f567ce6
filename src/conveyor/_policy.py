"""Outcome policy: what happens to a job before and after its handler runs.

These are the only places that decide retry versus dead letter, so every engine and the testing
kit share them (the Backend only stores what is decided here)."""

from __future__ import annotations

import json
import traceback as tb_module
from datetime import datetime, timedelta
from typing import Any

from conveyor._context import JobContext
from conveyor._errors import PayloadError, Reject, Retry
from conveyor._message import SCHEMA_VERSION
from conveyor._task import TaskOptions
from conveyor.backends.base import Delivery, ErrorInfo, Finish, RetryItem

Outcome = Finish | RetryItem

#: Reasons recorded on dead letters.
MAX_DELIVERIES_EXCEEDED = "max_deliveries_exceeded"
MAX_ATTEMPTS_EXCEEDED = "max_attempts_exceeded"
PERMANENT_ERROR = "permanent_error"
REJECTED = "rejected"
UNKNOWN_TASK = "unknown_task"
UNSUPPORTED_VERSION = "unsupported_version"
EXPIRED = "expired"


def before_run(
    delivery: Delivery, options: TaskOptions | None, now: datetime, on_expire: str = "expired"
) -> Finish | None:
    """The outcome that ends a job without running it, or None when it should run.

    Poison protection comes first: a job that has been handed out more than its delivery limit has
    repeatedly killed or hung its workers, so it must not run again whatever else is true."""
    limit = options.deliveries_limit if options else delivery.max_deliveries
    if delivery.deliveries > limit:
        error = ErrorInfo("PoisonJob", f"delivered {delivery.deliveries} times, limit {limit}")
        return Finish(delivery.id, delivery.receipt, "dead", reason=MAX_DELIVERIES_EXCEEDED, error=error, ran=False)
    if delivery.expires_at is not None and now >= delivery.expires_at:
        if on_expire == "dead":
            error = ErrorInfo("Expired", f"not started before expires_at {delivery.expires_at.isoformat()}")
            return Finish(delivery.id, delivery.receipt, "dead", reason=EXPIRED, error=error, ran=False)
        return Finish(delivery.id, delivery.receipt, "expired", reason=EXPIRED, ran=False)
    if options is None:
        error = ErrorInfo("UnknownTaskError", f"no task registered as {delivery.task!r}")
        return Finish(delivery.id, delivery.receipt, "dead", reason=UNKNOWN_TASK, error=error, ran=False)
    version = _schema_version(delivery.headers)
    if version is None or version > options.version:
        error = ErrorInfo(
            "UnsupportedVersion",
            f"job schema_version {version!r} is not supported by task {delivery.task!r} "
            f"(handles up to {options.version})",
        )
        return Finish(delivery.id, delivery.receipt, "dead", reason=UNSUPPORTED_VERSION, error=error, ran=False)
    return None


def _schema_version(headers: str) -> int | None:
    try:
        value = json.loads(headers).get(SCHEMA_VERSION, 1)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def on_success(delivery: Delivery, options: TaskOptions, result: Any) -> Finish:
    """The handler returned: the job completed (result kept if the task keeps results)."""
    encoded: str | None = None
    if options.keep_result and result is not None:
        try:
            encoded = json.dumps(result, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            # A result that is not JSON is kept as its repr, so the completion is never lost.
            encoded = json.dumps({"repr": repr(result)})
    return Finish(delivery.id, delivery.receipt, "completed", result=encoded)


def on_failure(delivery: Delivery, options: TaskOptions, exc: BaseException, now: datetime) -> Outcome:
    """The handler raised: retry with backoff, or dead-letter (permanent error, Reject, no attempts left)."""
    error = error_info(exc)
    if isinstance(exc, Reject):
        return Finish(delivery.id, delivery.receipt, "dead", reason=REJECTED, error=error)
    if not isinstance(exc, Retry) and isinstance(exc, (*options.dead_on, PayloadError)):
        return Finish(delivery.id, delivery.receipt, "dead", reason=PERMANENT_ERROR, error=error)
    delay = exc.delay if isinstance(exc, Retry) else None
    return _retry_or_dead(delivery, options, error, delay, now)


def on_manual(delivery: Delivery, options: TaskOptions, ctx: JobContext, now: datetime) -> Outcome:
    """A manual-ack handler returned: its ``ctx`` decision is the outcome (no decision: retry)."""
    if ctx.decision == "ack":
        return on_success(delivery, options, ctx.result)
    if ctx.decision == "reject":
        return Finish(delivery.id, delivery.receipt, "dead", reason=REJECTED, error=ErrorInfo("Reject", ctx.reason))
    reason = ctx.reason if ctx.decision == "nack" else "handler returned without ack, nack or reject"
    return _retry_or_dead(delivery, options, ErrorInfo("Nack", reason), ctx.retry_delay, now)


def _retry_or_dead(
    delivery: Delivery, options: TaskOptions, error: ErrorInfo, delay: float | None, now: datetime
) -> Outcome:
    attempts = delivery.attempts + 1
    if attempts >= delivery.max_attempts:
        return Finish(delivery.id, delivery.receipt, "dead", reason=MAX_ATTEMPTS_EXCEEDED, error=error)
    seconds = options.backoff.delay(attempts) if delay is None else max(0.0, delay)
    return RetryItem(delivery.id, delivery.receipt, now + timedelta(seconds=seconds), error)


def error_info(exc: BaseException) -> ErrorInfo:
    """The type, message and traceback of an exception, as stored on the job."""
    text = "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    return ErrorInfo(type(exc).__qualname__, str(exc), text[-8000:])
