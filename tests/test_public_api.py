"""The public API is deliberate: this pins what ``conveyor`` exports."""

from __future__ import annotations

import conveyor


def test_exported_members() -> None:
    assert conveyor.__all__ == [
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
    for name in conveyor.__all__:
        assert getattr(conveyor, name).__module__.startswith("conveyor")
