"""Incremental export of the job history to Parquet, the input of every pipeline job.

Layout of an export directory::

    OUT/_watermark.json                      the committed position (see below)
    OUT/archive/date=YYYY-MM-DD/queue=Q/part-rNNNNNNNN-cNNNNN-0.parquet
    OUT/live/date=YYYY-MM-DD/queue=Q/part-...parquet   (optional snapshot of live jobs)

The archive is read through the storage seam (``Backend.archive_read``) in ``(finished_at, id)``
order, strictly after the stored watermark, so it works on every engine. On PostgreSQL, ``via="jdbc"``
has Spark read the archive table directly instead, in parallel slices (``_jdbc_export``), into the
same files under the same watermark. Each run writes its files
under a staging directory, moves them into place, and only then replaces the watermark; file names
carry the run number, and a run first deletes files of runs that never committed. A re-run therefore
never duplicates a row, even after a crash at any point.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from conveyor._errors import first_line
from conveyor._limits import preview
from conveyor.backends.base import ArchiveReadParams, Backend, JobRecord, JobsListParams
from conveyor.pipeline.errors import PipelineError
from conveyor.pipeline.schema import (
    ARCHIVE_DIR,
    COLUMNS,
    EXPORT_FORMAT_VERSION,
    LIVE_DIR,
    WATERMARK_FILE,
    queue_dir_value,
    queue_name_value,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_STAGING_DIR = "_staging"
_LOCK_FILE = "_export.lock"


@dataclass(frozen=True, slots=True)
class Watermark:
    """The committed state of an export directory, as stored in ``_watermark.json``."""

    run: int = 0
    after: tuple[datetime, UUID] | None = None
    archive_rows: int = 0
    updated_at: datetime | None = None
    live_snapshot_at: datetime | None = None
    live_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "format": EXPORT_FORMAT_VERSION,
            "run": self.run,
            "after": None
            if self.after is None
            else {"finished_at": self.after[0].isoformat(), "id": str(self.after[1])},
            "archive_rows": self.archive_rows,
            "updated_at": None if self.updated_at is None else self.updated_at.isoformat(),
            "live_snapshot_at": None if self.live_snapshot_at is None else self.live_snapshot_at.isoformat(),
            "live_rows": self.live_rows,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Watermark:
        after = data.get("after")
        live_at = data.get("live_snapshot_at")
        updated = data.get("updated_at")
        return cls(
            run=int(data["run"]),
            after=None if after is None else (datetime.fromisoformat(after["finished_at"]), UUID(after["id"])),
            archive_rows=int(data.get("archive_rows", 0)),
            updated_at=None if updated is None else datetime.fromisoformat(updated),
            live_snapshot_at=None if live_at is None else datetime.fromisoformat(live_at),
            live_rows=int(data.get("live_rows", 0)),
        )


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What one export run did."""

    out_dir: Path
    run: int
    archive_rows: int  # rows added to the archive by this run
    live_rows: int  # rows in the live snapshot (0 without include_live)
    files: int  # Parquet files written by this run
    watermark: Watermark
    via: str = "seam"  # how the archive was read: "seam" or "jdbc"


def read_watermark(out_dir: str | os.PathLike[str]) -> Watermark:
    """The committed watermark of an export directory (a fresh one if none was written yet).

    Raises :class:`PipelineError` if the file exists but is not a watermark this version reads."""
    path = Path(out_dir) / WATERMARK_FILE
    if not path.exists():
        return Watermark()
    try:
        data = json.loads(path.read_text())
        if data.get("format") != EXPORT_FORMAT_VERSION:
            raise PipelineError(
                f"{path}: export format {data.get('format')!r}, this version reads {EXPORT_FORMAT_VERSION}"
            )
        return Watermark.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise PipelineError(f"{path} is not a valid export watermark: {exc}") from None


