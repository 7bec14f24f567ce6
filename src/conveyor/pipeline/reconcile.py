"""Reconcile a business table against the queue and its archive.

Every business record is classified by its status and the latest job that matches its key:

==================  =======================================================================
class               when
==================  =======================================================================
ok                  the business status is settled (not pending), or the job is in flight
                    within the SLA
lost                business says pending, and no job matches the key
stuck               business says pending, the job is ``pending`` and ready for longer than
                    the SLA, or ``processing`` with its current delivery older than the SLA
dead                business says pending, the job ended without completing (``dead``,
                    ``expired``, ``cancelled``)
done_not_recorded   business says pending, the job ``completed``
==================  =======================================================================

A record whose key is null, NaN or empty (see :mod:`conveyor.pipeline._keys`) matches no job: it is
``no_key`` in the per-record table, counted apart (``ReconcileResult.no_key``), never lost and never
requeued. A record whose status is null or blank is neither pending nor settled: ``no_status``, counted
apart (``ReconcileResult.no_status``), never requeued; so is one whose status is in neither list when the
settled statuses are listed too (``settled_statuses``).

Several business records of one key are each classified (by the same job); a warning names such keys. A
requeue sends one job per key: lost records of one key whose payloads differ are not sent at all (which
payload is right is the business's to say; a warning names them), identical ones once.

With ``requeue_lost`` the lost records are enqueued again with the business key as idempotency key:
the next run finds those jobs (so they are no longer lost), and even a run against a stale export
sends keys the queue already holds, so nothing is enqueued twice.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from conveyor.pipeline._keys import col, key_column_text
from conveyor.pipeline._sla import DEFAULT_SLA_SECONDS, SlaValue, parse_sla, sla_micros
from conveyor.pipeline.enqueue import jsonable
from conveyor.pipeline.errors import PipelineError
from conveyor.pipeline.export import export, far_future, read_archive_tail, read_watermark
from conveyor.pipeline.report import load_jobs, restore_queue

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from conveyor import App
    from conveyor._queue import QueueOptions
    from conveyor.pipeline._input import InputFiles

#: Reconcile's warnings are logged here as well as returned (``ReconcileResult.warnings``), so that a
#: Python caller that reads only the counts still hears of them.
log = logging.getLogger("conveyor.pipeline")

CLASSES: tuple[str, ...] = ("ok", "lost", "stuck", "dead", "done_not_recorded")
#: The class of a record without a usable key: counted apart from CLASSES, never requeued.
NO_KEY = "no_key"
#: The class of a record whose status is null or blank: counted apart from CLASSES, never requeued.
NO_STATUS = "no_status"
#: How many keys a warning names as examples.
_EXAMPLES = 5
KeyKind = Literal["idempotency_key", "job_id"]
_REQUEUE_BATCH = 500
#: What the warning about archived jobs that finished far in the future adds.
_FAR_FUTURE_NOTE = (
    "reconciled as any other job, but `conveyor export` refuses them until their finished_at is corrected "
    "in the archive"
)


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """Counts per class (every class present, zero if none), the snapshot time used for "stuck",
    and what a requeue did (``requeued`` new jobs, ``already_queued`` keys the queue already held).
    ``no_key`` counts the records without a usable key (null, NaN, empty), ``no_status`` those with a key but
    a null or blank status (or, with ``settled_statuses``, one in neither list): in no class, never requeued.
    ``not_requeued`` counts the lost records left out of a requeue because another lost record of their key
    has a different payload. ``warnings`` are what the
    caller should be told (keys on several records, archived jobs that finished far in the future)."""

    counts: dict[str, int]
    snapshot_at: datetime
    out_dir: Path | None = None
    requeued: int = 0
    already_queued: int = 0
    lost_keys: list[str] = field(default_factory=list)  # at most 1000, for display
    no_key: int = 0
    warnings: list[str] = field(default_factory=list)
    no_status: int = 0
    not_requeued: int = 0


def load_business(
    spark: SparkSession, business: str | os.PathLike[str] | DataFrame, table: str | None = None
) -> DataFrame:
    """The business table: a DataFrame, a Parquet or CSV file/directory, or a JDBC URL (with ``table``).

    CSV needs a header row; files are read as :func:`conveyor.pipeline._input.read_input` says (RFC
    4180, columns matched by name, only files of one format, UTF-8 checked). A JDBC URL needs its
    driver jar on the session (see :func:`conveyor.pipeline.spark.jdbc_jars`). Raises :class:`PipelineError`."""
    if not isinstance(business, str | os.PathLike):
        return business
    text = os.fspath(business)
    if text.startswith("jdbc:"):
        if not table:
            raise PipelineError("a JDBC business source needs --business-table (a table name or a subquery)")
        from conveyor.pipeline.spark import JDBC_DRIVERS

        reader = spark.read.format("jdbc").option("url", text).option("dbtable", table)
        driver = JDBC_DRIVERS.get(text.removeprefix("jdbc:").split(":", 1)[0])
        if driver is not None:
            reader = reader.option("driver", driver)
        try:
            return reader.load()
        except Exception as exc:
            # A Py4J error's own text is "An error occurred while calling o56.load"; the Java
            # exception says what went wrong (no driver jar, no such table).
            detail = str(getattr(exc, "java_exception", exc)).splitlines()[0]
            raise PipelineError(f"cannot read {table!r} over JDBC: {detail}") from exc
    from conveyor.pipeline._input import list_input, read_input

    return read_input(spark, list_input(text))


def reconcile(
    business: str | os.PathLike[str] | DataFrame,
    key_column: str,
    status_column: str,
    database_url: str | None = None,
    *,
    export_dir: str | os.PathLike[str] | None = None,
    key_kind: KeyKind = "idempotency_key",
    pending_statuses: Sequence[str] = ("pending",),
    settled_statuses: Sequence[str] | None = None,
    queue: str | None = None,
    sla: Mapping[str, SlaValue] | None = None,
    default_sla: SlaValue = DEFAULT_SLA_SECONDS,
    out_dir: str | os.PathLike[str] | None = None,
    requeue_lost: bool = False,
    task: str | None = None,
    payload_columns: Sequence[str] = (),
    business_table: str | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    app: App | None = None,
) -> ReconcileResult:
    """Classify every business record (see the module docstring) and optionally requeue the lost.

    The queue state comes from ``database_url`` (exported first, live jobs included, into
    ``export_dir`` or a temporary directory) or from ``export_dir`` alone (which must hold a live
    snapshot; its time is then "now" for stuck). ``key_kind`` says what ``key_column`` holds: an
    idempotency key (default) or a job id (a job id also matches the idempotency key of a requeued
    job and the ``replay_of`` of a replay). ``pending_statuses`` (compared case-insensitively) are
    the business statuses meaning "work not done yet"; every other status is settled unless
    ``settled_statuses`` lists the settled ones, and then a status in neither is ``no_status``. ``queue``
    limits the jobs considered to one queue. ``out_dir`` gets the per-record table (Parquet; the
    business table's other columns are kept with a ``business_`` prefix). ``requeue_lost`` needs
    ``database_url``, ``queue`` and ``task``; the payload is ``{key_column: key}`` plus
    ``payload_columns``. ``app`` gives the requeue ``queue``'s declared policy (``max_depth``, dedup
    window): past the mark the requeue stops, saying how many records it sent, and a re-run sends the
    rest. Raises :class:`PipelineError` on bad input."""
    from pyspark.sql import functions as F

    if database_url is None and export_dir is None:
        raise PipelineError("give a database URL (--db) or an export directory (--export-dir)")
    if key_kind not in ("idempotency_key", "job_id"):
        raise PipelineError(f"key kind must be idempotency_key or job_id, got {key_kind!r}")
    if requeue_lost and (database_url is None or queue is None or task is None):
        raise PipelineError("--requeue-lost needs --db, --queue and --task")
    slas = parse_sla(sla)
    default_us = sla_micros(default_sla, "default SLA")
    # Files are checked before Spark starts (it takes seconds): listed, CSV read as UTF-8 with its
    # header, and the columns named found in the headers or Parquet schemas.
    files = None
    if isinstance(business, str | os.PathLike) and not os.fspath(business).startswith("jdbc:"):
        files = check_business(business, key_column, status_column, payload_columns)
    if spark is None:
        from conveyor.pipeline.spark import get_session, jdbc_jars

        jars = jdbc_jars(os.fspath(business)) if isinstance(business, str) else []
        spark = get_session(master, jars=jars)
    # The business table is read before the queue snapshot so that a bad path fails fast.
    if files is not None:
        from conveyor.pipeline._input import read_input

        biz = read_input(spark, *files)
    else:
        biz = load_business(spark, business, business_table)
    _check_columns(biz.columns, key_column, status_column, payload_columns)

    with tempfile.TemporaryDirectory(prefix="conveyor-reconcile-") as tmp:
        jobs, snapshot_at, warnings = _queue_state(spark, database_url, export_dir, Path(tmp))
        if queue is not None:
            jobs = jobs.where(F.col("queue") == queue)
        classified = _classify(
            spark,
            biz,
            jobs,
            key_column,
            status_column,
            key_kind,
            pending_statuses,
            settled_statuses,
            slas,
            default_us,
            snapshot_at,
        )
        classified = classified.cache()
        try:
            counts = {c: 0 for c in CLASSES}
            for row in classified.groupBy("class").count().collect():
                counts[row["class"]] = int(row["count"])
            no_key = counts.pop(NO_KEY, 0)
            no_status = counts.pop(NO_STATUS, 0)
            warnings.extend(_repeated_keys(classified))
            out: Path | None = None
            if out_dir is not None:
                out = Path(out_dir).absolute()
                classified.coalesce(1).write.mode("overwrite").parquet(str(out / "reconcile"))
            lost = classified.where(F.col("class") == "lost").select(
                "key", *[col(f"business_{c}").alias(c) for c in payload_columns]
            )
            lost_keys = [str(r["key"]) for r in lost.select("key").distinct().orderBy("key").limit(1000).collect()]
            requeued = already = not_requeued = 0
            if requeue_lost and counts["lost"]:
                assert database_url is not None and queue is not None and task is not None
                declared = None if app is None else app.catalogue.queues.get(queue)
                lost, not_requeued, conflicts = _one_per_key(lost, payload_columns)
                if not_requeued:
                    warnings.append(
                        f"{not_requeued:,} lost records were not requeued: their key is on another lost record with "
                        f"a different payload (keys {conflicts}); correct the business table and run it again"
                    )
                requeued, already = _requeue(lost, database_url, queue, task, key_column, payload_columns, declared)
        finally:
            classified.unpersist()
    for warning in warnings:
        log.warning("reconcile: %s", warning)
    return ReconcileResult(
        counts,
        snapshot_at,
        out,
        requeued,
        already,
        lost_keys,
        no_key,
        warnings,
        no_status=no_status,
        not_requeued=not_requeued,
    )


def _examples(frame: DataFrame) -> str:
    """The first keys of ``frame`` (a column ``key``), for a warning."""
    keys = [repr(str(r["key"])) for r in frame.orderBy("key").limit(_EXAMPLES + 1).collect()]
    return ", ".join(keys[:_EXAMPLES]) + (", ..." if len(keys) > _EXAMPLES else "")


def _repeated_keys(classified: DataFrame) -> list[str]:
    """A warning if some key is on more than one business record (each is classified, by the same job)."""
    from pyspark.sql import functions as F

    repeated = classified.where(F.col("key").isNotNull()).groupBy("key").count().where(F.col("count") > 1)
    n = repeated.count()
    if not n:
        return []
    return [f"{n:,} keys are on more than one business record, each classified by the same job: {_examples(repeated)}"]


def _one_per_key(lost: DataFrame, payload_columns: Sequence[str]) -> tuple[DataFrame, int, str]:
    """The lost records to requeue, one per key: keys whose records carry different payloads are left out.
    Returns them, how many records were left out, and example keys."""
    from pyspark.sql import functions as F

    if payload_columns:
        payload = F.to_json(F.struct(*[col(c) for c in payload_columns]))
        per_key = lost.groupBy("key").agg(F.count_distinct(payload).alias("payloads"), F.count("*").alias("records"))
        conflicting = per_key.where(F.col("payloads") > 1)
        left_out = conflicting.agg(F.sum("records")).collect()[0][0]
        if left_out:
            kept = lost.join(conflicting.select("key"), "key", "left_anti").dropDuplicates(["key"])
            return kept, int(left_out), _examples(conflicting)
    return lost.dropDuplicates(["key"]), 0, ""


def check_business(
    business: str | os.PathLike[str], key_column: str, status_column: str, payload_columns: Sequence[str] = ()
) -> tuple[InputFiles, dict[tuple[str, ...], list[Path]] | None]:
    """The files of a business table path and their CSV headers (None for Parquet), checked without
    Spark: listed, CSV read as UTF-8 with its header, and the columns named found. Raises
    :class:`PipelineError`."""
    from conveyor.pipeline._input import csv_headers, known_columns, list_input

    files = list_input(business)
    headers = csv_headers(files) if files.format == "csv" else None
    _check_columns(known_columns(files, headers), key_column, status_column, payload_columns)
    return files, headers


def _check_columns(columns: Sequence[str], key_column: str, status_column: str, payload_columns: Sequence[str]) -> None:
    for column in (key_column, status_column, *payload_columns):
        if column not in columns:
            raise PipelineError(f"column {column!r} is not in the business table (columns: {', '.join(columns)})")


def _queue_state(
    spark: SparkSession, database_url: str | None, export_dir: str | os.PathLike[str] | None, tmp: Path
) -> tuple[DataFrame, datetime, list[str]]:
    """All known jobs (live snapshot, archive, and the archive rows an export left for later), the
    snapshot time, and warnings.

    An archived job that finished far in the future refuses an export, but it still answers "does this
    key have a job", which is all reconcile asks of it: the export leaves it after the watermark, it is
    read with the rest of the tail, and a warning names it."""
    if database_url is None:
        assert export_dir is not None
        mark = read_watermark(export_dir)
        if mark.live_snapshot_at is None:
            raise PipelineError(f"{export_dir} has no live snapshot: export it with --include-live, or pass --db")
        return load_jobs(spark, export_dir, allow_empty=True), mark.live_snapshot_at, []
    from conveyor.backends import open_backend

    try:
        backend = open_backend(database_url)
    except Exception as exc:
        raise PipelineError(f"cannot open {database_url}: {exc}") from exc
    try:
        target = Path(export_dir) if export_dir is not None else tmp / "export"
        now = datetime.now(UTC)
        # A throwaway export needs no settling time: no later run resumes from its watermark.
        settle = 5.0 if export_dir is not None else 0.0
        result = export(
            database_url,
            target,
            include_live=True,
            backend=backend,
            now=now,
            settle_seconds=settle,
            via="seam",
            refuse_far_future=False,
        )
        future = far_future(backend, now)
        warnings = [] if future is None else [f"{future}: {_FAR_FUTURE_NOTE}"]
        jobs = load_jobs(spark, target, allow_empty=True)
        tail = read_archive_tail(backend, result.watermark.after)
        if tail.num_rows:
            import pyarrow.parquet as pq

            tail_path = tmp / "tail.parquet"
            pq.write_table(tail, tail_path)
            from conveyor.pipeline.schema import spark_ddl

            jobs = jobs.unionByName(restore_queue(spark.read.schema(spark_ddl()).parquet(str(tail_path))))
    finally:
        backend.close()
    return jobs, now, warnings


def _classify(
    spark: SparkSession,
    biz: DataFrame,
    jobs: DataFrame,
    key_column: str,
    status_column: str,
    key_kind: KeyKind,
    pending_statuses: Sequence[str],
    settled_statuses: Sequence[str] | None,
    slas: dict[str, int],
    default_us: int,
    now: datetime,
) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    records = biz.select(
        # The same text as bulk enqueue makes of a key: a double 1.0 is "1"; NaN and null are no key.
        key_column_text(biz, key_column).alias("key"),
        col(status_column).cast("string").alias("business_status"),
        # Other business columns travel under a prefix, so that a business column named like a
        # job column (queue, state, job_id) cannot collide in the join.
        *[col(c).alias(f"business_{c}") for c in biz.columns if c not in (key_column, status_column)],
    )
    if key_kind == "idempotency_key":
        keyed = jobs.where(F.col("idempotency_key").isNotNull()).withColumn("key", F.col("idempotency_key"))
    else:
        candidates = F.array_distinct(F.array("job_id", "idempotency_key", "replay_of"))
        keyed = jobs.withColumn("key", F.explode(candidates)).where(F.col("key").isNotNull())
    keyed = keyed.join(records.select("key").distinct(), "key", "left_semi")
    # Several jobs can match one key (a replay, a requeue, the same job seen live and archived):
    # the latest job decides, and of one job the archived (ended) row is the newer truth.
    latest = Window.partitionBy("key").orderBy(
        F.desc("enqueued_at"), F.desc("job_id"), F.asc(F.when(F.col("source") == "archive", 0).otherwise(1))
    )
    best = keyed.withColumn("_rank", F.row_number().over(latest)).where(F.col("_rank") == 1)
    best = best.select(
        "key",
        "job_id",
        F.col("queue").alias("job_queue"),
        F.col("state").alias("job_state"),
        "enqueued_at",
        "run_at",
        "started_at",
        "finished_at",
    )
    sla_rows = [(q, us) for q, us in sorted(slas.items())]
    sla_df = spark.createDataFrame(sla_rows, "job_queue STRING, sla_us BIGINT")
    joined = records.join(best, "key", "left").join(F.broadcast(sla_df), "job_queue", "left")
    now_lit = F.lit(now).cast("timestamp")

    def age_us(since: Any) -> Any:
        return F.unix_micros(now_lit) - F.unix_micros(since)

    def age(since: Any) -> Any:
        return age_us(since) / 1e6

    # Ages and SLAs are whole microseconds: "older than the SLA" is an exact comparison.
    sla_us = F.coalesce(F.col("sla_us"), F.lit(default_us))
    sla_s = sla_us / 1e6
    status = F.lower(F.trim(F.col("business_status")))
    pending = status.isin([s.strip().lower() for s in pending_statuses])
    # Listed settled statuses make any other value unknown: neither pending nor settled, like a null.
    unknown = F.lit(False)
    if settled_statuses is not None:
        unknown = ~pending & ~status.isin([s.strip().lower() for s in settled_statuses])
    state = F.col("job_state")
    klass = (
        F.when(F.col("key").isNull(), NO_KEY)
        .when(status.isNull() | (status == "") | unknown, NO_STATUS)
        .when(~pending, "ok")
        .when(state.isNull(), "lost")
        .when(state == "completed", "done_not_recorded")
        .when(state.isin("dead", "expired", "cancelled"), "dead")
        .when((state == "pending") & (age_us(F.greatest("enqueued_at", "run_at")) > sla_us), "stuck")
        .when((state == "processing") & (age_us(F.col("started_at")) > sla_us), "stuck")
        .otherwise("ok")
    )
    age_s = F.when(state == "processing", age(F.col("started_at"))).when(
        state == "pending", age(F.greatest("enqueued_at", "run_at"))
    )
    return joined.select(
        "key",
        "business_status",
        klass.alias("class"),
        "job_id",
        "job_queue",
        "job_state",
        "enqueued_at",
        "finished_at",
        age_s.alias("age_s"),
        sla_s.alias("sla_s"),
        *[col(c) for c in records.columns if c not in ("key", "business_status")],
    )


def _requeue(
    lost: DataFrame,
    database_url: str,
    queue: str,
    task: str,
    key_column: str,
    payload_columns: Sequence[str],
    declared: QueueOptions | None = None,
) -> tuple[int, int]:
    """Send the lost records from the driver, in batches; return (new jobs, keys already held)."""
    from conveyor import App, Message
    from conveyor._errors import ConveyorError, first_line

    fresh = held = 0
    app = App(database_url)
    if declared is not None:
        app.catalogue.add_queue(declared)  # the queue's max_depth (backpressure) and dedup window
    try:
        batch: list[Any] = []

        def flush() -> None:
            nonlocal fresh, held, batch
            if batch:
                try:
                    jobs = app.send_many(batch)
                except ConveyorError as exc:
                    raise PipelineError(
                        f"requeue stopped after {fresh + held:,} lost records were sent ({fresh:,} new jobs): "
                        f"{first_line(exc)}; run it again to send the rest (nothing is enqueued twice)"
                    ) from exc
                n = sum(1 for m, j in zip(batch, jobs, strict=True) if j.id == m.id)
                fresh, held, batch = fresh + n, held + len(batch) - n, []

        for row in lost.toLocalIterator():
            key = str(row["key"])
            payload: dict[str, Any] = {key_column: key}
            payload.update({c: jsonable(row[c]) for c in payload_columns})
            batch.append(Message(task=task, payload=payload, queue=queue, idempotency_key=key))
            if len(batch) >= _REQUEUE_BATCH:
                flush()
        flush()
    finally:
        app.close()
    return fresh, held
