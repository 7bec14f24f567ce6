"""Conveyor: a durable, at-least-once task and message queue backed by SQL.

The public API is what this module exports; everything in ``conveyor._*`` is private."""

from conveyor._app import App
from conveyor._backoff import ExponentialBackoff, FixedSchedule
from conveyor._context import JobContext
from conveyor._errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    ConveyorError,
    HandlerTimeout,
    JobNotFoundError,
    JobTimeoutError,
    NotFoundError,
    PayloadError,
    QueueFull,
    Reject,
    Retry,
    UnknownTaskError,
    UnreadableResult,
)
from conveyor._job import Job, JobError, JobStatus
from conveyor._message import Message
from conveyor._task import Task
from conveyor.worker import Worker

__all__ = [
    "App",
    "BackendError",
    "BackendUnavailable",
    "ConfigurationError",
    "ConveyorError",
    "ExponentialBackoff",
    "FixedSchedule",
    "HandlerTimeout",
    "Job",
    "JobContext",
    "JobError",
    "JobNotFoundError",
    "JobStatus",
    "JobTimeoutError",
    "Message",
    "NotFoundError",
    "PayloadError",
    "QueueFull",
    "Reject",
    "Retry",
    "Task",
    "UnknownTaskError",
    "UnreadableResult",
    "Worker",
]

__version__ = "0.1.0"
