"""Queue policies: what a queue declares about itself (backpressure, dedup, SLA, retention, lanes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from numbers import Real
from typing import Literal

from conveyor._errors import ConfigurationError
from conveyor._limits import INT32_MAX, check_duration, check_int

ExpireAction = Literal["expired", "dead"]

#: Default graduated shedding: low-priority sends (priority < 0) are refused at 50 % of max_depth,
#: normal ones (0) at 80 %, high ones (> 0) only at 100 %.
DEFAULT_SHEDDING: Mapping[str, float] = {"low": 0.5, "normal": 0.8, "high": 1.0}
#: How long an idempotency key holds its job (per queue; SQS FIFO uses 5 minutes, we keep a day
#: because producers retry across deploys and outages).
DEFAULT_DEDUP_WINDOW = timedelta(hours=24)
#: How long completed and expired jobs stay in the archive, and dead letters.
DEFAULT_RETENTION = timedelta(days=7)
DEFAULT_DEAD_RETENTION = timedelta(days=14)


def priority_class(priority: int) -> str:
    """``low`` (< 0), ``normal`` (0) or ``high`` (> 0)."""
    return "low" if priority < 0 else "high" if priority > 0 else "normal"


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """The declared policy of one queue: its part of the queue contract.

    Task-level policy (visibility timeout, attempts, backoff, dead-on errors) is declared on each
    task; this is what belongs to the queue as a whole."""

    name: str
    #: How long an idempotency key holds its job.
    dedup_window: timedelta = DEFAULT_DEDUP_WINDOW
    #: High-water mark of live jobs; past it sends raise QueueFull (None: unbounded).
    max_depth: int | None = None
    #: Fraction of max_depth at which each priority class is refused.
    shedding: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SHEDDING))
    #: Oldest pending age that counts as an SLA breach (alerts, the pipeline's reports).
    sla: timedelta | None = None
    #: How long completed/expired rows stay in the archive, and dead letters.
    retention: timedelta = DEFAULT_RETENTION
    dead_retention: timedelta = DEFAULT_DEAD_RETENTION
    #: What a job whose TTL passed before it started becomes.
    on_expire: ExpireAction = "expired"
    #: Advisory: the concurrency this queue is provisioned for (printed in the contract).
    concurrency: int | None = None
    #: Whether the queue's producers use ordering keys (per-key FIFO); documentation only.
    ordered: bool = False

    def __post_init__(self) -> None:
        """Raise ConfigurationError for a policy no queue could keep (conveyor._limits). The name is
        checked where a queue is declared (``App.queue``): a worker builds the default policy of
        whatever queue its jobs name, including rows written before names had limits."""
        error = ConfigurationError
        check_duration(self.dedup_window, "dedup_window", error)
        if self.max_depth is not None:
            check_int(self.max_depth, "max_depth", 1, INT32_MAX, error)
        if not isinstance(self.shedding, Mapping):
            raise error(f"shedding must map low/normal/high to fractions, got {self.shedding!r}")
        for cls, fraction in self.shedding.items():
            if (
                cls not in DEFAULT_SHEDDING
                or isinstance(fraction, bool)
                or not isinstance(fraction, Real)
                or not 0 < fraction <= 1
            ):
                raise error(f"shedding needs low/normal/high fractions in (0, 1], got {cls}={fraction!r}")
        # Kept whole, the given classes over the defaults: what sends meet is what the contract prints.
        given = self.shedding
        ladder = {**DEFAULT_SHEDDING, **given}
        object.__setattr__(self, "shedding", ladder)
        # Graduated: low sends are refused first, high ones last. A ladder upside down (or a class set past a
        # default one, as normal=0.3 under the default low 0.5) would shed the more urgent sends first.
        for lower, higher in (("low", "normal"), ("normal", "high")):
            if ladder[lower] > ladder[higher]:
                raise error(
                    f"shedding must refuse lower priorities first: {_rung(lower, ladder, given)} above "
                    f"{_rung(higher, ladder, given)}"
                )
        if self.sla is not None:
            check_duration(self.sla, "sla", error)
        check_duration(self.retention, "retention", error)
        check_duration(self.dead_retention, "dead_retention", error)
        if self.on_expire not in ("expired", "dead"):
            raise error(f"on_expire must be 'expired' or 'dead', got {self.on_expire!r}")
        if self.concurrency is not None:
            check_int(self.concurrency, "concurrency", 1, INT32_MAX, error)

    def limit_for(self, priority: int) -> int | None:
        """The live depth past which a send of this priority is refused (None: no limit)."""
        if self.max_depth is None:
            return None
        return max(1, int(self.max_depth * self.shedding[priority_class(priority)]))  # the ladder is kept whole


def _rung(cls: str, ladder: Mapping[str, float], given: Mapping[str, float]) -> str:
    """One class of a shedding ladder for an error message: ``normal 0.8 (the default)``."""
    return f"{cls} {ladder[cls]:g}" + ("" if cls in given else " (the default)")
