"""JobContext: what a running handler knows about its job and can ask of the worker."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol
from uuid import UUID

from conveyor._errors import ConfigurationError
from conveyor._limits import check_key, check_seconds
from conveyor.backends.base import Backend, Delivery, ProcessedKeyClaimParams

ManualDecision = Literal["ack", "nack", "reject"]


class LeaseKeeper(Protocol):
    """The worker side of ``ctx.extend``: extend one delivery's lease."""

    def extend(self, delivery: Delivery, seconds: float) -> bool: ...


@dataclass(slots=True)
class JobContext:
    """Passed to handlers that declare a ``ctx`` parameter.

    ``attempt`` is 1 for the first run. With ``ack_policy="manual"`` the handler decides the
    outcome itself with :meth:`ack`, :meth:`nack` or :meth:`reject`."""

    delivery: Delivery
    keeper: LeaseKeeper | None = None
    backend: Backend | None = None
    decision: ManualDecision | None = None
    result: Any = None
    retry_delay: float | None = None
    reason: str = ""
    _headers: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def job_id(self) -> UUID:
        return self.delivery.id

    @property
    def queue(self) -> str:
        return self.delivery.queue

    @property
    def task(self) -> str:
        return self.delivery.task

    @property
    def attempt(self) -> int:
        return self.delivery.attempts + 1

    @property
    def deliveries(self) -> int:
        """How many times this job has been started, this start included (a start that crashed its
        worker before it was counted is not: see :attr:`rescues`)."""
        return self.delivery.deliveries + 1

    @property
    def rescues(self) -> int:
        """How many times this job's lease expired before: a worker died or hung while holding it."""
        return self.delivery.rescues

    @property
    def max_attempts(self) -> int:
        return self.delivery.max_attempts

    @property
    def headers(self) -> dict[str, Any]:
        if self._headers is None:
            self._headers = json.loads(self.delivery.headers)
        return self._headers

    @property
    def idempotency_key(self) -> str | None:
        return self.delivery.idempotency_key

    def extend(self, seconds: float) -> bool:
        """Extend this job's lease to ``seconds`` from now; False if the lease was already lost.
        Raises ConfigurationError unless ``seconds`` is a finite number in (0, 100 years]: a lease of
        NaN seconds would never expire, and its job would never be rescued."""
        seconds = check_seconds(seconds, "ctx.extend seconds", ConfigurationError, strict=True)
        if self.keeper is None:
            return True
        return self.keeper.extend(self.delivery, seconds)

    def once(self, key: str, *, ttl: timedelta = timedelta(days=7), conn: Any = None) -> bool:
        """Claim the side effect named ``key``: True the first time (do it), False if it was done.

        Pass ``conn``, the connection of the transaction that performs the side effect (PostgreSQL:
        your psycopg connection; SQLite: your sqlite3 connection), so that the claim commits with the
        effect or not at all: a job redelivered after its worker died between that commit and the ack
        then skips the effect. Without ``conn`` the claim commits on its own, before the effect. Keys
        are global; include the job's idempotency key or id to scope them. Claims last ``ttl``. A key
        must be 1 to 512 bytes of UTF-8 without NUL (PayloadError otherwise)."""
        check_key(key, "ctx.once key")
        if self.backend is None:
            raise RuntimeError("ctx.once needs a worker-provided context")
        now = datetime.now(UTC)
        return self.backend.processed_keys_claim(ProcessedKeyClaimParams(key, now + ttl, now, conn))

    def ack(self, result: Any = None) -> None:
        """Manual ack: the job completed (with ``result``)."""
        self.decision, self.result = "ack", result

    def nack(self, delay: float | None = None, reason: str = "nack") -> None:
        """Manual nack: the job failed transiently; retry after ``delay`` (None: the task's backoff)."""
        if delay is not None:
            delay = check_seconds(delay, "ctx.nack delay", ConfigurationError)
        self.decision, self.retry_delay, self.reason = "nack", delay, reason

    def reject(self, reason: str = "rejected") -> None:
        """Manual reject: dead-letter the job at once."""
        self.decision, self.reason = "reject", reason
