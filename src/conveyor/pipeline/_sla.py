"""Per-queue SLAs for the pipeline: parsed once, kept as whole microseconds, compared exactly.

An SLA is the longest acceptable wait before a job starts. The report and reconcile take them from
``--sla QUEUE=SECONDS`` flags, from a Python mapping, or from the queues an App declares
(``App.queues[name].sla``); every form becomes an integer number of microseconds here, so that
breaches (``wait > sla``) and the capacity plan's floors are integer arithmetic, never a float
that lands one below the true value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from conveyor.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from conveyor import App

#: The SLA (seconds of wait) of a queue without one of its own.
DEFAULT_SLA_SECONDS = 300.0
#: The longest SLA taken: a year. Anything longer is a typo (a value in ms given as seconds, say).
MAX_SLA_SECONDS = 366 * 86_400
MICROS = 1_000_000

SlaValue = float | int | str | Decimal | timedelta


def sla_micros(value: SlaValue, what: str = "SLA") -> int:
    """An SLA as whole microseconds: seconds (a number or its text) or a ``timedelta``.

    Text and floats are read as the decimal they print as (``0.1`` is exactly 100,000 µs). Raises
    :class:`PipelineError` for NaN, infinity, zero or less, more than a year, or a value finer
    than a microsecond."""
    if isinstance(value, timedelta):
        micros = (value.days * 86_400 + value.seconds) * MICROS + value.microseconds
        seconds = Decimal(micros) / MICROS
    else:
        if isinstance(value, bool):
            raise PipelineError(f"{what}: expected a number of seconds, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise PipelineError(f"{what} must be a finite number of seconds, got {value}")
        try:
            # repr() of a float is the shortest text that reads back as it: the decimal meant.
            seconds = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
        except (InvalidOperation, ValueError):
            raise PipelineError(f"{what}: {str(value)!r} is not a number of seconds") from None
        if not seconds.is_finite():
            raise PipelineError(f"{what} must be a finite number of seconds, got {value}")
    if not 0 < seconds <= MAX_SLA_SECONDS:
        raise PipelineError(f"{what} must be more than 0 and at most {MAX_SLA_SECONDS} seconds, got {seconds}")
    scaled = seconds * MICROS
    if scaled != scaled.to_integral_value():
        raise PipelineError(f"{what} {seconds} s is finer than a microsecond")
    return int(scaled)


def parse_sla(items: Mapping[str, SlaValue] | list[str] | tuple[str, ...] | None) -> dict[str, int]:
    """Per-queue SLAs in microseconds from a mapping (queue -> seconds or timedelta) or
    ``queue=seconds`` strings. Raises :class:`PipelineError` on a malformed item or value."""
    if items is None:
        return {}
    pairs: list[tuple[str, SlaValue]]
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            queue, sep, value = item.partition("=")
            if not sep:
                raise PipelineError(f"--sla {item!r}: expected QUEUE=SECONDS (e.g. emails=30)")
            if not queue:
                # Only raw SQL stores a queue named ''; --default-sla covers it.
                raise PipelineError(
                    f"--sla {item!r}: the queue name before '=' is empty; expected QUEUE=SECONDS (e.g. emails=30)"
                )
            pairs.append((queue, value))
    return {queue: sla_micros(value, f"SLA of queue {queue!r}") for queue, value in pairs}


def declared(app: App) -> tuple[dict[str, int], dict[str, int]]:
    """The SLAs (microseconds) and high-water marks (``max_depth``) the App's queues declare.

    Queues that declare neither are left out. Raises :class:`PipelineError` for a declared SLA
    the pipeline cannot take (zero, negative, more than a year)."""
    slas: dict[str, int] = {}
    depths: dict[str, int] = {}
    for name, policy in sorted(app.queues.items()):
        if policy.sla is not None:
            slas[name] = sla_micros(policy.sla, f"declared SLA of queue {name!r}")
        if policy.max_depth is not None:
            depths[name] = int(policy.max_depth)
    return slas, depths


def seconds(micros: int) -> float:
    """Microseconds as seconds, for display and the report's ``sla_s`` columns."""
    return micros / MICROS
