"""``export --via jdbc``: the PostgreSQL archive read straight into Spark over JDBC.

The seam export pulls every row through Python, page by page; this path lets Spark's JDBC source
read the archive table in parallel slices of ``finished_at`` and write the Parquet files itself. It
produces the same layout, schema and file names as the seam export and shares its run machinery
(lock, staging, discard of uncommitted runs, the watermark written last), so the two can take turns
on one directory.

Watermark semantics are the seam's: the rows read are exactly those with ``(finished_at, id)``
after the stored watermark and at most a bound fixed before the read, the last settled row (one
whose ``finished_at`` is at or before the settle cutoff). The bound becomes the next watermark.
The slices cover the whole time line (the first and last are open-ended), so every row between
the watermark and the bound is in exactly one slice.
"""

from __future__ import annotations

import itertools
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from conveyor.pipeline.errors import PipelineError
from conveyor.pipeline.schema import COLUMNS, QUEUE_DIR_MAX_BYTES, QUEUE_DIR_PREFIX

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Rows each JDBC round trip fetches (PostgreSQL streams with a cursor only when this is set).
FETCH_SIZE = 10_000

# The last settled archive row after the watermark, and the first one (which only places the
# slices): each is one backward or forward scan of the primary key (finished_at, id), with
# partitions wholly outside the range pruned.
_BOUNDS_SQL = """
SELECT
    (SELECT finished_at FROM archive
      WHERE (finished_at, id) > (%(after_at)s, %(after_id)s) AND finished_at <= %(cutoff)s
      ORDER BY finished_at, id LIMIT 1),
    last.finished_at, last.id
FROM (SELECT finished_at, id FROM archive
       WHERE (finished_at, id) > (%(after_at)s, %(after_id)s) AND finished_at <= %(cutoff)s
       ORDER BY finished_at DESC, id DESC LIMIT 1) AS last
"""

# The export columns, in their order, as PostgreSQL text where the export stores text (ids, the
# JSON headers). `source` and `exported_at` are constants of the run, selected in SQL too: a Spark
# literal would be a non-nullable column, and the files' schema must match the seam export's,
# where every column is nullable. The partition column `date` is added in Spark.
_SELECT = {
    "job_id": "id::text",
    "headers": "headers::text",
    "replay_of": "replay_of::text",
    "replayed_by": "replayed_by::text",
    "source": "'archive'::text",
}

