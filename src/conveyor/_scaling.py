"""Autoscaling: how many worker processes the load of their queues asks for, as one pure policy.

``conveyor worker --autoscale MIN:MAX`` applies it with memory (cool-downs) to its own processes;
``app.admin.scaling`` (``conveyor scale``, ``GET /v1/scaling``) gives the same answer without memory, as a
recommendation for an external autoscaler (KEDA, a Kubernetes HPA on an external metric, an ASG step policy),
which applies its own stabilisation window.

The load is what the queues hold now: ``ready`` jobs (pending and due: ``QueueStats.pending``) and ``in_flight``
ones (leased: ``QueueStats.processing``, which includes the jobs a worker buffered ahead of its slots). Scheduled
jobs (a future ``run_at``) are not load: no process could start them yet.

Two modes:

- **Target tracking** (the default; AWS's SQS "backlog per instance", Celery's autoscaler): ``desired =
  ceil((ready + in_flight) / target)``, ``target`` jobs per process defaulting to the process's slots (a process
  is "full" when it holds as many jobs as it has slots), clamped to ``[minimum, maximum]``.
- **Steps** (``steps``, e.g. ``100:1,1000:2,10000:4``): when the ready backlog is at least N, add K processes (the
  largest matching step applies); when no step matches and the in-flight jobs fit in one process fewer, one fewer.

Cool-downs (only where there is memory, :class:`ScalingState`): a rise scales out at once, and then not again
for ``scale_out_cooldown`` seconds (new processes need a moment to take their share); a fall scales in only once
the load has asked for fewer for ``scale_in_cooldown`` seconds, and then by one process, the wait starting again
(a burst of short jobs then a lull must not make processes flap). Never below ``minimum``, never above ``maximum``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from conveyor._errors import ConfigurationError

__all__ = ["ScalingDecision", "ScalingPolicy", "ScalingState", "parse_bounds", "parse_steps"]

#: The most worker processes one supervisor runs (as ``--processes``).
MAX_PROCESSES = 256
#: The most steps a step policy may have: more is a typo more often than a plan.
MAX_STEPS = 32
#: The largest backlog threshold of a step (a billion jobs).
MAX_THRESHOLD = 1_000_000_000
#: The longest cool-down, in seconds (a day).
MAX_COOLDOWN = 86_400.0
_INT = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True, slots=True)
class ScalingState:
    """What a caller with memory (the supervisor) remembers between two decisions: when it last scaled out and
    in, and since when the load has asked for fewer processes (None: it does not). Times on one monotonic clock,
    in seconds. The empty state (all None) is that of a stateless caller, and of a supervisor that just started."""

    last_scale_out: float | None = None
    last_scale_in: float | None = None
    fewer_since: float | None = None


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """One decision: ``desired`` processes (``current`` now), from ``ready`` and ``in_flight`` jobs, and why, in one
    line (``reason``). ``state`` is what the caller remembers for the next decision."""

    desired: int
    current: int
    ready: int
    in_flight: int
    reason: str
    state: ScalingState = ScalingState()

    def to_json(self) -> dict[str, Any]:
        """The decision as JSON (``conveyor scale --json``, ``GET /v1/scaling``)."""
        return {
            "desired": self.desired,
            "current": self.current,
            "ready": self.ready,
            "in_flight": self.in_flight,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """How many worker processes a load asks for: between ``minimum`` and ``maximum`` (1..256), by target
    tracking (``target`` jobs per process; None: the process's slots) or, with ``steps`` (``(backlog, add)``
    pairs), by steps. ``scale_out_cooldown``/``scale_in_cooldown``: seconds (see the module's docstring).
    Raises ConfigurationError, naming the option, on numbers that cannot work."""

    minimum: int
    maximum: int
    target: float | None = None
    steps: tuple[tuple[int, int], ...] = ()
    scale_out_cooldown: float = 15.0
    scale_in_cooldown: float = 60.0

    def __post_init__(self) -> None:
        for name in ("minimum", "maximum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(f"autoscale {name} must be an integer, got {value!r}")
            if not 1 <= value <= MAX_PROCESSES:
                raise ConfigurationError(f"autoscale {name} must be from 1 to {MAX_PROCESSES} processes, got {value}")
        if self.minimum > self.maximum:
            raise ConfigurationError(
                f"autoscale minimum {self.minimum} is above its maximum {self.maximum} (give MIN:MAX, MIN <= MAX)"
            )
        if self.target is not None:
            _check_number(self.target, "scale target", low=0.0, high=1e9, open_low=True)
            object.__setattr__(self, "target", float(self.target))
        for name in ("scale_out_cooldown", "scale_in_cooldown"):
            value = _check_number(getattr(self, name), name.replace("_", " "), low=0.0, high=MAX_COOLDOWN)
            object.__setattr__(self, name, float(value))
        steps = tuple(self.steps)
        if len(steps) > MAX_STEPS:
            raise ConfigurationError(f"scale steps: at most {MAX_STEPS} steps, got {len(steps)}")
        seen: set[int] = set()
        for step in steps:
            if not (isinstance(step, tuple) and len(step) == 2 and all(_is_int(v) for v in step)):
                raise ConfigurationError(f"scale steps: each step is (backlog, processes to add), got {step!r}")
            backlog, add = step
            if not 1 <= backlog <= MAX_THRESHOLD or not 1 <= add <= MAX_PROCESSES:
                raise ConfigurationError(
                    f"scale steps: a backlog is 1 to {MAX_THRESHOLD:,} jobs and a step adds 1 to {MAX_PROCESSES} "
                    f"processes, got {backlog}:{add}"
                )
            if backlog in seen:
                raise ConfigurationError(f"scale steps: backlog {backlog} is given twice")
            seen.add(backlog)
        if self.target is not None and steps:
            raise ConfigurationError("give a scale target (target tracking) or scale steps, not both")
        object.__setattr__(self, "steps", tuple(sorted(steps)))

    @classmethod
    def parse(
        cls,
        bounds: str,
        *,
        steps: str | None = None,
        target: float | None = None,
        scale_out_cooldown: float = 15.0,
        scale_in_cooldown: float = 60.0,
    ) -> ScalingPolicy:
        """A policy from its command-line form: ``bounds`` ``MIN:MAX`` (``--autoscale 1:8``) and ``steps``
        ``N:K,...`` (``--scale-steps 100:1,1000:2``). Raises ConfigurationError."""
        minimum, maximum = parse_bounds(bounds)
        return cls(
            minimum,
            maximum,
            target=target,
            steps=parse_steps(steps) if steps is not None else (),
            scale_out_cooldown=scale_out_cooldown,
            scale_in_cooldown=scale_in_cooldown,
        )

    def describe(self) -> str:
        """The policy in one line, for a log (``1..3 processes, target 10 jobs per process``)."""
        mode = (
            "steps " + ",".join(f"{n}:{k}" for n, k in self.steps)
            if self.steps
            else f"target {_num(self.target)} jobs per process"
            if self.target is not None
            else "target one job per slot"
        )
        return (
            f"{self.minimum}..{self.maximum} processes, {mode}, cool-downs out {_num(self.scale_out_cooldown)}s "
            f"in {_num(self.scale_in_cooldown)}s"
        )

    def decide(
        self,
        *,
        ready: int,
        in_flight: int,
        current: int,
        concurrency: int,
        now: float = 0.0,
        state: ScalingState | None = None,
    ) -> ScalingDecision:
        """The number of processes the load asks for, given ``current`` processes of ``concurrency`` slots each.

        ``state`` None: no memory, no cool-downs (a recommendation: the caller's autoscaler has its own
        stabilisation window); target tracking then answers the load's number at once, steps one step from
        ``current``. With a state, ``now`` is on the state's clock and the returned decision's state is the next
        one. ``ready``/``in_flight``/``current``/``concurrency`` below 0 (1 for ``concurrency``) raise
        ConfigurationError."""
        for name, value, low in (("ready", ready, 0), ("in_flight", in_flight, 0), ("concurrency", concurrency, 1)):
            if not _is_int(value) or value < low:
                raise ConfigurationError(f"{name} must be an integer of at least {low}, got {value!r}")
        if not _is_int(current) or current < 0:
            raise ConfigurationError(f"current must be an integer of at least 0, got {current!r}")
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ConfigurationError(f"now must be a finite number of seconds, got {now!r}")
        wanted, why = self._wanted(ready, in_flight, current, concurrency)
        load = f"ready {ready}, in flight {in_flight}"
        if state is None:
            return ScalingDecision(wanted, current, ready, in_flight, f"{load}: {why}")
        return self._with_memory(wanted, why, load, ready, in_flight, current, now, state)

    def _wanted(self, ready: int, in_flight: int, current: int, concurrency: int) -> tuple[int, str]:
        """What the load asks for, clamped, without cool-downs; and why."""
        if self.steps:
            matching = [(n, k) for n, k in self.steps if ready >= n]
            if matching:
                backlog, add = matching[-1]
                wanted, why = current + add, f"backlog >= {backlog} adds {add}"
            elif current > 1 and in_flight <= (current - 1) * concurrency:
                wanted, why = current - 1, f"no step matches and {in_flight} in flight fit in {current - 1}"
            else:
                wanted, why = current, "no step matches"
        else:
            per = self.target if self.target is not None else float(concurrency)
            wanted = math.ceil((ready + in_flight) / per)
            why = f"{ready + in_flight} jobs at {_num(per)} per process want {wanted}"
        clamped = min(self.maximum, max(self.minimum, wanted))
        if clamped != wanted:
            why += f", clamped to {self.minimum}..{self.maximum}"
        return clamped, why

    def _with_memory(
        self,
        wanted: int,
        why: str,
        load: str,
        ready: int,
        in_flight: int,
        current: int,
        now: float,
        state: ScalingState,
    ) -> ScalingDecision:
        def decision(desired: int, reason: str, next_state: ScalingState) -> ScalingDecision:
            return ScalingDecision(desired, current, ready, in_flight, f"{load}: {reason}", next_state)

        # Outside the bounds (a supervisor that just started): into them at once, cool-downs or not.
        if current < self.minimum or current > self.maximum:
            desired = min(self.maximum, max(self.minimum, current))
            at = replace(state, fewer_since=None)
            at = replace(at, last_scale_out=now) if desired > current else replace(at, last_scale_in=now)
            return decision(desired, f"{current} is outside {self.minimum}..{self.maximum}", at)
        if wanted > current:
            since = state.last_scale_out
            if since is not None and now - since < self.scale_out_cooldown:
                left = self.scale_out_cooldown - (now - since)
                return decision(
                    current, f"{why}; scale-out cool-down, {_num(left)}s left", replace(state, fewer_since=None)
                )
            return decision(wanted, why, ScalingState(now, state.last_scale_in, None))
        if wanted < current:
            fewer_since = state.fewer_since if state.fewer_since is not None else now
            asked = now - fewer_since
            if asked < self.scale_in_cooldown:
                return decision(
                    current,
                    f"{why}; asked for fewer for {_num(asked)}s of the {_num(self.scale_in_cooldown)}s scale-in "
                    "cool-down",
                    replace(state, fewer_since=fewer_since),
                )
            # One process at a time; the next one only after the load asks for fewer for another cool-down.
            return decision(
                current - 1,
                f"{why}; fewer asked for {_num(asked)}s, one process at a time",
                ScalingState(state.last_scale_out, now, now),
            )
        return decision(current, why, replace(state, fewer_since=None))


def parse_bounds(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (``1:8``) → (1, 8); the numbers are checked by :class:`ScalingPolicy`. Raises
    ConfigurationError."""
    low, sep, high = str(text).strip().partition(":")
    if not sep or not _INT.fullmatch(low.strip()) or not _INT.fullmatch(high.strip()):
        raise ConfigurationError(f"autoscale must be MIN:MAX, two whole numbers (e.g. 1:8), got {_show(text)}")
    return int(low), int(high)


def parse_steps(text: str) -> tuple[tuple[int, int], ...]:
    """``N:K,N:K`` (``100:1,1000:2,10000:4``: a backlog of N ready jobs or more adds K processes) → pairs; the
    numbers are checked by :class:`ScalingPolicy`. Raises ConfigurationError."""
    items = [part.strip() for part in str(text).split(",")]
    if not any(items):
        raise ConfigurationError("scale steps: give at least one step BACKLOG:ADD (e.g. 100:1,1000:2)")
    steps: list[tuple[int, int]] = []
    for item in items:
        backlog, sep, add = item.partition(":")
        if not sep or not _INT.fullmatch(backlog.strip()) or not _INT.fullmatch(add.strip()):
            raise ConfigurationError(
                f"scale steps must be BACKLOG:ADD pairs of whole numbers separated by commas (e.g. 100:1,1000:2), "
                f"got {_show(item)}"
            )
        steps.append((int(backlog), int(add)))
    return tuple(steps)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(value: object, name: str, *, low: float, high: float, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} must be a finite number, got {value!r}")
    if number < low or (open_low and number == low) or number > high:
        bound = f"above {_num(low)}" if open_low else f"at least {_num(low)}"
        raise ConfigurationError(f"{name} must be {bound} and at most {_num(high)}, got {value!r}")
    return number


def _num(value: float | None) -> str:
    """A number for a reason: ``10``, ``2.5``, ``2.02`` (seconds to 0.01)."""
    return "-" if value is None else f"{value:.2f}".rstrip("0").rstrip(".")


def _show(text: object) -> str:
    return repr(str(text)[:60])


def sum_load(stats: Iterable[Any], queues: Iterable[str] | None) -> tuple[int, int]:
    """(ready, in_flight) over the ``QueueStats`` rows of ``queues`` (None: every row)."""
    wanted = None if queues is None else set(queues)
    ready = in_flight = 0
    for s in stats:
        if wanted is None or s.queue in wanted:
            ready += s.pending
            in_flight += s.processing
    return ready, in_flight
