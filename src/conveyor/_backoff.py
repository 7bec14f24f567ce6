"""Backoff: how long a failed job waits before its next attempt."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from conveyor._errors import ConfigurationError
from conveyor._limits import check_seconds


class Backoff(Protocol):
    """Delay in seconds before the next attempt, given how many attempts have run (1 after the first)."""

    def delay(self, attempts: int) -> float: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """Exponential backoff with full jitter: ``random(0, min(cap, base * 2**attempts))``.

    Full jitter spreads the retries of a burst of failures over the whole window, so that they do
    not return to the database in lock-step (AWS's "Exponential Backoff and Jitter")."""

    base: float = 1.0
    cap: float = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        check_seconds(self.base, "backoff base", ConfigurationError)
        check_seconds(self.cap, "backoff cap", ConfigurationError)

    def delay(self, attempts: int) -> float:
        # A float power, capped: 2 ** attempts as an int cannot be turned into a float past ~1,000
        # attempts (OverflowError), and max_attempts may be up to 1,000,000.
        ceiling = min(self.cap, self.base * 2.0 ** min(max(0, attempts), 1000))
        return random.uniform(0.0, ceiling) if self.jitter else ceiling

    def describe(self) -> str:
        kind = "full jitter" if self.jitter else "no jitter"
        return f"exponential base={self.base}s cap={self.cap}s ({kind})"


@dataclass(frozen=True, slots=True)
class FixedSchedule:
    """A fixed list of delays: attempt n waits ``delays[n-1]``; the last repeats after the list ends."""

    delays: Sequence[float]

    def __post_init__(self) -> None:
        if isinstance(self.delays, str | bytes) or not isinstance(self.delays, Sequence) or not self.delays:
            raise ConfigurationError("a fixed backoff schedule needs one or more non-negative delays")
        for delay in self.delays:
            check_seconds(delay, "a fixed backoff delay", ConfigurationError)

    def delay(self, attempts: int) -> float:
        index = min(max(attempts, 1), len(self.delays)) - 1
        return float(self.delays[index])

    def describe(self) -> str:
        return "fixed " + ", ".join(f"{d:g}s" for d in self.delays)