_NIL_UUID = "00000000-0000-0000-0000-000000000000"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def jdbc_connection(database_url: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties (user, password, ...) of a ``postgresql://`` URL.

    The password goes into the properties, never into the URL (Spark prints URLs in errors).
    Raises :class:`PipelineError` for a URL the JDBC driver cannot reach (a Unix socket)."""
    import psycopg.conninfo

    try:
        info = psycopg.conninfo.conninfo_to_dict(database_url)
    except psycopg.ProgrammingError as exc:
        raise PipelineError(f"not a PostgreSQL URL: {exc}") from None
    host = str(info.pop("host", "") or "")
    if not host or host.startswith("/") or "," in host:
        raise PipelineError("--via jdbc needs one TCP host in the database URL (postgresql://user@host:port/db)")
    port = str(info.pop("port", "") or "5432")
    dbname = str(info.pop("dbname", "") or "")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    renamed = {"application_name": "ApplicationName", "connect_timeout": "connectTimeout"}
    props = {renamed.get(k, k): str(v) for k, v in info.items() if v is not None}
    return f"jdbc:postgresql://{host}:{port}/{dbname}", props


def archive_bounds(
    database_url: str, after: tuple[datetime, UUID] | None, cutoff: datetime
) -> tuple[datetime, tuple[datetime, UUID]] | None:
    """The first row's ``finished_at`` and the last row's ``(finished_at, id)`` of the rows to
    export (after ``after``, settled by ``cutoff``); None when there are none."""
    import psycopg

    params = {
        "after_at": after[0] if after else datetime.min.replace(tzinfo=UTC),
        "after_id": after[1] if after else UUID(_NIL_UUID),
        "cutoff": cutoff,
    }
    url = "postgresql://" + database_url.split("://", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_BOUNDS_SQL, params).fetchone()
    if row is None or row[1] is None:
        return None
    return row[0], (row[1], row[2])


# Whether at least N rows wait to be exported: a count that stops at N (a range scan of at most N
# index entries), so that asking costs little however large the backlog.
_HAS_SQL = """
SELECT count(*) FROM (
    SELECT 1 FROM archive
     WHERE (finished_at, id) > (%(after_at)s, %(after_id)s) AND finished_at <= %(cutoff)s
     LIMIT %(least)s
) AS waiting
"""


def archive_has(database_url: str, after: tuple[datetime, UUID] | None, cutoff: datetime, least: int) -> bool:
    """Whether at least ``least`` archive rows after ``after`` have settled by ``cutoff``."""
    import psycopg

    params = {
        "after_at": after[0] if after else datetime.min.replace(tzinfo=UTC),
        "after_id": after[1] if after else UUID(_NIL_UUID),
        "cutoff": cutoff,
        "least": least,
    }
    url = "postgresql://" + database_url.split("://", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_HAS_SQL, params).fetchone()
    return row is not None and int(row[0]) >= least


def _literal(value: datetime | UUID) -> str:
    # Only typed values are inlined (a datetime's ISO text with its offset, a UUID's hex), so no
    # text from outside ever reaches the SQL.
    if isinstance(value, datetime):
        return f"'{value.astimezone(UTC).isoformat()}'::timestamptz"
    return f"'{UUID(str(value))}'::uuid"


def _slices(first: datetime, last: datetime, count: int) -> list[str]:
    """``count`` WHERE clauses on finished_at covering the whole time line (open-ended at both
    ends), with boundaries spread evenly between ``first`` and ``last``."""
    span = last - first
    cuts = sorted({first + span * i / count for i in range(1, count)}) if span > timedelta(0) else []
    if not cuts:
        return ["TRUE"]
    clauses = [f"finished_at < {_literal(cuts[0])}"]
    clauses += [f"finished_at >= {_literal(a)} AND finished_at < {_literal(b)}" for a, b in itertools.pairwise(cuts)]
    clauses.append(f"finished_at >= {_literal(cuts[-1])}")
    return clauses


def read_archive_jdbc(
    spark: SparkSession,
    database_url: str,
    after: tuple[datetime, UUID] | None,
    first_at: datetime,
    upto: tuple[datetime, UUID],
    now: datetime,
    target: Path,
    partitions: int,
) -> None:
    """Write the archive rows in ``(after, upto]`` under ``target`` as hive-partitioned Parquet
    (``date=``/``queue=``) in the export schema, reading ``partitions`` slices in parallel."""
    from pyspark.sql import functions as F

    from conveyor.pipeline.spark import JDBC_DRIVERS

    url, props = jdbc_connection(database_url)
    low = f"('-infinity'::timestamptz, {_literal(UUID(_NIL_UUID))})"
    if after is not None:
        low = f"({_literal(after[0])}, {_literal(after[1])})"
    high = f"({_literal(upto[0])}, {_literal(upto[1])})"
    names = [name for name, _, _ in COLUMNS]
    long_name = f"CASE WHEN octet_length(queue) > {QUEUE_DIR_MAX_BYTES} THEN queue END"
    exprs = {**_SELECT, "exported_at": _literal(now), "queue_name": long_name}
    select = ", ".join(f"{exprs[n]} AS {n}" if n in exprs else n for n in [*names, "queue"])
    where = f"(finished_at, id) > {low} AND (finished_at, id) <= {high}"
    table = f"(SELECT {select} FROM archive WHERE {where}) AS archive_export"
    props = {**props, "driver": JDBC_DRIVERS["postgresql"], "fetchsize": str(FETCH_SIZE)}
    df = spark.read.jdbc(url, table, predicates=_slices(first_at, upto[0], max(1, partitions)), properties=props)
    micros_per_day = 86_400_000_000
    day = F.date_from_unix_date(F.floor(F.unix_micros("finished_at") / F.lit(micros_per_day)).cast("int"))
    # A long queue name's directory holds a shortened name (schema.queue_dir_value, computed alike).
    short = F.concat(F.substring("queue", 1, QUEUE_DIR_PREFIX), F.lit("~"), F.substring(F.sha2("queue", 256), 1, 24))
    queue_dir = F.when(F.col("queue_name").isNull(), F.col("queue")).otherwise(short)
    out = df.select(*names, day.cast("string").alias("date"), queue_dir.alias("queue"))
    conf = spark.conf
    previous = conf.get("spark.sql.parquet.outputTimestampType", None)
    # The export stores timestamps as microsecond instants (INT64), as pyarrow writes them.
    conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    try:
        (
            out.sortWithinPartitions("date", "queue", "finished_at", "job_id")
            .write.partitionBy("date", "queue")
            .mode("overwrite")
            .parquet(os.fspath(target))
        )
    except Exception as exc:
        module = type(exc).__module__
        if not module.startswith(("pyspark", "py4j")):
            raise
        detail = next((ln.strip() for ln in str(exc).splitlines() if "Exception:" in ln), str(exc).splitlines()[0])
        raise PipelineError(f"cannot read the archive over JDBC: {detail}") from exc
    finally:
        if previous is None:
            conf.unset("spark.sql.parquet.outputTimestampType")
        else:
            conf.set("spark.sql.parquet.outputTimestampType", previous)


def spark_files(target: Path) -> list[tuple[str, str, Path]]:
    """The Parquet files Spark wrote under ``target``: (date, queue, path), partition values
    unescaped (Spark escapes a few characters in directory names as ``%XX``)."""
    from urllib.parse import unquote

    files = []
    for path in sorted(target.rglob("*.parquet")):
        rel = path.relative_to(target).parts
        if len(rel) != 3 or not rel[0].startswith("date=") or not rel[1].startswith("queue="):
            continue
        queue = unquote(rel[1][len("queue=") :])
        # Spark writes an empty partition value as Hive's null marker.
        files.append((unquote(rel[0][len("date=") :]), "" if queue == _HIVE_NULL else queue, path))
    return files


def partition_dir(date: str, queue: str) -> str:
    """The directory of a (date, queue) partition exactly as the seam export (pyarrow) names it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    part = ds.partitioning(pa.schema([pa.field("date", pa.string()), pa.field("queue", pa.string())]), flavor="hive")
    # The empty queue name is a null partition value there (Spark cannot read a "queue=" directory).
    queue_is = pc.field("queue").is_null() if queue == "" else pc.field("queue") == queue
    directory: str = part.format((pc.field("date") == date) & queue_is)[0]
    return directory


def spark_session_for_jdbc(master: str | None) -> SparkSession:
    """A session with PostgreSQL's JDBC driver (Debian's libpostgresql-jdbc-java) on its classpath.

    Raises :class:`PipelineError` when the driver jar is not installed."""
    from conveyor.pipeline.spark import get_session, jdbc_jars

    jars = jdbc_jars("jdbc:postgresql:")
    if not jars:
        raise PipelineError(
            "--via jdbc needs PostgreSQL's JDBC driver: apt-get install libpostgresql-jdbc-java "
            "(/usr/share/java/postgresql.jar)"
        )
    return get_session(master, jars=jars)
