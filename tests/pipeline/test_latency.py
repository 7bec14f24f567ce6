"""The driver-side latency statistics agree with percentiles over the raw values (no Spark needed)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from conveyor.pipeline._latency import latency_stats


def _histogram(rows: list[tuple[str, int | None, str, int | None, int]]) -> pa.Table:
    queue, priority, metric, ms, n = zip(*rows, strict=True)
    return pa.table(
        {
            "queue": pa.array(queue, pa.string()),
            "priority": pa.array(priority, pa.int32()),
            "metric": pa.array(metric, pa.string()),
            "ms": pa.array(ms, pa.int64()),
            "n": pa.array(n, pa.int64()),
        }
    )


def _spark_percentile(values: list[int], p: float) -> float:
    """Spark's ``percentile`` over raw values, as its ``getPercentile`` computes it (term for term)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * p
    lower, higher = math.floor(position), math.ceil(position)
    if lower == higher or ordered[lower] == ordered[higher]:
        return float(ordered[lower])
    return (higher - position) * ordered[lower] + (position - lower) * ordered[higher]


def test_percentiles_equal_linear_interpolation_over_the_raw_values() -> None:
    rng = np.random.default_rng(3)
    rows: list[tuple[str, int | None, str, int | None, int]] = []
    raw: dict[tuple[str, int | None, str], list[int]] = {}
    for queue in ("a", "b"):
        for priority in (0, 5):
            for metric in ("wait", "run"):
                values = rng.integers(0, 50, rng.integers(1, 40)) * int(rng.integers(1, 1000))
                distinct, counts = np.unique(values, return_counts=True)
                rows += [(queue, priority, metric, int(v), int(c)) for v, c in zip(distinct, counts, strict=True)]
                raw.setdefault((queue, priority, metric), []).extend(int(v) for v in values)
                raw.setdefault((queue, None, metric), []).extend(int(v) for v in values)
    order = rng.permutation(len(rows))
    stats = latency_stats(_histogram([rows[i] for i in order]), (0.5, 0.95, 0.99), {"a": 5_000_000}, 300_000_000)
    assert len(stats) == len(raw)
    for r in stats:
        values = np.array(raw[(r["queue"], r["priority"], r["metric"])])
        assert r["count"] == len(values)
        assert r["total_ms"] == int(values.sum())
        assert r["max_ms"] == int(values.max())
        assert r["p"] == [_spark_percentile(list(values), q) for q in (0.5, 0.95, 0.99)]
        assert r["p"] == pytest.approx([np.percentile(values, q * 100) for q in (0.5, 0.95, 0.99)])
        sla_us = 5_000_000 if r["queue"] == "a" else 300_000_000
        expected = int((values * 1000 > sla_us).sum()) if r["metric"] == "wait" else 0
        assert (r["sla_breaches"], r["sla_us"]) == (expected, sla_us)


def test_a_group_without_values_keeps_its_row_with_zero_count() -> None:
    stats = latency_stats(
        _histogram([("q", 0, "wait", None, 3), ("q", 0, "run", 10, 2), ("q", 0, "run", None, 1)]),
        (0.5,),
        {},
        1,
    )
    by_key = {(r["priority"], r["metric"]): r for r in stats}
    assert by_key[(0, "wait")]["count"] == 0 and by_key[(0, "wait")]["p"] is None
    assert by_key[(None, "run")]["count"] == 2 and by_key[(None, "run")]["p"] == [10.0]
    assert latency_stats(_histogram([("q", 0, "wait", 1, 1)]).slice(0, 0), (0.5,), {}, 1) == []
