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
  ceil(peak concurrency / 0.75) (75 % target utilisation), at least 1. Every floor and ceiling is
  exact (integers and fractions, :mod:`conveyor.pipeline._capacity`), SLAs are whole microseconds.

How it runs: four scans of the input, each reading only its columns and reducing the jobs at once
to a small result (the latency histogram, per-minute counts, outcome counts, the few failed or
poison jobs), kept as Parquet under ``OUT/_work`` while the report runs; every table derives from
those. Nothing the size of the input reaches a shuffle or the driver, so any number of jobs fits
in a fixed amount of memory: the driver reads back only small results (the histogram, bounded by
distinct millisecond values, for the exact percentiles; the outcome counts; a few rows per queue).

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

from conveyor.pipeline import _capacity
from conveyor.pipeline._outdir import claim_dir
from conveyor.pipeline._progress import NoStages, Stages
from conveyor.pipeline._sla import DEFAULT_SLA_SECONDS, SlaValue, parse_sla, seconds, sla_micros
from conveyor.pipeline.errors import PipelineError
from conveyor.pipeline.export import input_paths
from conveyor.pipeline.schema import spark_ddl

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DEFAULT_SLA_SECONDS",
    "METRICS",
    "PERCENTILES",
    "REPORT_COLUMNS",
    "TABLES",
    "ReportResult",
    "load_jobs",
    "parse_since",
    "parse_sla",
    "report",
]

PERCENTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
METRICS: tuple[str, ...] = ("wait", "run", "e2e")
TABLES: tuple[str, ...] = ("rates", "depth", "latency", "sla", "outcomes", "failures", "poison", "capacity")
#: Every export column some table of the report reads (the benchmark's floor reads the same).
REPORT_COLUMNS: tuple[str, ...] = (
    "job_id",
    "queue",
    "task",
    "state",
    "priority",
    "attempts",
    "deliveries",
    "max_deliveries",
    "enqueued_at",
    "run_at",
    "first_started_at",
    "started_at",
    "finished_at",
    "error_type",
    "error_message",
    "reason",
    "source",
)