def export(
    database_url: str,
    out_dir: str | os.PathLike[str],
    include_live: bool = False,
    *,
    backend: Backend | None = None,
    page_size: int = 10_000,
    chunk_rows: int = 250_000,
    settle_seconds: float = 5.0,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
    via: str = "auto",
    spark: SparkSession | None = None,
    master: str | None = None,
    jdbc_partitions: int | None = None,
    refuse_far_future: bool = True,
) -> ExportResult:
    """Export the archive (and, with ``include_live``, a snapshot of live jobs) to Parquet.

    Incremental: only archive rows after the watermark stored in ``out_dir`` are read, and the
    watermark advances only once their files are in place, so running it again never duplicates a
    row. Rows that finished less than ``settle_seconds`` before ``now`` are left for the next run:
    workers stamp ``finished_at`` with their own clocks, and a row from a slightly slow clock must
    not land behind a watermark that has already passed it. ``backend`` (an open backend) is used
    instead of opening ``database_url``; it is not closed. ``progress`` is called with the number
    of archive rows read so far. Two exports into one directory at once are refused
    (:class:`PipelineError`).

    ``via="auto"`` (the default) reads over JDBC where that can run (PostgreSQL with a TCP host,
    pyspark and Debian's driver jar installed) and the run has at least :data:`JDBC_MIN_ROWS` new
    rows (or ``spark`` is given: no start-up to repay), else through the seam;
    ``result.via`` says which. ``via="seam"`` always uses the seam (every engine).
    ``via="jdbc"`` (PostgreSQL only) reads the archive with Spark's JDBC source instead of the seam:
    ``jdbc_partitions`` slices of ``finished_at`` in parallel (default: Spark's default parallelism,
    at least 2), on ``spark`` or a session built for ``master`` with Debian's driver jar. Same files,
    schema and watermark; the live snapshot is still read through the seam (the live table is
    small). Spark is not started when there is no new archive row.

    ``out_dir`` must be new, empty, or an export directory (one with ``_watermark.json``): the
    export deletes the files of runs that never committed, so it refuses a directory holding
    anything else. Every number is checked (:class:`PipelineError`: NaN, infinity, out of range),
    and a database that cannot be reached is a one-line :class:`PipelineError` without the
    URL's password.

    An archived job that finished more than :data:`FUTURE_LIMIT` after ``now`` refuses the export
    (:class:`PipelineError` naming it). With ``refuse_far_future=False`` such jobs are left after the
    watermark, unexported, as a row inside the settle window is (reconcile reads them with
    :func:`read_archive_tail`; :func:`far_future` tells the caller about them)."""
    _check_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    _check_int("chunk_rows", chunk_rows, 1, MAX_CHUNK_ROWS)
    if jdbc_partitions is not None:
        _check_int("jdbc_partitions", jdbc_partitions, 1, MAX_JDBC_PARTITIONS)
    check_settle(settle_seconds)
    if via not in VIAS:
        raise PipelineError(f"--via {via!r}: expected {', '.join(VIAS)}")
    own = backend is None
    if backend is None:
        from conveyor.backends import open_backend

        check_database(database_url)
        # Before the directory is claimed: a URL that cannot be opened leaves nothing behind.
        backend = _opened(open_backend, database_url)
    try:
        out = _claim(Path(out_dir))
        with _locked(out):
            if not (out / WATERMARK_FILE).exists():
                # Written first, so that whatever this run leaves behind is in a directory that the
                # next run recognises as an export (and may clean up).
                _write_json_atomic(out / WATERMARK_FILE, Watermark().to_json())
            # The embedded default migrates itself on first use (as App does); a server database is
            # migrated by `conveyor migrate`, never by a read-only job.
            if own and backend.engine == "sqlite":
                backend.migrate()
            exporter = _Exporter(backend, out, page_size, chunk_rows, progress, refuse_far_future)
            if via == "jdbc" and backend.engine != "postgres":
                raise PipelineError(f"--via jdbc reads PostgreSQL only; this database is {backend.engine}")
            if via != "seam" and backend.engine == "postgres":
                missing = _jdbc_missing(database_url, spark if via == "auto" else None, via == "auto")
                if via == "jdbc" and missing is not None:
                    raise PipelineError(f"--via jdbc: {missing}")
                if missing is None:
                    # With --via auto, a run with few new rows goes through the seam: starting Spark
                    # costs more than JDBC saves on them (a Spark session already running costs nothing).
                    least = 0 if via == "jdbc" or spark is not None else JDBC_MIN_ROWS
                    exporter = _JdbcExporter(exporter, database_url, spark, master, jdbc_partitions, least)
            return _opened(exporter.run, include_live, now or datetime.now(UTC), settle_seconds, url=database_url)
    finally:
        if own:
            backend.close()


