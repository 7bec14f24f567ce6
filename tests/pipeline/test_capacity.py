"""The capacity plan's arithmetic and the SLA parsing: exact where the definitions say floor or ceil."""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal
from fractions import Fraction

import pytest

from conveyor.pipeline import PipelineError
from conveyor.pipeline._capacity import QueueLoad, high_water_mark, plan
from conveyor.pipeline._sla import sla_micros


@pytest.mark.parametrize("sla", ["300", "30", "2.5", "0.1", "7.3", "86400"])
def test_high_water_mark_is_the_exact_floor_for_every_count(sla: str) -> None:
    sla_us = sla_micros(sla)
    float_misses = 0
    for finished in range(0, 3000):
        exact = math.floor(Fraction(finished, 60) * Fraction(Decimal(sla)))
        assert high_water_mark(finished, sla_us) == exact, finished
        float_misses += math.floor(finished / 60 * float(sla)) != exact
    if sla == "300":
        # The floating-point formula the report used misses some of these counts (44 among them).
        assert float_misses > 0


def test_plan_floors_thresholds_and_ceils_workers_exactly() -> None:
    # 45 enqueues in the busiest minute (0.75/s) and a mean service of exactly 1 s: peak
    # concurrency 0.75, / 0.75 target utilisation = exactly 1 worker.
    load = QueueLoad(
        "q", enqueued=90, enqueue_minutes=2, peak_enqueued=45, peak_finished=44, runs=4, run_ms=4000, max_depth=7
    )
    row = plan(load, sla_micros(300), declared_max_depth=500)
    assert row["high_water_mark"] == 220
    assert (row["scale_out_1_depth"], row["scale_out_2_depth"], row["scale_in_depth"]) == (110, 176, 22)
    assert row["suggested_workers"] == 1
    assert row["peak_concurrency"] == pytest.approx(0.75)
    assert (row["window_s"], row["arrival_rate"], row["declared_max_depth"], row["max_depth"]) == (120, 0.75, 500, 7)
    idle = plan(QueueLoad("idle", 0, 0, 0, 3, 0, 0, 0), sla_micros(60))
    assert (idle["window_s"], idle["arrival_rate"], idle["suggested_workers"], idle["high_water_mark"]) == (
        None,
        None,
        1,
        3,
    )


def test_sla_values_are_exact_microseconds() -> None:
    assert sla_micros("2.5") == 2_500_000
    assert sla_micros(0.1) == 100_000
    assert sla_micros(300) == 300_000_000
    assert sla_micros(timedelta(minutes=5, microseconds=7)) == 300_000_007
    for bad in ("nan", "inf", "-inf", "1e400", "0", "-3", "0.0000001", "5 seconds", "", float("nan"), float("inf")):
        with pytest.raises(PipelineError):
            sla_micros(bad)
    with pytest.raises(PipelineError, match="at most"):
        sla_micros(timedelta(days=400))
