"""The operator API (``app.admin``) and the records it returns.

See :class:`Admin`. The CLI, ``conveyor serve`` (HTTP) and the dashboard are presenters over it."""

from conveyor._admin import (
    Admin,
    AlertState,
    AuditEntry,
    DatabaseHealth,
    PurgeResult,
    QueueStats,
    ReplayResult,
    ScalingDecision,
    ScalingPolicy,
    Schedule,
    Subscription,
    TaskTotals,
    Token,
    WorkerInfo,
)
from conveyor._errors import AuthError, Forbidden, Unauthenticated

__all__ = [
    "Admin",
    "AlertState",
    "AuditEntry",
    "AuthError",
    "DatabaseHealth",
    "Forbidden",
    "PurgeResult",
    "QueueStats",
    "ReplayResult",
    "ScalingDecision",
    "ScalingPolicy",
    "Schedule",
    "Subscription",
    "TaskTotals",
    "Token",
    "Unauthenticated",
    "WorkerInfo",
]