#: How the archive can be read: ``auto`` (the default) picks JDBC where it can run and pays (see
#: :data:`JDBC_MIN_ROWS`), the seam elsewhere.
VIAS: tuple[str, ...] = ("auto", "seam", "jdbc")
#: With ``via="auto"``, JDBC reads a run of at least this many new archive rows; fewer go through the
#: seam. Measured (docs/pipeline.md, "Export speed"): the seam reads ~44,000 rows/s from the first
#: row; JDBC ~121,000 rows/s after ~14 s of fixed cost (starting Spark), so it is ahead from about a
#: million rows on.
JDBC_MIN_ROWS = 1_000_000


def _jdbc_missing(database_url: str, spark: SparkSession | None = None, sure: bool = False) -> str | None:
    """Why the JDBC export cannot run here (None when it can): pyspark, the driver jar, a TCP host.

    With ``sure`` (the choice of ``via="auto"``), a running session (``spark`` or the active one)
    must also list the driver in ``spark.jars``: it was started without it, and JDBC would fail."""
    import importlib.util

    from conveyor.pipeline._jdbc_export import jdbc_connection
    from conveyor.pipeline.spark import jdbc_jars

    if importlib.util.find_spec("pyspark") is None:
        return "needs pyspark (pip install 'conveyor[pipeline]')"
    if not jdbc_jars("jdbc:postgresql:"):
        return (
            "needs PostgreSQL's JDBC driver: apt-get install libpostgresql-jdbc-java (/usr/share/java/postgresql.jar)"
        )
    try:
        jdbc_connection(database_url)
    except PipelineError as exc:
        return str(exc)
    if sure:
        from pyspark.sql import SparkSession

        session = spark or SparkSession.getActiveSession()
        if session is not None and "postgresql" not in str(session.conf.get("spark.jars", "")):
            return "the running Spark session has no PostgreSQL JDBC driver in spark.jars"
    return None


#: The largest page, chunk and JDBC slice count taken (past these a value is a typo, not a setting).
MAX_PAGE_SIZE = 1_000_000
MAX_CHUNK_ROWS = 100_000_000
MAX_JDBC_PARTITIONS = 10_000
#: The longest settling time taken: a day.
MAX_SETTLE_SECONDS = 86_400.0
#: An archived job that finished further than this after the export's "now" refuses the export: no
#: clock skew is that large, and the export could never place the row (see _refuse_far_future).
FUTURE_LIMIT = timedelta(seconds=MAX_SETTLE_SECONDS)
_FUTURE_SHOWN = 1000


def check_database(database_url: str) -> None:
    """Fail fast, in one line and without the password, on a PostgreSQL or MySQL URL that is malformed
    or names a server that cannot be reached (one connection attempt, 5 s at most), before a
    connection pool would retry it and log each failure. Other engines are checked on open."""
    import psycopg
    import psycopg.conninfo

    from conveyor.pipeline._secrets import redact

    scheme, sep, rest = database_url.partition("://")
    if sep and scheme == "mysql":
        _check_mysql(database_url)
        return
    if not sep or scheme not in ("postgresql", "postgres"):
        return
    url = "postgresql://" + rest
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise PipelineError(redact(f"malformed database URL: {first_line(exc)}", database_url)) from None
    try:
        with psycopg.connect(url, connect_timeout=5, autocommit=True):
            pass
    except psycopg.Error as exc:
        raise PipelineError(redact(f"cannot connect to the database: {first_line(exc)}", database_url)) from None


def _check_mysql(database_url: str) -> None:
    """:func:`check_database` for a ``mysql://`` URL."""
    from conveyor._errors import ConfigurationError
    from conveyor.pipeline._secrets import redact

    try:
        import pymysql

        from conveyor.backends.mysql._url import connect_kwargs
    except ImportError as exc:
        raise PipelineError(f"a mysql:// URL needs the PyMySQL driver ({exc}): pip install 'conveyor[mysql]'") from None
    try:
        kwargs = connect_kwargs(database_url)
    except ConfigurationError as exc:
        raise PipelineError(redact(f"malformed database URL: {first_line(exc)}", database_url)) from None
    kwargs["connect_timeout"] = min(kwargs.get("connect_timeout", 5), 5)
    try:
        pymysql.connect(**kwargs).close()
    except pymysql.Error as exc:
        raise PipelineError(redact(f"cannot connect to the database: {first_line(exc)}", database_url)) from None


