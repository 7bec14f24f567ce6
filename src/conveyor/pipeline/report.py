"""Job-history analytics on Spark: throughput, depth, latency, SLA, failures and a capacity plan.

Definitions (they are the contract of the numbers; docs/pipeline.md repeats them):

- **ready_at**: when a job could first run: ``max(enqueued_at, run_at)``. A retry moves ``run_at``
  to the retry time and the original is not stored, so when ``run_at`` is after
  ``first_started_at`` (the job was retried) ``enqueued_at`` is used.
- **wait** = ``first_started_at - ready_at`` (every job that started, archive and live; clock
  skew that makes it negative counts as 0). **run** = ``finished_at - started_at`` (completed and
  dead jobs that started: the last delivery's handler time). **end-to-end** = ``finished_at -
  ready_at`` (completed jobs).
- Durations are measured in whole milliseconds (rounded half up) and reported in seconds.
  Percentiles are exact over those values, by linear interpolation between closest ranks
  (Spark's ``percentile``, numpy's default): for ``n`` sorted values ``v[0..n-1]`` the
  ``p``-th percentile is at position ``p * (n - 1)``.
- **SLA breach**: a job whose wait exceeded its queue's SLA (``wait > sla``, strictly).
- **Duplicate delivery**: a job with ``deliveries > attempts`` (a delivery was lost: its worker
  died or hung, and the job was delivered again). **Poison candidate**: a job dead with reason
  ``max_deliveries_exceeded``, or any job with ``deliveries - attempts >= 2``.
- Per-minute tables bucket by the UTC minute (``enqueued_at`` for enqueues, ``finished_at`` for
  completions). **depth** at a minute is the number of jobs enqueued and not yet ended at the end of
  that minute; it is listed only for minutes with an event and is constant in between.
- **Capacity** (per queue): arrival rate = jobs enqueued / the span of whole minutes from the first
  to the last enqueue; peak arrival rate = the busiest minute's enqueues / 60; mean service time =
  mean run time; Little's-law concurrency = arrival rate x mean service time (busy workers on
  average; ``peak_concurrency`` uses the peak rate); drain rate = the busiest minute's finished jobs
  / 60 (the most the queue has been seen to drain); high-water mark = floor(drain rate x SLA) (a
  deeper queue cannot be drained within the SLA); step-scaling thresholds = floor(50 %), floor(80 %)
  of the mark (scale out one step, two steps) and floor(10 %) (scale in); suggested workers =
  ceil(peak concurrency / 0.75) (75 % target utilisation), at least 1.

With ``since``, the input is the jobs that ended at or after ``since`` (plus live jobs), and the
per-minute tables are clipped to minutes from ``since`` on; depth stays exact because every job
in the system at ``since`` ends after it.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.pipeline._progress import NoStages, Stages
from conveyor.pipeline.errors import PipelineError
from conveyor.pipeline.export import input_paths
from conveyor.pipeline.schema import spark_ddl

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The SLA (seconds of wait) of a queue without one of its own.
DEFAULT_SLA_SECONDS = 300.0
#: Target worker utilisation used for the suggested worker count.
TARGET_UTILISATION = 0.75
#: Step-scaling thresholds as fractions of the high-water mark.
SCALE_OUT_1, SCALE_OUT_2, SCALE_IN = 0.5, 0.8, 0.1
PERCENTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
METRICS: tuple[str, ...] = ("wait", "run", "e2e")
TABLES: tuple[str, ...] = ("rates", "depth", "latency", "sla", "outcomes", "failures", "poison", "capacity")

_CHART_POINTS = 240
_CHART_QUEUES = 8
_HTML_ROWS = 25


@dataclass(frozen=True, slots=True)
class ReportResult:
    """Where the report went and what it found: ``summary`` is the content of ``summary.json``."""

    out_dir: Path
    summary: dict[str, Any]
    tables: dict[str, int] = field(default_factory=dict)  # table name -> rows


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """Parse ``--since``: an ISO date or datetime (UTC if naive) or a lookback like ``90m``, ``24h``, ``7d``.

    Raises :class:`PipelineError` for anything else."""
    now = now or datetime.now(UTC)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)]
        return now - timedelta(seconds=float(match.group(1)) * unit)
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise PipelineError(
            f"--since {text!r}: expected an ISO date/time (2026-01-31, 2026-01-31T12:00) or a lookback (24h, 7d)"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_sla(items: Mapping[str, float] | list[str] | tuple[str, ...] | None) -> dict[str, float]:
    """Per-queue SLAs from a mapping or ``queue=seconds`` strings; raises :class:`PipelineError`."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            queue, sep, value = item.partition("=")
            if not sep or not queue:
                raise PipelineError(f"--sla {item!r}: expected QUEUE=SECONDS (e.g. default=300)")
            try:
                pairs.append((queue, float(value)))
            except ValueError:
                raise PipelineError(f"--sla {item!r}: {value!r} is not a number of seconds") from None
    out: dict[str, float] = {}
    for queue, seconds in pairs:
        if not (seconds > 0 and math.isfinite(seconds)):
            raise PipelineError(f"SLA for queue {queue!r} must be a positive number of seconds, got {seconds}")
        out[queue] = float(seconds)
    return out


