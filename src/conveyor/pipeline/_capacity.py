"""The capacity plan of one queue, from its per-minute counts, in exact arithmetic.

Spark reduces the jobs to a few numbers per queue (:class:`QueueLoad`); this module turns them into
the plan. Every floor and ceiling the definitions name is taken over integers or fractions, never
over a float: ``floor(44 / 60 * 300)`` is 220, while the same product in floating point is
219.99999999999997 and floors to 219.

Definitions (docs/pipeline.md repeats them): arrival rate = jobs enqueued / the span of whole
minutes from the first to the last minute with an enqueue; peak arrival rate = the busiest minute's
enqueues / 60; mean service time = mean run time; Little's-law concurrency = arrival rate x mean
service time (``peak_concurrency`` with the peak rate); suggested workers = ceil(peak concurrency /
0.75), at least 1; drain rate = the busiest minute's finished jobs / 60; high-water mark =
floor(drain rate x SLA); step-scaling thresholds = floor(50 %), floor(80 %) and floor(10 %) of the
mark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

#: Target worker utilisation used for the suggested worker count.
TARGET_UTILISATION = Fraction(3, 4)
#: Step-scaling thresholds as fractions of the high-water mark: scale out one step, two steps, scale in.
SCALE_OUT_1, SCALE_OUT_2, SCALE_IN = Fraction(1, 2), Fraction(4, 5), Fraction(1, 10)

_MINUTE_US = 60_000_000


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """What the jobs of one queue add up to (every field an exact count)."""

    queue: str
    enqueued: int  # jobs enqueued (archive and live)
    enqueue_minutes: int  # whole minutes from the first to the last minute with an enqueue (0: none)
    peak_enqueued: int  # enqueues in the busiest minute
    peak_finished: int  # jobs that ended in the busiest minute
    runs: int  # jobs with a run time
    run_ms: int  # their run times added up, in whole milliseconds
    max_depth: int  # the deepest the queue was seen


def high_water_mark(peak_finished: int, sla_us: int) -> int:
    """floor(drain rate x SLA) = floor(peak_finished / 60 s x SLA), in integers."""
    return peak_finished * sla_us // _MINUTE_US


def threshold(mark: int, fraction: Fraction) -> int:
    """floor(fraction x mark), exact."""
    return math.floor(fraction * mark)


def plan(load: QueueLoad, sla_us: int, declared_max_depth: int | None = None) -> dict[str, Any]:
    """One row of the ``capacity`` table (column name -> value; rates are floats for display)."""
    window_s = load.enqueue_minutes * 60 if load.enqueue_minutes else None
    arrival = Fraction(load.enqueued, window_s) if window_s else None
    peak_arrival = Fraction(load.peak_enqueued, 60) if load.enqueue_minutes else None
    service = Fraction(load.run_ms, load.runs * 1000) if load.runs else None
    concurrency = arrival * service if arrival is not None and service is not None else None
    peak = peak_arrival * service if peak_arrival is not None and service is not None else None
    workers = max(1, math.ceil(peak / TARGET_UTILISATION)) if peak is not None else 1
    mark = high_water_mark(load.peak_finished, sla_us)
    return {
        "queue": load.queue,
        "enqueued": load.enqueued,
        "window_s": window_s,
        "arrival_rate": _float(arrival),
        "peak_arrival_rate": _float(peak_arrival),
        "mean_service_s": _float(service),
        "concurrency": _float(concurrency),
        "peak_concurrency": _float(peak),
        "drain_rate": float(Fraction(load.peak_finished, 60)),
        "sla_s": sla_us / 1_000_000,
        "high_water_mark": mark,
        "scale_out_1_depth": threshold(mark, SCALE_OUT_1),
        "scale_out_2_depth": threshold(mark, SCALE_OUT_2),
        "scale_in_depth": threshold(mark, SCALE_IN),
        "suggested_workers": workers,
        "max_depth": load.max_depth,
        "declared_max_depth": declared_max_depth,
    }


def _float(value: Fraction | None) -> float | None:
    return None if value is None else float(value)