def check_settle(settle_seconds: float) -> float:
    """``settle_seconds`` if it is a finite number from 0 to a day; else :class:`PipelineError`."""
    if isinstance(settle_seconds, bool) or not isinstance(settle_seconds, int | float):
        raise PipelineError(f"--settle: expected a number of seconds, got {settle_seconds!r}")
    if not (math.isfinite(settle_seconds) and 0 <= settle_seconds <= MAX_SETTLE_SECONDS):
        raise PipelineError(f"--settle must be from 0 to {MAX_SETTLE_SECONDS:g} seconds, got {settle_seconds}")
    return float(settle_seconds)


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PipelineError(f"{name} must be a whole number from {low:,} to {high:,}, got {value!r}")


def _claim(out: Path) -> Path:
    """``out`` (made absolute) if it may be exported into (new, empty, or an export directory), created."""
    out = out.absolute()
    try:
        if out.exists() and not out.is_dir():
            raise PipelineError(f"--out {out}: not a directory")
        foreign = (
            out.is_dir() and not (out / WATERMARK_FILE).exists() and any(p.name != _LOCK_FILE for p in out.iterdir())
        )
        if foreign:
            raise PipelineError(
                f"--out {out}: the directory is not empty and holds no {WATERMARK_FILE}, so it is not an "
                "export directory; give a new or empty directory (nothing was changed)"
            )
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # Looking at the path fails too: a name longer than the file system takes, a parent it may not search.
        raise PipelineError(f"--out {preview(str(out), 200)}: {exc.strerror or exc}") from None
    return out


_T = TypeVar("_T")


def _opened(fn: Callable[..., _T], *args: Any, url: str | None = None) -> _T:
    """Call ``fn``; a database that cannot be reached becomes a one-line PipelineError.

    The message never holds the URL's password (see :func:`conveyor.pipeline._secrets.redact`)."""
    import psycopg

    from conveyor.pipeline._secrets import redact

    try:
        return fn(*args)
    except psycopg.Error as exc:
        where = url if url is not None else (args[0] if args and isinstance(args[0], str) else "")
        raise PipelineError(redact(f"cannot read the database: {first_line(exc)}", where)) from None


@dataclass(frozen=True, slots=True)
class FarFuture:
    """Archived jobs that finished more than :data:`FUTURE_LIMIT` after "now": how many (counted up to
    ``_FUTURE_SHOWN``) and the first of them in ``(finished_at, id)`` order."""

    count: int
    first: JobRecord

    def __str__(self) -> str:
        count = f"{self.count:,}" if self.count < _FUTURE_SHOWN else f"{_FUTURE_SHOWN:,} or more"
        assert self.first.finished_at is not None
        return (
            f"{count} archived jobs finished more than a day after now (the first: job {self.first.id} of queue "
            f"{self.first.queue!r}, finished_at {self.first.finished_at.isoformat()})"
        )


def far_future(backend: Backend, now: datetime) -> FarFuture | None:
    """The archived jobs that finished more than :data:`FUTURE_LIMIT` after ``now`` (a worker's clock
    years ahead, or raw SQL), or None: one seam read of at most ``_FUTURE_SHOWN`` rows."""
    last = UUID(int=(1 << 128) - 1)  # after (limit, the greatest id): finished_at > limit
    future = backend.archive_read(ArchiveReadParams(after=(now + FUTURE_LIMIT, last), limit=_FUTURE_SHOWN))
    return FarFuture(len(future), future[0]) if future else None


def _refuse_far_future(backend: Backend, now: datetime) -> None:
    """Raise :class:`PipelineError` if an archived job finished more than :data:`FUTURE_LIMIT` after
    ``now``. Read in ``(finished_at, id)`` order behind a watermark, such a row would be left for a later
    run until that time, and every run would end without a word about it; exported now, the watermark
    would pass every real row after it."""
    found = far_future(backend, now)
    if found is not None:
        raise PipelineError(
            f"{found}; the export, in finished_at order, cannot place them, so nothing was exported: correct "
            "their finished_at in the archive and run it again"
        )