def load_jobs(spark: SparkSession, input_dir: str | os.PathLike[str], allow_empty: bool = False) -> DataFrame:
    """The exported jobs of ``input_dir`` (archive plus live snapshot) as one DataFrame.

    Read with the export schema, so partition values stay strings. Raises :class:`PipelineError`
    if the directory holds no export (with ``allow_empty``, an existing directory without any
    exported job gives an empty DataFrame instead)."""
    from pathlib import Path

    schema = spark_ddl()
    if allow_empty and Path(input_dir).is_dir() and not any(Path(input_dir).rglob("*.parquet")):
        return spark.createDataFrame([], schema)
    archive, live = input_paths(input_dir)
    frames = []
    if any(archive.rglob("*.parquet")):
        frames.append(spark.read.schema(schema).option("basePath", str(archive)).parquet(str(archive)))
    if live is not None:
        frames.append(spark.read.schema(schema).option("basePath", str(live)).parquet(str(live)))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


def report(
    input_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    since: datetime | str | None = None,
    master: str = "local[*]",
    *,
    sla: Mapping[str, float] | None = None,
    default_sla: float = DEFAULT_SLA_SECONDS,
    spark: SparkSession | None = None,
    stages: Stages | None = None,
    now: datetime | None = None,
) -> ReportResult:
    """Compute every report table from an export directory and write them to ``out_dir``.

    Writes ``out_dir/<table>/`` (Parquet) for each of :data:`TABLES`, ``summary.json`` and a
    self-contained ``report.html``. ``sla`` maps queue -> seconds of acceptable wait; other queues
    use ``default_sla``. ``spark`` is used if given, else a session is built for ``master``. The
    module docstring defines every number. Raises :class:`PipelineError` on bad input."""
    started = time.monotonic()
    stages = stages or NoStages()
    slas = parse_sla(sla)
    if not (default_sla > 0 and math.isfinite(default_sla)):
        raise PipelineError(f"default SLA must be a positive number of seconds, got {default_sla}")
    since_at = parse_since(since, now) if isinstance(since, str) else since
    if since_at is not None and since_at.tzinfo is None:
        since_at = since_at.replace(tzinfo=UTC)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if spark is None:
        from conveyor.pipeline.spark import get_session

        with stages.stage("starting Spark"):
            spark = get_session(master)
    return _Report(spark, out, since_at, slas, default_sla, stages, started).run(input_dir)


