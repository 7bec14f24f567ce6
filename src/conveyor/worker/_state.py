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
    """Every delivery this worker holds, by job id."""

    held: dict[UUID, Held] = field(default_factory=dict)

    def add(self, delivery: Delivery, visibility_timeout: float) -> Held:
        entry = Held(delivery, visibility_timeout)
        self.held[delivery.id] = entry
        return entry

    def drop(self, job_id: UUID) -> None:
        self.held.pop(job_id, None)

    def __len__(self) -> int:
        return len(self.held)