def read_archive_tail(backend: Backend, after: tuple[datetime, UUID] | None, page_size: int = 10_000) -> Any:
    """All archive rows after ``after`` as one Arrow table (export schema plus ``date``, ``queue``).

    Used by reconcile to see the rows an export left for its next run; nothing is written."""
    rows = _Columns()
    for record in _archive_pages(backend, after, page_size, cutoff=None):
        rows.add(record, "archive", None)
    return rows.table(partition_time="finished_at")


# ---------------------------------------------------------------------------------------------


class _Columns:
    """Column buffers for export rows; cheaper than one dict per row for millions of rows."""

    def __init__(self) -> None:
        self.data: dict[str, list[Any]] = {name: [] for name, _, _ in COLUMNS}
        self.data["queue"] = []

    def __len__(self) -> int:
        return len(self.data["job_id"])

    def add(self, r: JobRecord, source: str, exported_at: datetime | None) -> None:
        d = self.data
        d["job_id"].append(str(r.id))
        d["task"].append(r.task)
        d["state"].append(r.state)
        d["priority"].append(r.priority)
        d["attempts"].append(r.attempts)
        d["deliveries"].append(r.deliveries)
        d["max_attempts"].append(r.max_attempts)
        d["max_deliveries"].append(r.max_deliveries)
        d["enqueued_at"].append(r.enqueued_at)
        d["run_at"].append(r.run_at)
        d["expires_at"].append(r.expires_at)
        d["first_started_at"].append(r.first_started_at)
        d["started_at"].append(r.started_at)
        d["finished_at"].append(r.finished_at)
        d["lease_expires_at"].append(r.lease_expires_at)
        d["error_type"].append(r.error_type)
        d["error_message"].append(r.error_message)
        d["reason"].append(r.reason)
        d["idempotency_key"].append(r.idempotency_key)
        d["ordering_key"].append(r.ordering_key)
        d["replay_of"].append(None if r.replay_of is None else str(r.replay_of))
        d["replayed_by"].append(None if r.replayed_by is None else str(r.replayed_by))
        d["worker_id"].append(r.worker_id)
        d["headers"].append(r.headers)
        d["source"].append(source)
        d["exported_at"].append(exported_at)
        d["queue_name"].append(queue_name_value(r.queue))
        d["queue"].append(queue_dir_value(r.queue))

    def table(self, partition_time: str) -> Any:
        """An Arrow table in the export schema plus the ``date`` and ``queue`` partition columns."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from conveyor.pipeline.schema import arrow_schema

        schema = arrow_schema()
        arrays = [pa.array(self.data[f.name], type=f.type) for f in schema]
        table = pa.Table.from_arrays(arrays, schema=schema)
        date = pc.strftime(table[partition_time], format="%Y-%m-%d")
        table = table.append_column("date", date.cast(pa.string()))
        # An empty queue name (raw SQL can store one) is written as a null partition value, which
        # pyarrow and Spark name __HIVE_DEFAULT_PARTITION__: Spark refuses to read a "queue="
        # directory. load_jobs reads the null back as "".
        queues = [q if q else None for q in self.data["queue"]]
        return table.append_column("queue", pa.array(queues, type=pa.string()))


def _archive_pages(
    backend: Backend, after: tuple[datetime, UUID] | None, page_size: int, cutoff: datetime | None
) -> Iterator[JobRecord]:
    while True:
        page = backend.archive_read(ArchiveReadParams(after=after, limit=page_size))
        for record in page:
            assert record.finished_at is not None, "archive rows always have finished_at"
            if cutoff is not None and record.finished_at > cutoff:
                return
            yield record
        if len(page) < page_size:
            return
        last = page[-1]
        assert last.finished_at is not None
        after = (last.finished_at, last.id)


class _Exporter:
    def __init__(
        self,
        backend: Backend,
        out: Path,
        page_size: int,
        chunk_rows: int,
        progress: Callable[[int], None] | None,
        refuse_far_future: bool = True,
    ) -> None:
        self.backend = backend
        self.out = out
        self.page_size = page_size
        self.chunk_rows = chunk_rows
        self.progress = progress
        self.refuse_far_future = refuse_far_future
        self.via = "seam"

    def run(self, include_live: bool, now: datetime, settle_seconds: float) -> ExportResult:
        if self.refuse_far_future:
            _refuse_far_future(self.backend, now)
        committed = read_watermark(self.out)
        run = committed.run + 1
        self._discard_uncommitted(committed.run)
        staging = self.out / _STAGING_DIR / f"run-{run:08d}"
        staging.mkdir(parents=True)

        live_rows = 0
        live_at = committed.live_snapshot_at
        if include_live:
            # The live snapshot is taken before the archive is read: a job that ends in between is
            # then in the archive read, so it is never missing from both (reconcile relies on it).
            live_at = now
            live_rows = self._write_live(staging / LIVE_DIR, now)

        cutoff = now - timedelta(seconds=max(0.0, settle_seconds))
        read, after = self._read_archive(staging / ARCHIVE_DIR, run, committed.after, cutoff, now)
        if self.progress is not None:
            self.progress(read)

        files = self._move_into_place(staging / ARCHIVE_DIR, self.out / ARCHIVE_DIR)
        if include_live:
            files += _count_files(staging / LIVE_DIR)
            self._swap_live(staging / LIVE_DIR, run)
        watermark = Watermark(
            run=run,
            after=after,
            archive_rows=committed.archive_rows + read,
            updated_at=now,
            live_snapshot_at=live_at,
            live_rows=live_rows if include_live else committed.live_rows,
        )
        _write_json_atomic(self.out / WATERMARK_FILE, watermark.to_json())
        shutil.rmtree(self.out / _STAGING_DIR, ignore_errors=True)
        return ExportResult(self.out, run, read, live_rows, files, watermark, self.via)

    def _read_archive(
        self, target: Path, run: int, after: tuple[datetime, UUID] | None, cutoff: datetime, now: datetime
    ) -> tuple[int, tuple[datetime, UUID] | None]:
        """Write the archive rows after ``after`` that ended by ``cutoff`` under ``target``, as files
        named after ``run``; return how many and the new watermark."""
        buf = _Columns()
        chunk = 0
        read = 0
        for record in _archive_pages(self.backend, after, self.page_size, cutoff):
            buf.add(record, "archive", now)
            assert record.finished_at is not None
            after = (record.finished_at, record.id)
            read += 1
            if len(buf) >= self.chunk_rows:
                self._write(buf, target, f"part-r{run:08d}-c{chunk:05d}", "finished_at")
                buf, chunk = _Columns(), chunk + 1
            if self.progress is not None and read % self.page_size == 0:
                self.progress(read)
        if len(buf):
            self._write(buf, target, f"part-r{run:08d}-c{chunk:05d}", "finished_at")
        return read, after

    def _write_live(self, target: Path, now: datetime) -> int:
        buf = _Columns()
        after: UUID | None = None
        while True:
            page = self.backend.jobs_list(JobsListParams(after=after, limit=self.page_size))
            for record in page:
                buf.add(record, "live", now)
            if len(page) < self.page_size:
                break
            after = page[-1].id
        target.mkdir(parents=True, exist_ok=True)
        if len(buf):
            self._write(buf, target, "part-live", "enqueued_at")
        return len(buf)

    def _write(self, buf: _Columns, target: Path, stem: str, partition_time: str) -> None:
        import pyarrow as pa
        import pyarrow.dataset as ds

        table = buf.table(partition_time)
        partitioning = ds.partitioning(
            pa.schema([pa.field("date", pa.string()), pa.field("queue", pa.string())]), flavor="hive"
        )
        ds.write_dataset(
            table,
            target,
            format="parquet",
            partitioning=partitioning,
            basename_template=stem + "-{i}.parquet",
            existing_data_behavior="overwrite_or_ignore",
            max_rows_per_group=256 * 1024,
        )

    def _discard_uncommitted(self, committed_run: int) -> None:
        """Delete what a run that never committed left behind (its staging dir and moved files)."""
        shutil.rmtree(self.out / _STAGING_DIR, ignore_errors=True)
        archive = self.out / ARCHIVE_DIR
        if not archive.exists():
            return
        for path in archive.rglob("part-r*.parquet"):
            try:
                run = int(path.name[len("part-r") :].split("-", 1)[0])
            except ValueError:
                continue
            if run > committed_run:
                path.unlink()

    def _move_into_place(self, src: Path, dst: Path) -> int:
        moved = 0
        if not src.exists():
            return 0
        for path in sorted(src.rglob("*.parquet")):
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            moved += 1
        return moved

    def _swap_live(self, new: Path, run: int) -> None:
        live = self.out / LIVE_DIR
        old = self.out / _STAGING_DIR / f"live-old-{run:08d}"
        if live.exists():
            os.replace(live, old)
        os.replace(new, live)
        shutil.rmtree(old, ignore_errors=True)


class _JdbcExporter(_Exporter):
    """The archive read by Spark over JDBC (PostgreSQL); everything else as :class:`_Exporter`."""

    def __init__(
        self,
        base: _Exporter,
        database_url: str,
        spark: SparkSession | None,
        master: str | None,
        partitions: int | None,
        least: int = 0,
    ) -> None:
        super().__init__(base.backend, base.out, base.page_size, base.chunk_rows, base.progress, base.refuse_far_future)
        self.database_url = database_url
        self.spark = spark
        self.master = master
        self.partitions = partitions
        self.least = least  # fewer new rows than this go through the seam

    def _read_archive(
        self, target: Path, run: int, after: tuple[datetime, UUID] | None, cutoff: datetime, now: datetime
    ) -> tuple[int, tuple[datetime, UUID] | None]:
        import pyarrow.parquet as pq

        from conveyor.pipeline import _jdbc_export as jdbc

        if self.least and not jdbc.archive_has(self.database_url, after, cutoff, self.least):
            return super()._read_archive(target, run, after, cutoff, now)
        self.via = "jdbc"
        bounds = jdbc.archive_bounds(self.database_url, after, cutoff)
        if bounds is None:
            return 0, after
        first_at, upto = bounds
        spark = self.spark or jdbc.spark_session_for_jdbc(self.master)
        partitions = self.partitions or max(2, spark.sparkContext.defaultParallelism)
        written = target.parent / f"{target.name}-spark"
        jdbc.read_archive_jdbc(spark, self.database_url, after, first_at, upto, now, written, partitions)
        # Spark names its files part-NNNNN-<uuid>...; they are renamed to carry the run number, which
        # is what lets a later run find and delete the files of a run that never committed.
        read = 0
        for i, (date, queue, path) in enumerate(jdbc.spark_files(written)):
            read += pq.ParquetFile(path).metadata.num_rows
            dst = target / jdbc.partition_dir(date, queue) / f"part-r{run:08d}-j{i:05d}.parquet"
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dst)
        shutil.rmtree(written, ignore_errors=True)
        return read, upto


def _count_files(path: Path) -> int:
    return sum(1 for _ in path.rglob("*.parquet")) if path.exists() else 0


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    with open(out / _LOCK_FILE, "w") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PipelineError(f"another export into {out} is running") from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def input_paths(input_dir: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    """The archive and (if present) live snapshot directories of an export directory.

    A directory without an ``archive/`` subdirectory is taken to be an archive dataset itself (hive
    partitions ``date=``/``queue=`` directly below it). Raises :class:`PipelineError` if the
    directory does not exist or holds no Parquet files."""
    # Absolute: Spark resolves relative paths against the JVM's working directory (see _outdir).
    base = Path(input_dir).absolute()
    if base.exists() and not base.is_dir():
        raise PipelineError(f"input {base} is a file, not an export directory")
    if not base.is_dir():
        raise PipelineError(f"input directory {base} does not exist")
    archive = base / ARCHIVE_DIR if (base / ARCHIVE_DIR).is_dir() else base
    live = base / LIVE_DIR if (base / LIVE_DIR).is_dir() and any((base / LIVE_DIR).rglob("*.parquet")) else None
    if not any(archive.rglob("*.parquet")) and live is None:
        raise PipelineError(f"{base} holds no exported jobs (run `conveyor export --out {base}` first)")
    return archive, live


__all__: Sequence[str] = ("ExportResult", "Watermark", "export", "input_paths", "read_watermark")
