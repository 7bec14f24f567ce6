"""The report on a small history whose every number is worked out by hand in the comments.

Queues and jobs (seconds after T0; wait = first start - ready, ready = max(enqueued, run_at) unless
a retry moved run_at past the first start, then enqueued):

q1, priority 0, task send, completed: enqueued 0, 10, 20, 30, 40; waits 1, 2, 3, 4, 10;
    runs 0.5, 1, 1.5, 2, 2.5 (so e2e 1.5, 3, 4.5, 6, 12.5). All enqueued and finished in minute 0.
q1, priority 5, task charge, dead after 3 attempts (ValueError): enqueued 60, first start 62,
    retried (run_at 100 > first start, so ready = enqueued: wait 2), last start 100, finished 101 (run 1).
q1, live pending job enqueued 120 (minute 2), never started.
q2, priority 0:
    B send: delayed, enqueued 0, run_at 30, started 31 (wait 1), finished 33 (run 2, e2e 3).
    A send: enqueued 5, first start 6 (wait 1), retried to run_at 50, started 50, finished 50.5
        (run 0.5, e2e 45.5); attempts 2, deliveries 3 (one lost delivery); last error TimeoutError.
    C resize: poison, dead max_deliveries_exceeded, attempts 0, deliveries 4; enqueued 9, first start
        13 (wait 4), last start 70, finished 70 (run 0).
    D send: expired, never started, enqueued 20, finished 80.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from conveyor.pipeline import PipelineError, report
from conveyor.pipeline.report import TABLES, parse_since, parse_sla

from .history import T0, at, job_row, write_rows


def floor_in_float(finished: int, sla_s: float) -> int:
    """The high-water mark as the report used to compute it: floor(drain/s x SLA) in floating point."""
    return math.floor(finished / 60 * sla_s)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark")


def history() -> list[dict[str, Any]]:
    rows = []
    for i, (wait, run) in enumerate([(1, 0.5), (2, 1), (3, 1.5), (4, 2), (10, 2.5)]):
        enq = 10 * i
        rows.append(
            job_row(
                job_id=f"q1-{i}",
                queue="q1",
                enqueued_at=at(enq),
                first_started_at=at(enq + wait),
                started_at=at(enq + wait),
                finished_at=at(enq + wait + run),
            )
        )
    rows.append(
        job_row(
            job_id="q1-dead",
            queue="q1",
            task="charge",
            state="dead",
            priority=5,
            attempts=3,
            deliveries=3,
            enqueued_at=at(60),
            run_at=at(100),
            first_started_at=at(62),
            started_at=at(100),
            finished_at=at(101),
            error_type="ValueError",
            error_message="bad amount",
            reason="max_attempts_exceeded",
        )
    )
    rows.append(job_row(job_id="q1-live", queue="q1", state="pending", source="live", enqueued_at=at(120)))
    rows += [
        job_row(
            job_id="q2-B",
            queue="q2",
            enqueued_at=at(0),
            run_at=at(30),
            first_started_at=at(31),
            started_at=at(31),
            finished_at=at(33),
        ),
        job_row(
            job_id="q2-A",
            queue="q2",
            attempts=2,
            deliveries=3,
            enqueued_at=at(5),
            run_at=at(50),
            first_started_at=at(6),
            started_at=at(50),
            finished_at=at(50.5),
            error_type="TimeoutError",
            error_message="slow upstream",
        ),
        job_row(
            job_id="q2-C",
            queue="q2",
            task="resize",
            state="dead",
            attempts=0,
            deliveries=4,
            enqueued_at=at(9),
            first_started_at=at(13),
            started_at=at(70),
            finished_at=at(70),
            reason="max_deliveries_exceeded",
        ),
        job_row(
            job_id="q2-D",
            queue="q2",
            state="expired",
            attempts=0,
            deliveries=0,
            enqueued_at=at(20),
            finished_at=at(80),
            reason="expired",
        ),
    ]
    return rows


def by(rows: list[dict[str, Any]], *keys: str) -> dict[Any, dict[str, Any]]:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def table(spark: SparkSession, out: Path, name: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.parquet(str(out / name)).collect()]


@pytest.fixture(scope="module")
def full_report(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("history")
    rows = history()
    write_rows(base / "export" / "archive", [r for r in rows if r["source"] == "archive"])
    write_rows(base / "export" / "live", [r for r in rows if r["source"] == "live"])
    out = base / "report"
    report(base / "export", out, spark=spark, sla={"q1": 2.5}, default_sla=120.0)
    return out


def test_writes_every_table_summary_and_a_self_contained_html(full_report: Path) -> None:
    for name in TABLES:
        assert list((full_report / name).glob("*.parquet")), name
    html = (full_report / "report.html").read_text()
    assert html.count("<svg") >= 6
    assert "<script" not in html and "src=" not in html and "<link" not in html
    summary = json.loads((full_report / "summary.json").read_text())
    assert summary["jobs"] == {"archive": 10, "live": 1}
    assert summary["queues"]["q1"]["sla_breaches"] == 3


def test_latency_percentiles_are_exact(spark: SparkSession, full_report: Path) -> None:
    lat = by(table(spark, full_report, "latency"), "queue", "priority")
    q1p0 = lat[("q1", 0)]
    assert q1p0["wait_count"] == 5
    # waits 1 2 3 4 10: p50 = 3; p95 at 0.95*4 = 3.8 -> 4 + 0.8*6; p99 at 3.96 -> 4 + 0.96*6.
    assert (q1p0["wait_p50_s"], q1p0["wait_p95_s"], q1p0["wait_p99_s"]) == pytest.approx((3, 8.8, 9.76))
    assert q1p0["wait_mean_s"] == pytest.approx(4.0) and q1p0["wait_max_s"] == 10
    # runs .5 1 1.5 2 2.5: p95 = 2 + 0.8*0.5, p99 = 2 + 0.96*0.5.
    assert (q1p0["run_p50_s"], q1p0["run_p95_s"], q1p0["run_p99_s"]) == pytest.approx((1.5, 2.4, 2.48))
    # e2e 1.5 3 4.5 6 12.5: p95 = 6 + 0.8*6.5, p99 = 6 + 0.96*6.5.
    assert (q1p0["e2e_p50_s"], q1p0["e2e_p95_s"], q1p0["e2e_p99_s"]) == pytest.approx((4.5, 11.2, 12.24))
    q1p5 = lat[("q1", 5)]
    # The retried dead job waited from its enqueue (2 s), ran 1 s, has no end-to-end time.
    assert (q1p5["wait_p50_s"], q1p5["run_p99_s"], q1p5["e2e_count"]) == (2, 1, 0)
    assert q1p5["e2e_p50_s"] is None
    q1 = lat[("q1", None)]
    # All q1 waits 1 2 2 3 4 10: p50 at 2.5 -> 2.5; p95 at 4.75 -> 4 + .75*6; p99 at 4.95 -> 4 + .95*6.
    assert (q1["wait_p50_s"], q1["wait_p95_s"], q1["wait_p99_s"]) == pytest.approx((2.5, 8.5, 9.7))
    # All q1 runs .5 1 1 1.5 2 2.5: p50 1.25, p95 2 + .75*.5, p99 2 + .95*.5.
    assert (q1["run_p50_s"], q1["run_p95_s"], q1["run_p99_s"]) == pytest.approx((1.25, 2.375, 2.475))
    q2 = lat[("q2", None)]
    assert lat[("q2", 0)]["wait_p95_s"] == pytest.approx(q2["wait_p95_s"])
    # waits 1 1 4 (the delayed job is ready at run_at; the retried one at enqueue): p95 1 + .9*3.
    assert (q2["wait_p50_s"], q2["wait_p95_s"], q2["wait_p99_s"]) == pytest.approx((1, 3.7, 3.94))
    # runs 0 .5 2 (the poison job's last delivery never ran); e2e 3 and 45.5.
    assert (q2["run_p50_s"], q2["run_p95_s"], q2["run_mean_s"]) == pytest.approx((0.5, 1.85, 2.5 / 3))
    assert (q2["e2e_p50_s"], q2["e2e_p95_s"], q2["e2e_p99_s"]) == pytest.approx((24.25, 43.375, 45.075))


def test_durations_are_whole_milliseconds_rounded_half_up(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    # Waits in microseconds 1500, 2500, 499, 1000500 and -300000 (clock skew) are 2, 3, 0, 1001 and
    # 0 ms; each run is 500 us, so 1 ms.
    rows = []
    for i, wait_us in enumerate([1500, 2500, 499, 1_000_500, -300_000]):
        start = at(10 * i) + timedelta(microseconds=wait_us)
        rows.append(
            job_row(
                job_id=f"r-{i}",
                queue="r",
                enqueued_at=at(10 * i),
                first_started_at=start,
                started_at=start,
                finished_at=start + timedelta(microseconds=500),
            )
        )
    out = tmp_path / "rounding"
    report(write_history(rows), out, spark=spark)
    r = by(table(spark, out, "latency"), "queue", "priority")[("r", None)]
    # Sorted 0 0 2 3 1001: p50 = 2; p95 at 3.8 -> 3 + 0.8 * 998; p99 at 3.96 -> 3 + 0.96 * 998.
    assert (r["wait_p50_s"], r["wait_p95_s"], r["wait_p99_s"]) == pytest.approx((0.002, 0.8014, 0.96108))
    assert (r["wait_mean_s"], r["wait_max_s"], r["wait_count"]) == (pytest.approx(0.2012), 1.001, 5)
    assert (r["run_p50_s"], r["run_max_s"], r["run_mean_s"]) == (0.001, 0.001, pytest.approx(0.001))


def test_sla_breaches(spark: SparkSession, full_report: Path) -> None:
    sla = by(table(spark, full_report, "sla"), "queue")
    # q1 (SLA 2.5 s): waits 3, 4 and 10 breach of 6 started; q2 (default 120 s): none of 3.
    assert (sla["q1"]["sla_s"], sla["q1"]["started"], sla["q1"]["breaches"]) == (2.5, 6, 3)
    assert sla["q1"]["breach_rate"] == pytest.approx(0.5)
    assert (sla["q2"]["sla_s"], sla["q2"]["started"], sla["q2"]["breaches"]) == (120.0, 3, 0)


def test_rates_and_depth_per_minute(spark: SparkSession, full_report: Path) -> None:
    rates = by(table(spark, full_report, "rates"), "queue", "minute")
    minute = [at(0).replace(tzinfo=None), at(60).replace(tzinfo=None), at(120).replace(tzinfo=None)]

    def counts(queue: str, m: int) -> tuple[int, int, int, int]:
        r = rates[(queue, minute[m])]
        return r["enqueued"], r["completed"], r["dead"], r["finished"]

    assert counts("q1", 0) == (5, 5, 0, 5)
    assert counts("q1", 1) == (1, 0, 1, 1)
    assert counts("q1", 2) == (1, 0, 0, 0)
    assert counts("q2", 0) == (4, 2, 0, 2)
    assert counts("q2", 1) == (0, 0, 1, 2)
    assert len(rates) == 5
    depth = {k: r["depth"] for k, r in by(table(spark, full_report, "depth"), "queue", "minute").items()}
    assert depth == {
        ("q1", minute[0]): 0,
        ("q1", minute[1]): 0,
        ("q1", minute[2]): 1,
        ("q2", minute[0]): 2,
        ("q2", minute[1]): 0,
    }


def test_outcomes_retries_dead_letters_and_duplicate_deliveries(spark: SparkSession, full_report: Path) -> None:
    out = by(table(spark, full_report, "outcomes"), "queue", "task")
    q1, q2 = out[("q1", None)], out[("q2", None)]
    assert (q1["jobs"], q1["completed"], q1["dead"], q1["retried_jobs"], q1["retries"]) == (6, 5, 1, 1, 2)
    assert q1["dlq_rate"] == pytest.approx(1 / 6) and q1["retry_rate"] == pytest.approx(1 / 6)
    assert (q1["duplicate_jobs"], q1["extra_deliveries"]) == (0, 0)
    assert (q2["jobs"], q2["completed"], q2["dead"], q2["expired"], q2["retried_jobs"]) == (4, 2, 1, 1, 1)
    # A (3 deliveries, 2 attempts) and C (4 deliveries, 0 attempts): 2 jobs, 1 + 4 extra deliveries.
    assert (q2["duplicate_jobs"], q2["extra_deliveries"], q2["duplicate_rate"]) == (2, 5, 0.5)
    assert out[("q2", "send")]["jobs"] == 3 and out[("q2", "resize")]["dead"] == 1
    assert out[("q1", "charge")]["dead"] == 1 and len(out) == 2 + 2 + 2


def test_failure_taxonomy_and_poison_candidates(spark: SparkSession, full_report: Path) -> None:
    failures = by(table(spark, full_report, "failures"), "task", "error_type")
    assert set(failures) == {("charge", "ValueError"), ("send", "TimeoutError")}
    assert (failures[("charge", "ValueError")]["dead"], failures[("charge", "ValueError")]["recovered"]) == (1, 0)
    assert failures[("send", "TimeoutError")]["recovered"] == 1
    assert failures[("send", "TimeoutError")]["queues"] == "q2"
    poison = table(spark, full_report, "poison")
    assert [(p["job_id"], p["lost_deliveries"]) for p in poison] == [("q2-C", 4)]


def test_capacity_plan(spark: SparkSession, full_report: Path) -> None:
    cap = by(table(spark, full_report, "capacity"), "queue")
    q1, q2 = cap["q1"], cap["q2"]
    # q1: 7 enqueues over minutes 0..2 (180 s); busiest minute 5 enqueues and 5 finishes;
    # mean service = mean(.5 1 1 1.5 2 2.5) = 8.5/6.
    assert (q1["enqueued"], q1["window_s"]) == (7, 180)
    assert q1["arrival_rate"] == pytest.approx(7 / 180)
    assert q1["peak_arrival_rate"] == pytest.approx(5 / 60)
    assert q1["mean_service_s"] == pytest.approx(8.5 / 6)
    assert q1["concurrency"] == pytest.approx(7 / 180 * 8.5 / 6)
    assert q1["peak_concurrency"] == pytest.approx(5 / 60 * 8.5 / 6)
    assert q1["drain_rate"] == pytest.approx(5 / 60)
    assert (q1["high_water_mark"], q1["suggested_workers"], q1["max_depth"]) == (0, 1, 1)  # floor(5/60*2.5)
    # q2: 4 enqueues in minute 0 (60 s); busiest minute finished 2; SLA 120 -> mark floor(4) = 4.
    assert q2["arrival_rate"] == pytest.approx(4 / 60)
    assert q2["drain_rate"] == pytest.approx(2 / 60)
    assert q2["high_water_mark"] == 4
    assert (q2["scale_out_1_depth"], q2["scale_out_2_depth"], q2["scale_in_depth"]) == (2, 3, 0)
    assert q2["max_depth"] == 2


def test_since_keeps_jobs_that_ended_after_it_and_clips_minutes(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    src = write_history(history())
    out = tmp_path / "since"
    result = report(src, out, since=at(60), spark=spark, sla={"q1": 2.5}, default_sla=120.0)
    # Ended at or after 60 s: q1-dead, q2-C, q2-D, plus the live job.
    assert result.summary["jobs"] == {"archive": 3, "live": 1}
    depth = {(r["queue"], r["minute"]): r["depth"] for r in table(spark, out, "depth")}
    # Depth is still exact from the first kept minute: q2 had C and D in flight through minute 0.
    assert depth == {
        ("q1", at(60).replace(tzinfo=None)): 0,
        ("q1", at(120).replace(tzinfo=None)): 1,
        ("q2", at(60).replace(tzinfo=None)): 0,
    }


def test_bad_input_is_a_pipeline_error(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        report(tmp_path / "nope", tmp_path / "out", spark=spark)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineError, match="no exported jobs"):
        report(tmp_path / "empty", tmp_path / "out", spark=spark)
    with pytest.raises(PipelineError, match="QUEUE=SECONDS"):
        parse_sla(["q1"])
    with pytest.raises(PipelineError, match="more than 0"):
        parse_sla(["q1=-3"])
    with pytest.raises(PipelineError, match="--since"):
        parse_since("yesterday")
    assert parse_since("2026-01-01") == T0
    assert parse_since("90m", now=at(5400)) == T0


def test_high_water_mark_and_thresholds_are_exact_at_the_float_boundary(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    # 44 jobs finish in the busiest minute: drain 44/60 per second, x 300 s = exactly 220, which
    # floating point computes as 219.99999999999997.
    assert floor_in_float(44, 300.0) == 219
    rows = [
        job_row(
            job_id=f"b-{i}",
            queue="b",
            enqueued_at=at(i),
            first_started_at=at(i + 0.5),
            started_at=at(i + 0.5),
            finished_at=at(i + 1),
        )
        for i in range(44)
    ]
    out = tmp_path / "boundary"
    report(write_history(rows), out, spark=spark)  # the default SLA, 300 s
    cap = by(table(spark, out, "capacity"), "queue")["b"]
    assert cap["high_water_mark"] == 44 * 300 // 60
    assert (cap["scale_out_1_depth"], cap["scale_out_2_depth"], cap["scale_in_depth"]) == (
        44 * 300 // 60 // 2,
        44 * 300 // 60 * 4 // 5,
        44 * 300 // 60 // 10,
    )
    assert json.loads((out / "summary.json").read_text())["queues"]["b"]["high_water_mark"] == 220


def test_summary_and_html_count_every_row_of_long_tables(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    # 40 queues x 8 tasks: the outcomes table has 40 x 8 + 40 = 360 rows and the latency table
    # more than 200, past the 200 rows the summary was once built from.
    rows = []
    expected: dict[str, int] = {}
    for q in range(40):
        queue = f"q{q:02d}"
        for t in range(8):
            for i in range(1 + (q + t) % 3):
                start = 60 * q + 7 * t + i
                rows.append(
                    job_row(
                        job_id=f"{queue}-{t}-{i}",
                        queue=queue,
                        task=f"task{t}",
                        priority=t,
                        enqueued_at=at(start),
                        first_started_at=at(start + 1),
                        started_at=at(start + 1),
                        finished_at=at(start + 2),
                    )
                )
                expected[queue] = expected.get(queue, 0) + 1
    live = [
        job_row(job_id=f"live-{i}", queue=f"q{i % 40:02d}", state="pending", source="live", enqueued_at=at(5000 + i))
        for i in range(50)
    ]
    out = tmp_path / "wide"
    result = report(write_history(rows + live), out, spark=spark)
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary, default=str))
    assert summary["jobs"] == {"archive": len(rows), "live": 50}
    assert summary["tables"]["outcomes"]["rows"] == 40 * 8 + 40
    assert summary["tables"]["latency"]["rows"] > 200
    assert {q: v["jobs"] for q, v in summary["queues"].items()} == expected
    assert all("wait_p50_s" in v and "high_water_mark" in v for v in summary["queues"].values())
    html = (out / "report.html").read_text()
    assert f"archive jobs {len(rows):,}, live jobs 50" in html
    # The page shows the first 50 outcome rows and says how many more the table holds.
    assert f"{40 * 8 + 40 - 50:,} more rows in the Parquet table" in html


def test_queue_names_outside_ascii_survive_the_partition_directories(
    spark: SparkSession, write_history: Callable[..., Path], tmp_path: Path
) -> None:
    # The export writes queue=%C3%A9mails for "émails"; Spark alone would read it back as "Ã©mails".
    names = ["émails", "日本", "a b", "plain"]
    rows = [
        job_row(job_id=f"j{i}", queue=name, enqueued_at=at(i), first_started_at=at(i + 1), finished_at=at(i + 2))
        for i, name in enumerate(names)
    ]
    live = job_row(job_id="live", queue="émails", state="pending", source="live", enqueued_at=at(9))
    out = tmp_path / "names"
    result = report(write_history([*rows, live]), out, spark=spark, sla={"émails": 1})
    assert sorted(result.summary["queues"]) == sorted(names)
    assert result.summary["queues"]["émails"]["sla_s"] == 1
    assert sorted(r["queue"] for r in table(spark, out, "sla")) == sorted(names)
    assert result.summary["jobs"] == {"archive": 4, "live": 1}
