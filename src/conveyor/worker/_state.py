"""What a worker holds and counts: the registry of leased deliveries and the counters."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal
from uuid import UUID

from conveyor.backends.base import Delivery

HeldState = Literal["buffered", "running", "finishing"]


@dataclass(slots=True)
class Held:
    """A delivery this worker holds a lease on, from acquire until its outcome is flushed."""

    delivery: Delivery
    visibility_timeout: float
    state: HeldState = "buffered"
    #: Set when a heartbeat found the lease gone (rescued and maybe re-delivered elsewhere).
    lost: bool = False
    #: Set once this delivery's start is counted in the database (``jobs_start_many``: a suspect
    #: before it ran, or a job running long), so that its outcome does not count it again.
    counted: bool = False


@dataclass(slots=True)
class Counters:
    """What a worker did, for logs, metrics and tests."""

    acquired: int = 0
    started: int = 0
    completed: int = 0
    retried: int = 0
    dead: int = 0
    expired: int = 0
    stale_acks: int = 0
    released: int = 0
    rescued: int = 0
    lost_leases: int = 0
    backend_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class Registry:
    """Every delivery this worker holds, by job id: the latest one of each job. A job this worker
    leased again after its lease ran out (rescued while its first run went on) replaces the stale
    delivery, so what the stale run does (its outcome, its drop, a lost lease) is matched by receipt
    and never touches the newer delivery."""

    held: dict[UUID, Held] = field(default_factory=dict)

    def add(self, delivery: Delivery, visibility_timeout: float) -> Held:
        entry = Held(delivery, visibility_timeout)
        self.held[delivery.id] = entry
        return entry

    def get(self, job_id: UUID, receipt: str) -> Held | None:
        """The entry of this delivery (job and receipt), None when another one replaced it."""
        entry = self.held.get(job_id)
        return entry if entry is not None and entry.delivery.receipt == receipt else None

    def drop(self, job_id: UUID, receipt: str) -> None:
        """Forget this delivery (not a newer one of the same job)."""
        if self.get(job_id, receipt) is not None:
            del self.held[job_id]

    def __len__(self) -> int:
        return len(self.held)
