"""What the worker's loops share: the held-deliveries registry, counters, and backend calls that
survive the database going away."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, TypeVar
from uuid import UUID

from conveyor._errors import BackendUnavailable
from conveyor.backends.base import Backend, Delivery

log = logging.getLogger("conveyor.worker")

T = TypeVar("T")
P_ = TypeVar("P_")

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
        return {name: getattr(self, name) for name in self.__slots__}


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


class BackendCalls:
    """Runs blocking Backend calls on a small dedicated thread pool.

    ``call`` retries ``BackendUnavailable`` with capped, jittered backoff until it succeeds or the
    ``stopping`` check says to give up, so that a database restart pauses the worker instead of
    killing it or losing outcomes it still has to write."""

    def __init__(self, backend: Backend, counters: Counters, threads: int = 4) -> None:
        self.backend = backend
        self.counters = counters
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="conveyor-db")

    async def once(self, fn: Callable[[P_], T], params: P_) -> T:
        """One call, errors propagate."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, params)

    async def call(
        self,
        fn: Callable[[P_], T],
        params: P_,
        *,
        give_up: Callable[[], bool] = lambda: False,
        what: str = "backend call",
    ) -> T:
        """Call, retrying while the database is unavailable; raises the last error if ``give_up()``."""
        delay = 0.05
        while True:
            try:
                return await self.once(fn, params)
            except BackendUnavailable as exc:
                self.counters.backend_errors += 1
                if give_up():
                    raise
                log.warning("%s: database unavailable (%s); retrying in %.2fs", what, exc, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 5.0)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