_CHART_POINTS = 240
#: Chart series: series name -> queue -> (time, value) points.
_Charts = dict[str, dict[str, list[tuple[datetime, float]]]]
_CHART_QUEUES = 8
#: The file that marks a directory as a report's output (the report replaces only such a directory).
REPORT_MARKER = "_conveyor_report"


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
        try:
            return now - timedelta(seconds=float(match.group(1)) * unit)
        except OverflowError:
            raise PipelineError(f"--since {text.strip()!r}: a lookback that long is out of range") from None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise PipelineError(
            f"--since {text!r}: expected an ISO date/time (2026-01-31, 2026-01-31T12:00) or a lookback (24h, 7d)"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


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
    empty = next((p for base in (archive, live) if base is not None for p in base.glob("*/queue=")), None)
    if empty is not None:
        # Exports before the empty queue name was written as a null partition value named it so.
        raise PipelineError(
            f"{empty}: Spark cannot read a partition directory without a value; rename it to "
            f"{empty.name}__HIVE_DEFAULT_PARTITION__ (the queue named '')"
        )
    frames = []
    if any(archive.rglob("*.parquet")):
        frames.append(spark.read.schema(schema).option("basePath", str(archive)).parquet(str(archive)))
    if live is not None:
        frames.append(spark.read.schema(schema).option("basePath", str(live)).parquet(str(live)))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    from pyspark.sql import functions as F

    if _has_encoded_bytes(archive, live):
        # The export names partition directories as pyarrow does: a queue's UTF-8 bytes outside
        # ASCII as %XX (queue=%C3%A9mails). Spark decodes each %XX to the character of that code,
        # so "émails" would read as "Ã©mails"; encoding those characters back to bytes and decoding
        # them as UTF-8 restores the name (ASCII names are unchanged).
        df = df.withColumn("queue", F.decode(F.encode(F.col("queue"), "ISO-8859-1"), "UTF-8"))
    return restore_queue(df)


def restore_queue(df: DataFrame) -> DataFrame:
    """``df`` (read with the export schema) with each row's whole queue name in ``queue``."""
    from pyspark.sql import functions as F

    # The export writes the empty queue name as a null partition value (see export._Columns.table),
    # and a name too long for a directory name in the queue_name column (schema.queue_dir_value).
    return df.withColumn("queue", F.coalesce(F.col("queue_name"), F.col("queue"), F.lit("")))


def _has_encoded_bytes(*bases: Path | None) -> bool:
    """Whether any queue partition directory below ``bases`` has a %XX escape of a non-ASCII byte."""
    pattern = re.compile(r"%[89A-Fa-f][0-9A-Fa-f]")
    return any(pattern.search(path.name) for base in bases if base is not None for path in base.glob("*/queue=*"))


def report(
    input_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    since: datetime | str | None = None,
    master: str | None = None,
    *,
    sla: Mapping[str, SlaValue] | None = None,
    default_sla: SlaValue = DEFAULT_SLA_SECONDS,
    spark: SparkSession | None = None,
    stages: Stages | None = None,
    now: datetime | None = None,
    declared_max_depth: Mapping[str, int] | None = None,
) -> ReportResult:
    """Compute every report table from an export directory and write them to ``out_dir``.

    Writes ``out_dir/<table>/`` (Parquet) for each of :data:`TABLES`, ``summary.json`` and a
    self-contained ``report.html``. ``sla`` maps queue -> acceptable wait (seconds or a
    ``timedelta``); other queues use ``default_sla``. ``declared_max_depth`` (queue -> the
    ``max_depth`` the queue declares) is shown beside the computed high-water mark. ``spark`` is
    used if given, else a session is built for ``master``. The module docstring defines every
    number.

    ``out_dir`` must be new, empty, or an earlier report's output: a directory holding anything
    else is refused, since the report replaces its table folders. Raises :class:`PipelineError`
    on bad input."""
    started = time.monotonic()
    stages = stages or NoStages()
    slas = parse_sla(sla)
    default_us = sla_micros(default_sla, "default SLA")
    depths = {str(q): int(d) for q, d in (declared_max_depth or {}).items()}
    since_at = parse_since(since, now) if isinstance(since, str) else since
    if since_at is not None and since_at.tzinfo is None:
        since_at = since_at.replace(tzinfo=UTC)
    input_paths(input_dir)
    out = claim_dir(out_dir, REPORT_MARKER, "report", legacy=("summary.json", "report.html"))
    if spark is None:
        from conveyor.pipeline.spark import get_session

        with stages.stage("starting Spark"):
            spark = get_session(master)
    return _Report(spark, out, since_at, slas, default_us, depths, stages, started).run(input_dir)


class _Report:
    def __init__(
        self,
        spark: SparkSession,
        out: Path,
        since: datetime | None,
        slas: dict[str, int],
        default_us: int,
        depths: dict[str, int],
        stages: Stages,
        started: float,
    ) -> None:
        self.spark = spark
        self.out = out
        self.work = out / "_work"
        self.since = since
        self.slas = slas  # queue -> SLA in microseconds
        self.default_us = default_us
        self.depths = depths  # queue -> declared max_depth
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
        # Four scans of the input, run as concurrent Spark jobs, each reading only the columns it
        # needs and reducing the jobs at once to a small result kept under _work/: the latency
        # histogram, the per-minute counts, the outcome counts, and the few failed or poison jobs.
        # Every table derives from those, so 100 million jobs never travel through a shuffle or to
        # the driver. (One grouping-sets aggregation for the first three measured slower than
        # three: 9.4 against 7.4 s warm on 10M jobs; the scans are cheap, the aggregations are the
        # work.)
        import shutil

        try:
            with self.stages.stage("reading export"):
                # One listing of the export's files for both plans.
                jobs = self._jobs(input_dir)
                slim, exceptional = self._slim(jobs), self._exceptional(jobs)
            scans = {
                "histogram": self._histogram_of(slim),
                "pairs": self._pairs_of(slim),
                "outcomes": self._outcome_counts(slim),
                "exceptional": exceptional,
            }
            # The four jobs are submitted together: while one is planned and compiled on the driver,
            # or finishes its last task, the others keep both cores busy (measured on 10M jobs:
            # 21.5-22.9 s for the four together against 24.1-34.6 s one after the other, the same CPU).
            # Then the tables, also together: a few small jobs each, mostly the driver's latency.
            # (Starting each scan's tables as soon as that scan ended, beside the histogram's scan,
            # was slower: 31.1 and 38.1 s against 28.4 and 30.5 s for scans, then tables.)
            from concurrent.futures import ThreadPoolExecutor

            scanning = "scans: latency histogram, per-minute counts, outcomes, failed and poison jobs"
            with self.stages.stage(scanning), ThreadPoolExecutor(max_workers=len(scans)) as pool:
                for future in [pool.submit(self._stash, name, df) for name, df in scans.items()]:
                    future.result()
            tables = "tables: latency and SLA, rates and depth, outcomes, failures and poison candidates"
            with self.stages.stage(tables), ThreadPoolExecutor(max_workers=4) as pool:
                latency = pool.submit(self._write_latency_and_sla)
                per_minute = pool.submit(self._per_minute_tables)
                outcomes = pool.submit(self._outcome_tables)
                failures = pool.submit(self._failure_tables)
                runs, (loads, charts), counts = latency.result(), per_minute.result(), outcomes.result()
                failures.result()
            with self.stages.stage("capacity plan"):
                self._write_capacity(loads, runs)
            with self.stages.stage("summary and HTML report"):
                summary = self._summary(counts)
                from conveyor.pipeline._html import render_report

                page = render_report(summary, self._html_tables(), charts, self.rows)
                (self.out / "report.html").write_text(page)
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
        summary["elapsed_s"] = round(time.monotonic() - self.started, 3)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return ReportResult(self.out, summary, dict(self.rows))

    def _per_minute_tables(self) -> tuple[list[Any], _Charts]:
        """The rates and depth tables; returns each queue's load (for the capacity plan) and the
        chart series."""
        per_minute = self._per_minute(self._stashed("pairs")).localCheckpoint()
        try:
            self._write("rates", per_minute.drop("depth"), ["queue", "minute"])
            self._write("depth", per_minute.select("queue", "minute", "depth"), ["queue", "minute"])
            return self._capacity_loads(per_minute), self._chart_series(per_minute)
        finally:
            per_minute.unpersist()

    def _outcome_tables(self) -> dict[str, int]:
        """The outcomes table; returns the archived and live job counts."""
        from pyspark.sql import functions as F

        self._write("outcomes", self._outcomes(), ["queue", F.asc_nulls_first("task")])
        return self._job_counts()

    def _failure_tables(self) -> None:
        """The failures and poison tables, from the failed and poison jobs."""
        from pyspark.sql import functions as F

        exceptional = self._stashed("exceptional")
        self._write("failures", self._failures(exceptional), [F.desc("jobs"), "task", "error_type"])
        self._write("poison", self._poison(exceptional), [F.desc("lost_deliveries"), "job_id"])

    def _stash(self, name: str, df: DataFrame) -> None:
        """Compute ``df`` (a small aggregate) and keep it under _work/ for the tables to read.

        Parquet on local disk rather than Spark's cache: it holds at any size (out of core), and
        each later read is a cheap scan of a few columns."""
        df.write.mode("overwrite").parquet(str(self.work / name))

    def _stashed(self, name: str) -> DataFrame:
        return self.spark.read.parquet(str(self.work / name))

    def _write(self, name: str, df: DataFrame, order: list[Any]) -> None:
        """Write a (small) result table as one sorted Parquet file and note its row count."""
        import pyarrow.parquet as pq

        path = self.out / name
        # repartition(1) rather than coalesce(1): coalesce would pull the whole upstream stage
        # into one task.
        df.repartition(1).sortWithinPartitions(*order).write.mode("overwrite").parquet(str(path))
        self.rows[name] = sum(pq.ParquetFile(f).metadata.num_rows for f in path.glob("*.parquet"))

    def _read(self, name: str, where: Any = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Rows of a written table in its stored order: all of them, those matching ``where`` (a
        pyarrow expression), or the first ``limit``. Read with pyarrow: the tables are small, and a
        Spark job per table would cost more than reading them."""
        import pyarrow.dataset as ds

        dataset = ds.dataset(self.out / name, format="parquet")
        table = dataset.head(limit) if limit is not None else dataset.to_table(filter=where)
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows

    # -- the scans --------------------------------------------------------------------------------

    def _slim(self, jobs: DataFrame) -> DataFrame:
        """Per job, what the aggregations need: minutes and durations (whole ms) computed.

        Each scan selects some of these columns and Spark reads only the input columns behind
        them. Both are integer arithmetic on microseconds: ``round()`` on a double goes through
        BigDecimal in Spark (a third of the latency stage's time on 10M rows), and ``date_trunc``
        converts every value through the session time zone."""
        from pyspark.sql import functions as F

        def ms(later: str, earlier: str) -> Any:
            micros = F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))
            # Half up: floor((us + 500) / 1000); negative durations (clock skew) count as 0.
            # greatest() skips nulls, so a job that never started must be excluded explicitly.
            whole = F.floor((micros + F.lit(500)) / F.lit(1000))
            return F.when(micros.isNotNull(), F.greatest(F.lit(0), whole).cast("long"))

        def minute(col: str) -> Any:
            micros = F.unix_micros(F.col(col))
            return F.timestamp_micros(micros - F.pmod(micros, F.lit(60_000_000)))

        state = F.col("state")
        ran = state.isin("completed", "dead") & F.col("started_at").isNotNull() & F.col("finished_at").isNotNull()
        return jobs.select(
            "queue",
            "priority",
            "task",
            "state",
            "attempts",
            "deliveries",
            (F.col("source") == "archive").alias("archived"),
            minute("enqueued_at").alias("enq_minute"),
            minute("finished_at").alias("fin_minute"),
            ms("first_started_at", "ready_at").alias("wait"),
            F.when(ran, ms("finished_at", "started_at")).alias("run"),
            F.when(state == "completed", ms("finished_at", "ready_at")).alias("e2e"),
        )

    def _histogram_of(self, slim: DataFrame) -> DataFrame:
        """Jobs counted per (queue, priority, metric, whole milliseconds).

        Durations in whole milliseconds take few distinct values (about 0.8 million histogram rows
        for 10 million jobs), and every latency statistic follows exactly from them. ``unpivot``
        turns each job into one row per metric with an Expand that Spark compiles into the scan's
        code (a generator, stack or inline, took 15-20 % longer). Jobs without a value (never
        started) keep a null value, so that a (queue, priority) whose jobs never ran still gets its
        row."""
        from pyspark.sql import functions as F

        stacked = slim.select("queue", "priority", *METRICS).unpivot(
            ["queue", "priority"], list(METRICS), "metric", "ms"
        )
        return stacked.groupBy("queue", "priority", "metric", "ms").agg(F.count(F.lit(1)).alias("n"))

    def _pairs_of(self, slim: DataFrame) -> DataFrame:
        """Jobs counted per (queue, enqueue minute, finish minute): few groups, since most jobs end
        within a minute or two of their enqueue; both per-minute series come from them."""
        from pyspark.sql import functions as F

        return slim.groupBy("queue", "enq_minute", "fin_minute").agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.when(F.col("state") == "completed", 1).otherwise(0)).cast("long").alias("completed"),
            F.sum(F.when(F.col("state") == "dead", 1).otherwise(0)).cast("long").alias("dead"),
        )

    def _outcome_counts(self, slim: DataFrame) -> DataFrame:
        """Per (queue, task, archived): jobs, end states, retries and lost deliveries. Live jobs
        (archived false) count only towards the summary's totals."""
        from pyspark.sql import functions as F

        def count_if(cond: Any) -> Any:
            return F.sum(F.when(cond, 1).otherwise(0)).cast("long")

        state = F.col("state")
        return slim.groupBy("queue", "task", "archived").agg(
            F.count(F.lit(1)).alias("jobs"),
            count_if(state == "completed").alias("completed"),
            count_if(state == "dead").alias("dead"),
            count_if(state == "expired").alias("expired"),
            count_if(state == "cancelled").alias("cancelled"),
            count_if(F.col("attempts") > 1).alias("retried_jobs"),
            F.sum(F.greatest(F.col("attempts") - 1, F.lit(0))).cast("long").alias("retries"),
            count_if(F.col("deliveries") > F.col("attempts")).alias("duplicate_jobs"),
            F.sum(F.greatest(F.col("deliveries") - F.col("attempts"), F.lit(0))).cast("long").alias("extra_deliveries"),
        )

    def _exceptional(self, jobs: DataFrame) -> DataFrame:
        """The jobs that failed (archived, with an error) or look like poison (live ones too).

        Few rows (a few per cent), and the only ones the failure taxonomy and the poison table need:
        one scan for both. (Sharing the outcomes' scan instead made that aggregation sort every
        job: the example message is a string aggregate, which Spark's hash aggregation cannot hold.)"""
        from pyspark.sql import functions as F

        failed = (F.col("source") == "archive") & F.col("error_type").isNotNull()
        return jobs.where(failed | _poison_condition()).select(
            "job_id",
            "queue",
            "task",
            "state",
            "attempts",
            "deliveries",
            "max_deliveries",
            "reason",
            "error_type",
            "error_message",
            "enqueued_at",
            "finished_at",
            "source",
        )

    # -- tables ----------------------------------------------------------------------------------

    def _per_minute(self, pairs: DataFrame) -> DataFrame:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        # Jobs grouped by (queue, enqueue minute, finish minute) are few (most jobs end within a
        # minute or two of their enqueue), and both per-minute series come from them: each group is
        # an enqueue event and (unless live) a finish event, summed per (queue, minute) in one more
        # aggregation (no join of two series).
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

    def _latency(self) -> list[dict[str, Any]]:
        """Wait, run and end-to-end statistics per (queue, priority, metric) and per (queue, metric)
        (priority None), from the stored histogram (:func:`conveyor.pipeline._latency.latency_stats`).

        The histogram is read here with pyarrow and reduced with numpy: its size is bounded by the
        distinct millisecond values per (queue, priority, metric), not by the jobs, and its sorted
        cumulative counts give the exact ranks directly. (Spark's ``percentile`` with the counts as
        frequencies gives the same values but took 4.2 s of the 10M-job report; percentiles straight
        over the jobs took 3x that again.) Jobs without a value (never started) keep a null value, so
        that a (queue, priority) whose jobs never ran still gets its row (with zero counts)."""
        import pyarrow.dataset as ds

        from conveyor.pipeline._latency import latency_stats

        histogram = ds.dataset(self.work / "histogram", format="parquet").to_table(
            columns=["queue", "priority", "metric", "ms", "n"]
        )
        return latency_stats(histogram, PERCENTILES, self.slas, self.default_us)

    def _write_latency_and_sla(self) -> dict[str, tuple[int, int]]:
        """The latency table (one row per queue and priority, each metric's statistics side by
        side) and the SLA table, pivoted here from the per-metric statistics. Returns each queue's
        runs and their total milliseconds (for the capacity plan)."""
        stats: dict[tuple[str, int | None], dict[str, Any]] = {}
        runs: dict[str, tuple[int, int]] = {}
        for r in self._latency():
            row = stats.setdefault((r["queue"], r["priority"]), {"queue": r["queue"], "priority": r["priority"]})
            m, count = r["metric"], int(r["count"] or 0)
            if m == "run" and r["priority"] is None:
                runs[r["queue"]] = (count, int(r["total_ms"] or 0))
            row[f"{m}_count"] = count
            row[f"{m}_mean_s"] = r["total_ms"] / count / 1000.0 if count and r["total_ms"] is not None else None
            for k, p in enumerate(PERCENTILES):
                row[f"{m}_p{round(p * 100)}_s"] = None if r["p"] is None else r["p"][k] / 1000.0
            row[f"{m}_max_s"] = None if r["max_ms"] is None else r["max_ms"] / 1000.0
            row["sla_s"] = r["sla_us"] / 1e6
            row["sla_breaches"] = row.get("sla_breaches", 0) + int(r["sla_breaches"] or 0)
        latency = [stats[k] for k in sorted(stats, key=lambda k: (k[0], k[1] is not None, k[1] or 0))]
        for row in latency:
            for m in METRICS:
                row.setdefault(f"{m}_count", 0)
        self._write_rows("latency", latency, _latency_schema())
        sla = [
            {
                "queue": row["queue"],
                "sla_s": row["sla_s"],
                "started": row["wait_count"],
                "breaches": row["sla_breaches"],
                "breach_rate": row["sla_breaches"] / row["wait_count"] if row["wait_count"] else None,
                "worst_wait_s": row.get("wait_max_s"),
            }
            for row in latency
            if row["priority"] is None
        ]
        self._write_rows("sla", sla, _sla_schema())
        return runs

    def _write_rows(self, name: str, rows: list[dict[str, Any]], schema: Any) -> None:
        """Write a small table built in Python as one Parquet file (the layout Spark's tables have)."""
        import shutil

        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(rows, schema=schema)
        path = self.out / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir()
        pq.write_table(table, path / "part-00000.parquet")
        self.rows[name] = table.num_rows

    def _sla_frame(self) -> DataFrame:
        rows = [(q, us) for q, us in sorted(self.slas.items())]
        return self.spark.createDataFrame(rows, "queue STRING, sla_us BIGINT")

    def _outcomes(self) -> DataFrame:
        from pyspark.sql import functions as F

        # The per-queue rows (task null) add up the per-task rows; live jobs have no outcome yet.
        per_task = self._stashed("outcomes").where(F.col("archived")).drop("archived")
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

    def _failures(self, exceptional: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        failed = exceptional.where((F.col("source") == "archive") & F.col("error_type").isNotNull())
        return failed.groupBy("task", "error_type").agg(
            F.count(F.lit(1)).cast("long").alias("jobs"),
            F.sum(F.when(F.col("state") == "dead", 1).otherwise(0)).cast("long").alias("dead"),
            F.sum(F.when(F.col("state") == "completed", 1).otherwise(0)).cast("long").alias("recovered"),
            F.array_join(F.array_sort(F.collect_set("queue")), ",").alias("queues"),
            F.min("error_message").alias("example_message"),
        )

    def _poison(self, exceptional: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        lost = F.col("deliveries") - F.col("attempts")
        return exceptional.where(_poison_condition()).select(
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

    def _capacity_loads(self, per_minute: DataFrame) -> list[Any]:
        """Each queue's enqueues, their span, its busiest minutes and deepest depth (a few rows)."""
        from pyspark.sql import functions as F

        enq_minute = F.when(F.col("enqueued") > 0, F.unix_seconds("minute"))
        return (
            per_minute.groupBy("queue")
            .agg(
                F.sum("enqueued").cast("long").alias("enqueued"),
                F.min(enq_minute).alias("first_s"),
                F.max(enq_minute).alias("last_s"),
                F.max("enqueued").cast("long").alias("peak_enqueued"),
                F.max("finished").cast("long").alias("peak_finished"),
                F.max("depth").cast("long").alias("max_depth"),
            )
            .collect()
        )

    def _write_capacity(self, loads: list[Any], runs: dict[str, tuple[int, int]]) -> None:
        """The capacity table: Spark has reduced each queue to a few counts (``loads``, ``runs``),
        Python does the exact arithmetic (:mod:`conveyor.pipeline._capacity`)."""
        rows = []
        for r in sorted(loads, key=lambda r: r["queue"]):
            queue = r["queue"]
            count, total = runs.get(queue, (0, 0))
            minutes = (r["last_s"] - r["first_s"]) // 60 + 1 if r["first_s"] is not None else 0
            load = _capacity.QueueLoad(
                queue=queue,
                enqueued=int(r["enqueued"] or 0),
                enqueue_minutes=int(minutes),
                peak_enqueued=int(r["peak_enqueued"] or 0),
                peak_finished=int(r["peak_finished"] or 0),
                runs=count,
                run_ms=total,
                max_depth=int(r["max_depth"] or 0),
            )
            rows.append(_capacity.plan(load, self.slas.get(queue, self.default_us), self.depths.get(queue)))
        self._write_rows("capacity", rows, _capacity_schema())

    # -- charts and summary ---------------------------------------------------------------------

    def _chart_series(self, per_minute: DataFrame) -> _Charts:
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
        charts: _Charts = {"enqueued": {}, "completed": {}, "depth": {}}
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

    def _job_counts(self) -> dict[str, int]:
        """Archived and live jobs in the report's input (after ``since``), from the outcome counts
        (a few rows per queue and task, read with pyarrow)."""
        import pyarrow.dataset as ds

        counts = {"archive": 0, "live": 0}
        table = ds.dataset(self.work / "outcomes", format="parquet").to_table(columns=["archived", "jobs"])
        for archived, jobs in zip(table.column("archived").to_pylist(), table.column("jobs").to_pylist(), strict=True):
            counts["archive" if archived else "live"] += int(jobs)
        return counts

    def _html_tables(self) -> dict[str, list[dict[str, Any]]]:
        """What the HTML page shows: every per-queue row, and the head of the longer tables (the
        page says how many more rows each Parquet table has)."""
        import pyarrow.compute as pc

        return {
            "latency": self._read("latency", limit=100),
            "latency_by_queue": self._read("latency", where=pc.field("priority").is_null()),
            "sla": self._read("sla"),
            "outcomes": self._read("outcomes", limit=50),
            "outcomes_by_queue": self._read("outcomes", where=pc.field("task").is_null()),
            "failures": self._read("failures", limit=25),
            "poison": self._read("poison", limit=25),
            "capacity": self._read("capacity"),
        }

    def _summary(self, jobs: dict[str, int]) -> dict[str, Any]:
        """The content of summary.json: totals, and one entry per queue (every queue)."""
        import pyarrow.compute as pc

        queues: dict[str, dict[str, Any]] = {}
        for row in self._read("outcomes", where=pc.field("task").is_null()):
            queues.setdefault(row["queue"], {}).update(
                jobs=row["jobs"],
                completed=row["completed"],
                dead=row["dead"],
                retry_rate=row["retry_rate"],
                dlq_rate=row["dlq_rate"],
                duplicate_rate=row["duplicate_rate"],
            )
        for row in self._read("latency", where=pc.field("priority").is_null()):
            queues.setdefault(row["queue"], {}).update(
                {f"{m}_p{q}_s": row[f"{m}_p{q}_s"] for m in METRICS for q in (50, 95, 99)}
            )
        for row in self._read("sla"):
            queues.setdefault(row["queue"], {}).update(
                sla_s=row["sla_s"], sla_breaches=row["breaches"], sla_breach_rate=row["breach_rate"]
            )
        for row in self._read("capacity"):
            queues.setdefault(row["queue"], {}).update(
                high_water_mark=row["high_water_mark"],
                declared_max_depth=row["declared_max_depth"],
                suggested_workers=row["suggested_workers"],
                concurrency=row["concurrency"],
            )
        return {
            "generated_at": datetime.now(UTC).isoformat(),
            "since": None if self.since is None else self.since.isoformat(),
            "jobs": jobs,
            "default_sla_s": seconds(self.default_us),
            "sla_s": {q: seconds(us) for q, us in sorted(self.slas.items())},
            "queues": dict(sorted(queues.items())),
            "tables": {name: {"path": name, "rows": self.rows.get(name, 0)} for name in TABLES},
        }


def _poison_condition() -> Any:
    """A poison candidate: dead with reason max_deliveries_exceeded, or two or more lost deliveries."""
    from pyspark.sql import functions as F

    lost = F.col("deliveries") - F.col("attempts")
    return (F.col("reason") == "max_deliveries_exceeded") | (lost >= 2)


def _capacity_schema() -> Any:
    """The Arrow schema of the capacity table."""
    import pyarrow as pa

    i64, f64 = pa.int64(), pa.float64()
    return pa.schema(
        [
            ("queue", pa.string()),
            ("enqueued", i64),
            ("window_s", i64),
            ("arrival_rate", f64),
            ("peak_arrival_rate", f64),
            ("mean_service_s", f64),
            ("concurrency", f64),
            ("peak_concurrency", f64),
            ("drain_rate", f64),
            ("sla_s", f64),
            ("high_water_mark", i64),
            ("scale_out_1_depth", i64),
            ("scale_out_2_depth", i64),
            ("scale_in_depth", i64),
            ("suggested_workers", i64),
            ("max_depth", i64),
            ("declared_max_depth", i64),
        ]
    )


def _latency_schema() -> Any:
    """The Arrow schema of the latency table."""
    import pyarrow as pa

    fields: list[tuple[str, Any]] = [("queue", pa.string()), ("priority", pa.int32())]
    for m in METRICS:
        fields.append((f"{m}_count", pa.int64()))
        fields += [(f"{m}_{s}", pa.float64()) for s in ("mean_s", "p50_s", "p95_s", "p99_s", "max_s")]
    fields += [("sla_s", pa.float64()), ("sla_breaches", pa.int64())]
    return pa.schema(fields)


def _sla_schema() -> Any:
    """The Arrow schema of the SLA table."""
    import pyarrow as pa

    return pa.schema(
        [
            ("queue", pa.string()),
            ("sla_s", pa.float64()),
            ("started", pa.int64()),
            ("breaches", pa.int64()),
            ("breach_rate", pa.float64()),
            ("worst_wait_s", pa.float64()),
        ]
    )