class _Report:
    def __init__(
        self,
        spark: SparkSession,
        out: Path,
        since: datetime | None,
        slas: dict[str, float],
        default_sla: float,
        stages: Stages,
        started: float,
    ) -> None:
        self.spark = spark
        self.out = out
        self.since = since
        self.slas = slas
        self.default_sla = default_sla
        self.stages = stages
        self.started = started
        self.rows: dict[str, int] = {}

    # -- input -----------------------------------------------------------------------------------

    def _jobs(self, input_dir: str | os.PathLike[str]) -> DataFrame:
        from pyspark.sql import functions as F

        df = load_jobs(self.spark, input_dir)
        if self.since is not None:
            since_lit = F.lit(self.since).cast("timestamp")
            # The date partition of archive rows is the UTC date of finished_at: filtering on it
            # first lets Spark skip whole directories.
            df = df.where(
                (F.col("source") == "live")
                | ((F.col("date") >= self.since.strftime("%Y-%m-%d")) & (F.col("finished_at") >= since_lit))
            )
        ready_at = F.when(F.col("run_at") <= F.col("first_started_at"), F.greatest("enqueued_at", "run_at")).otherwise(
            F.col("enqueued_at")
        )
        return df.withColumn("ready_at", ready_at)

    # -- run -------------------------------------------------------------------------------------

    def run(self, input_dir: str | os.PathLike[str]) -> ReportResult:
        # Each table below is one scan of the input (only the columns it needs), and each scan
        # aggregates at once: 10 million jobs never travel through a shuffle or to the driver.
        from pyspark.sql import functions as F

        with self.stages.stage("reading export"):
            jobs = self._jobs(input_dir)
            # Not cached: measured on 1M rows, building the in-memory cache cost more than the
            # Parquet scans it saved (each scan reads only the few columns its aggregation needs).
            slim = self._slim(jobs)
        with self.stages.stage("rates and depth per minute"):
            per_minute = self._per_minute(slim).cache()
            self._write("rates", per_minute.drop("depth"), ["queue", "minute"])
            self._write("depth", per_minute.select("queue", "minute", "depth"), ["queue", "minute"])
        with self.stages.stage("latency percentiles and SLA"):
            self._write("latency", self._latency(slim), ["queue", F.asc_nulls_first("priority")])
            self._write("sla", self._sla(), ["queue"])
        with self.stages.stage("retries, dead letters, duplicate deliveries"):
            self._write("outcomes", self._outcomes(jobs), ["queue", F.asc_nulls_first("task")])
        with self.stages.stage("failure taxonomy and poison candidates"):
            self._write("failures", self._failures(jobs), [F.desc("jobs"), "task", "error_type"])
            self._write("poison", self._poison(jobs), [F.desc("lost_deliveries"), "job_id"])
        with self.stages.stage("capacity plan"):
            self._write("capacity", self._capacity(per_minute), ["queue"])
        with self.stages.stage("summary and HTML report"):
            tables = {name: self._read(name) for name in TABLES if name not in ("rates", "depth")}
            charts = self._chart_series(per_minute)
            totals = per_minute.agg(F.sum("enqueued").alias("enqueued")).collect()[0]
            archive = sum(r["jobs"] for r in tables["outcomes"] if r["task"] is None)
            by_source = {"archive": archive, "live": int(totals["enqueued"] or 0) - archive}
            if self.since is not None:
                by_source = {"archive": archive, "live": self._live_count(jobs)}
            summary = self._summary(by_source, tables)
            from conveyor.pipeline._html import render_report

            (self.out / "report.html").write_text(render_report(summary, tables, charts))
        per_minute.unpersist()
        summary["elapsed_s"] = round(time.monotonic() - self.started, 3)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return ReportResult(self.out, summary, dict(self.rows))

    def _live_count(self, jobs: DataFrame) -> int:
        from pyspark.sql import functions as F

        return int(jobs.where(F.col("source") == "live").count())

    def _write(self, name: str, df: DataFrame, order: list[Any]) -> None:
        """Write a (small) result table as one sorted Parquet file and note its row count."""
        import pyarrow.parquet as pq

        path = self.out / name
        # repartition(1) rather than coalesce(1): coalesce would pull the whole upstream stage
        # (a scan of the input, for poison) into one task.
        df.repartition(1).sortWithinPartitions(*order).write.mode("overwrite").parquet(str(path))
        self.rows[name] = sum(pq.ParquetFile(f).metadata.num_rows for f in path.glob("*.parquet"))

    def _read(self, name: str, limit: int = 200) -> list[dict[str, Any]]:
        """The first rows of a written table, in its stored order (for the HTML page and summary).

        Read with pyarrow: the tables are small, and a Spark job per table would cost more than
        reading them."""
        import pyarrow.dataset as ds

        table = ds.dataset(self.out / name, format="parquet").head(limit)
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows

    # -- tables ----------------------------------------------------------------------------------

    def _slim(self, jobs: DataFrame) -> DataFrame:
        """The columns the aggregations need, with minutes and durations (whole ms) computed.

        Both are integer arithmetic on microseconds: ``round()`` on a double goes through
        BigDecimal in Spark (a third of the latency stage's time on 10M rows), and ``date_trunc``
        converts every value through the session time zone."""
        from pyspark.sql import functions as F

        def ms(later: str, earlier: str) -> Any:
            micros = F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))
            # Half up: floor((us + 500) / 1000), exact in a double for any plausible duration;
            # negative durations (clock skew) count as 0. greatest() skips nulls, so a job that
            # never started must be excluded explicitly.
            whole = F.floor((micros + F.lit(500)) / F.lit(1000))
            return F.when(micros.isNotNull(), F.greatest(F.lit(0), whole).cast("long"))

        def minute(col: str) -> Any:
            micros = F.unix_micros(F.col(col))
            return F.timestamp_micros(micros - F.pmod(micros, F.lit(60_000_000)))

        ran = F.col("state").isin("completed", "dead") & F.col("started_at").isNotNull()
        return jobs.select(
            "queue",
            "priority",
            "state",
            minute("enqueued_at").alias("enq_minute"),
            minute("finished_at").alias("fin_minute"),
            ms("first_started_at", "ready_at").alias("wait"),
            F.when(ran & F.col("finished_at").isNotNull(), ms("finished_at", "started_at")).alias("run"),
            F.when(F.col("state") == "completed", ms("finished_at", "ready_at")).alias("e2e"),
        )

    def _per_minute(self, jobs: DataFrame) -> DataFrame:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        # One scan: jobs grouped by (queue, enqueue minute, finish minute) are few (most jobs end
        # within a minute or two of their enqueue), and both per-minute series come from that: each
        # group is an enqueue event and (unless live) a finish event, summed per (queue, minute) in
        # one more aggregation (no join of two series).
        pairs = jobs.groupBy("queue", "enq_minute", "fin_minute").agg(
            F.count(F.lit(1)).cast("long").alias("n"),
            F.sum(F.when(F.col("state") == "completed", 1).otherwise(0)).cast("long").alias("completed"),
            F.sum(F.when(F.col("state") == "dead", 1).otherwise(0)).cast("long").alias("dead"),
        )
        zero = F.lit(0).cast("long")
        events = pairs.select(
            "queue",
            F.inline(
                F.array(
                    F.struct(
                        F.col("enq_minute").alias("minute"),
                        F.col("n").alias("enqueued"),
                        zero.alias("completed"),
                        zero.alias("dead"),
                        zero.alias("finished"),
                    ),
                    F.struct(
                        F.col("fin_minute").alias("minute"),
                        zero.alias("enqueued"),
                        F.col("completed"),
                        F.col("dead"),
                        F.col("n").alias("finished"),
                    ),
                )
            ),
        ).where(F.col("minute").isNotNull())
        counts = ("enqueued", "completed", "dead", "finished")
        both = events.groupBy("queue", "minute").agg(*[F.sum(c).cast("long").alias(c) for c in counts])
        window = Window.partitionBy("queue").orderBy("minute").rowsBetween(Window.unboundedPreceding, 0)
        both = both.withColumn("depth", F.sum(F.col("enqueued") - F.col("finished")).over(window).cast("long"))
        if self.since is not None:
            both = both.where(F.col("minute") >= F.date_trunc("minute", F.lit(self.since).cast("timestamp")))
        return both

    def _latency(self, jobs: DataFrame) -> DataFrame:
        """Wait, run and end-to-end statistics per (queue, priority) and per queue (priority null).

        One scan builds a histogram: jobs counted per (queue, priority, metric, whole
        milliseconds). Durations in whole milliseconds take few distinct values (about 0.8 million
        histogram rows for 10 million jobs), and every statistic follows exactly from the
        histogram: Spark's ``percentile`` takes the counts as frequencies (the same interpolated
        percentile as over the raw values), and the per-queue rows aggregate the histogram again
        rather than the jobs. Percentiles straight over the jobs cost 3x as long: ``percentile``
        keeps a boxed map it updates once per row, and grouping sets had doubled the rows."""
        from pyspark.sql import functions as F

        # unpivot turns each job into one row per metric with an Expand, which Spark compiles
        # into the scan's code; a generator (stack, inline) builds the rows as objects and took
        # 15-20 % longer. Jobs without a value (never started) keep a null value, so that a
        # (queue, priority) whose jobs never ran still gets its row (with zero counts).
        stacked = jobs.select("queue", "priority", *METRICS).unpivot(
            ["queue", "priority"], list(METRICS), "metric", "ms"
        )
        histogram = stacked.groupBy("queue", "priority", "metric", "ms").agg(F.count(F.lit(1)).alias("n"))
        sla_ms = F.coalesce(F.col("sla_s"), F.lit(self.default_sla)) * 1000.0
        histogram = histogram.join(F.broadcast(self._sla_frame()), "queue", "left").withColumn("sla_ms", sla_ms)
        known = F.col("ms").isNotNull()
        breach = (F.col("metric") == "wait") & (F.col("ms") > F.col("sla_ms"))
        percentages = F.array(*[F.lit(p) for p in PERCENTILES])
        per_metric = histogram.groupingSets(
            [["queue", "priority", "metric"], ["queue", "metric"]], "queue", "priority", "metric"
        ).agg(
            F.sum(F.when(known, F.col("n")).otherwise(0)).cast("long").alias("count"),
            F.sum(F.col("ms") * F.col("n")).alias("total_ms"),
            F.percentile("ms", percentages, F.col("n")).alias("p"),
            F.max("ms").alias("max_ms"),
            F.sum(F.when(breach, F.col("n")).otherwise(0)).cast("long").alias("sla_breaches"),
            F.first("sla_ms").alias("sla_ms"),
        )
        # One row per (queue, priority): each metric's statistics side by side.
        aggs: list[Any] = []
        for m in METRICS:

            def of(col: str, m: str = m) -> Any:
                return F.max(F.when(F.col("metric") == m, F.col(col)))

            aggs += [
                F.coalesce(of("count"), F.lit(0)).cast("long").alias(f"{m}_count"),
                (F.try_divide(of("total_ms"), of("count")) / 1000.0).alias(f"{m}_mean_s"),
                *[(of("p")[k] / 1000.0).alias(f"{m}_p{round(p * 100)}_s") for k, p in enumerate(PERCENTILES)],
                (of("max_ms") / 1000.0).alias(f"{m}_max_s"),
            ]
        aggs += [
            (F.max("sla_ms") / 1000.0).alias("sla_s"),
            F.sum("sla_breaches").cast("long").alias("sla_breaches"),
        ]
        return per_metric.groupBy("queue", "priority").agg(*aggs)

    def _sla(self) -> DataFrame:
        """Per queue: the SLA, jobs that started, how many waited longer (from the latency table)."""
        from pyspark.sql import functions as F

        latency = self.spark.read.parquet(str(self.out / "latency")).where(F.col("priority").isNull())
        return latency.select(
            "queue",
            "sla_s",
            F.col("wait_count").alias("started"),
            F.col("sla_breaches").alias("breaches"),
            F.try_divide(F.col("sla_breaches"), F.col("wait_count")).alias("breach_rate"),
            F.col("wait_max_s").alias("worst_wait_s"),
        )

    def _sla_frame(self) -> DataFrame:
        rows = [(q, s) for q, s in sorted(self.slas.items())]
        return self.spark.createDataFrame(rows, "queue STRING, sla_s DOUBLE")

    def _outcomes(self, jobs: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        def count_if(cond: Any) -> Any:
            return F.sum(F.when(cond, 1).otherwise(0)).cast("long")

        ended = jobs.where(F.col("source") == "archive")
        extra = F.greatest(F.col("deliveries") - F.col("attempts"), F.lit(0))
        aggs = [
            F.count(F.lit(1)).cast("long").alias("jobs"),
            count_if(F.col("state") == "completed").alias("completed"),
            count_if(F.col("state") == "dead").alias("dead"),
            count_if(F.col("state") == "expired").alias("expired"),
            count_if(F.col("state") == "cancelled").alias("cancelled"),
            count_if(F.col("attempts") > 1).alias("retried_jobs"),
            F.sum(F.greatest(F.col("attempts") - 1, F.lit(0))).cast("long").alias("retries"),
            count_if(F.col("deliveries") > F.col("attempts")).alias("duplicate_jobs"),
            F.sum(extra).cast("long").alias("extra_deliveries"),
        ]
        # The per-queue rows (task null) add up the per-task rows, which are few: grouping sets
        # over the jobs would send every job through the aggregation twice. The per-task rows are
        # checkpointed (computed now, kept in memory) so that the union below scans the jobs once.
        per_task = ended.groupBy("queue", "task").agg(*aggs).localCheckpoint()
        counts = [c for c in per_task.columns if c not in ("queue", "task")]
        per_queue = per_task.groupBy("queue").agg(*[F.sum(c).cast("long").alias(c) for c in counts])
        out = per_task.unionByName(per_queue.withColumn("task", F.lit(None).cast("string")))
        return out.select(
            "queue",
            "task",
            *counts,
            F.try_divide(F.col("retried_jobs"), F.col("jobs")).alias("retry_rate"),
            F.try_divide(F.col("dead"), F.col("jobs")).alias("dlq_rate"),
            F.try_divide(F.col("duplicate_jobs"), F.col("jobs")).alias("duplicate_rate"),
        )

    def _failures(self, jobs: DataFrame) -> DataFrame:
        # A scan of its own rather than a share of the outcomes scan: the example message is a
        # string aggregate, which Spark's fast hash aggregation cannot hold, and over every job (not
        # only the failed ones) it made the shared aggregation sort all 10 million rows.
        from pyspark.sql import functions as F

        failed = jobs.where((F.col("source") == "archive") & F.col("error_type").isNotNull())
        return failed.groupBy("task", "error_type").agg(
            F.count(F.lit(1)).cast("long").alias("jobs"),
            F.sum(F.when(F.col("state") == "dead", 1).otherwise(0)).cast("long").alias("dead"),
            F.sum(F.when(F.col("state") == "completed", 1).otherwise(0)).cast("long").alias("recovered"),
            F.array_join(F.array_sort(F.collect_set("queue")), ",").alias("queues"),
            F.min("error_message").alias("example_message"),
        )

    def _poison(self, jobs: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        lost = F.col("deliveries") - F.col("attempts")
        cond = (F.col("reason") == "max_deliveries_exceeded") | (lost >= 2)
        return jobs.where(cond).select(
            "job_id",
            "queue",
            "task",
            "state",
            "attempts",
            "deliveries",
            "max_deliveries",
            lost.alias("lost_deliveries"),
            "reason",
            "error_type",
            "enqueued_at",
            "finished_at",
            "source",
        )

    def _capacity(self, per_minute: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        active = per_minute.where(F.col("enqueued") > 0)
        span = active.groupBy("queue").agg(
            F.sum("enqueued").alias("enqueued"),
            ((F.unix_seconds(F.max("minute")) - F.unix_seconds(F.min("minute"))) + 60).alias("window_s"),
            (F.max("enqueued") / 60.0).alias("peak_arrival_rate"),
        )
        drain = per_minute.groupBy("queue").agg(
            (F.max("finished") / 60.0).alias("drain_rate"), F.max("depth").alias("max_depth")
        )
        service = self.spark.read.parquet(str(self.out / "latency")).where(F.col("priority").isNull())
        service = service.select("queue", F.col("run_mean_s").alias("mean_service_s"))
        sla = self._sla_frame()
        cap = (
            drain.join(span, "queue", "left")
            .join(service, "queue", "left")
            .join(F.broadcast(sla), "queue", "left")
            .withColumn("sla_s", F.coalesce("sla_s", F.lit(self.default_sla)))
            .withColumn("arrival_rate", F.try_divide(F.col("enqueued"), F.col("window_s")))
        )
        hwm = F.floor(F.col("drain_rate") * F.col("sla_s"))
        cap = (
            cap.withColumn("concurrency", F.col("arrival_rate") * F.col("mean_service_s"))
            .withColumn("peak_concurrency", F.col("peak_arrival_rate") * F.col("mean_service_s"))
            .withColumn("high_water_mark", hwm.cast("long"))
        )
        return cap.select(
            "queue",
            F.coalesce("enqueued", F.lit(0)).cast("long").alias("enqueued"),
            "window_s",
            "arrival_rate",
            "peak_arrival_rate",
            "mean_service_s",
            "concurrency",
            "peak_concurrency",
            "drain_rate",
            "sla_s",
            "high_water_mark",
            F.floor(F.col("high_water_mark") * SCALE_OUT_1).cast("long").alias("scale_out_1_depth"),
            F.floor(F.col("high_water_mark") * SCALE_OUT_2).cast("long").alias("scale_out_2_depth"),
            F.floor(F.col("high_water_mark") * SCALE_IN).cast("long").alias("scale_in_depth"),
            F.greatest(F.lit(1), F.ceil(F.col("peak_concurrency") / TARGET_UTILISATION))
            .cast("long")
            .alias("suggested_workers"),
            "max_depth",
        )

    # -- charts and summary ---------------------------------------------------------------------

    def _chart_series(self, per_minute: DataFrame) -> dict[str, dict[str, list[tuple[datetime, float]]]]:
        """Per-queue time series for the charts, bucketed to at most ~240 points per line."""
        from pyspark.sql import functions as F

        top = [
            r["queue"]
            for r in per_minute.groupBy("queue")
            .agg(F.sum("enqueued").alias("n"))
            .orderBy(F.desc("n"), "queue")
            .limit(_CHART_QUEUES)
            .collect()
        ]
        bounds = per_minute.agg(F.min("minute").alias("lo"), F.max("minute").alias("hi")).collect()[0]
        charts: dict[str, dict[str, list[tuple[datetime, float]]]] = {"enqueued": {}, "completed": {}, "depth": {}}
        if bounds["lo"] is None or not top:
            return charts
        lo: datetime = bounds["lo"]
        span_min = int((bounds["hi"] - lo).total_seconds() // 60) + 1
        bucket = max(1, math.ceil(span_min / _CHART_POINTS))
        lo_s = int(lo.replace(tzinfo=UTC).timestamp()) if lo.tzinfo is None else int(lo.timestamp())
        idx = F.floor((F.unix_seconds("minute") - F.lit(lo_s)) / F.lit(60 * bucket))
        rows = (
            per_minute.where(F.col("queue").isin(top))
            .groupBy("queue", idx.alias("b"))
            .agg(
                (F.sum("enqueued") / bucket).alias("enqueued"),
                (F.sum("completed") / bucket).alias("completed"),
                F.max("depth").alias("depth"),
            )
            .collect()
        )
        for r in sorted(rows, key=lambda r: (r["queue"], r["b"])):
            at = datetime.fromtimestamp(lo_s + int(r["b"]) * 60 * bucket, UTC)
            for key in charts:
                charts[key].setdefault(r["queue"], []).append((at, float(r[key])))
        return charts

    def _summary(self, by_source: dict[str, int], tables: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        queues: dict[str, dict[str, Any]] = {}
        for row in tables["outcomes"]:
            if row["task"] is None:
                queues.setdefault(row["queue"], {}).update(
                    jobs=row["jobs"],
                    completed=row["completed"],
                    dead=row["dead"],
                    retry_rate=row["retry_rate"],
                    dlq_rate=row["dlq_rate"],
                    duplicate_rate=row["duplicate_rate"],
                )
        for row in tables["latency"]:
            if row["priority"] is None:
                queues.setdefault(row["queue"], {}).update(
                    {f"{m}_p{q}_s": row[f"{m}_p{q}_s"] for m in METRICS for q in (50, 95, 99)}
                )
        for row in tables["sla"]:
            queues.setdefault(row["queue"], {}).update(
                sla_s=row["sla_s"], sla_breaches=row["breaches"], sla_breach_rate=row["breach_rate"]
            )
        for row in tables["capacity"]:
            queues.setdefault(row["queue"], {}).update(
                high_water_mark=row["high_water_mark"],
                suggested_workers=row["suggested_workers"],
                concurrency=row["concurrency"],
            )
        return {
            "generated_at": datetime.now(UTC).isoformat(),
            "since": None if self.since is None else self.since.isoformat(),
            "jobs": {"archive": by_source.get("archive", 0), "live": by_source.get("live", 0)},
            "default_sla_s": self.default_sla,
            "sla_s": self.slas,
            "queues": dict(sorted(queues.items())),
            "tables": {name: {"path": name, "rows": self.rows.get(name, 0)} for name in TABLES},
        }
