"""The operator API (``app.admin``) and the records it returns.

See :class:`Admin`. The CLI, ``conveyor serve`` (HTTP) and the dashboard are presenters over it."""

from conveyor._admin import Admin, AuditEntry, PurgeResult, QueueStats, ReplayResult, Schedule, Subscription, Token
from conveyor._errors import AuthError, Forbidden, Unauthenticated

__all__ = [
    "Admin",
    "AuditEntry",
    "AuthError",
    "Forbidden",
    "PurgeResult",
    "QueueStats",
    "ReplayResult",
    "Schedule",
    "Subscription",
    "Token",
    "Unauthenticated",
]
