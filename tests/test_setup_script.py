"""A fresh machine (issue 14): the README's set-up path, as a newcomer runs it.

``.ci/run`` runs the README's quick start on a clean clone (the demo, then the tests); these cheap tests
keep it and the install stamp honest without a network or a second virtualenv."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from subprocess import CompletedProcess

import pymysql
import pytest
from tests.conftest import mysql_connect

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
# Records what _setup.sh asks of the virtualenv's python instead of installing anything.
echo "$*" >> "$(dirname "$0")/../../calls.log"
"""


def _project(tmp_path: Path) -> Path:
    """A copy of the set-up script next to a pyproject.toml, with a fake .venv/bin/python."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_setup.sh", tmp_path / "scripts" / "_setup.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    old = time.time() - 3600
    os.utime(tmp_path / "pyproject.toml", (old, old))
    return tmp_path


def _setup(project: Path, extras: str | None) -> list[str]:
    """Source _setup.sh as demo.sh (no extras given) or test.sh do; return the installs it ran."""
    log = project / "calls.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_EXTRAS"}
    if extras is not None:
        env["CONVEYOR_EXTRAS"] = extras
    done = subprocess.run(
        ["bash", "-c", "source scripts/_setup.sh"], cwd=project, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return [c.split()[-1] for c in calls if " install " in f" {c} " and "-e" in c.split()]


def test_the_install_stamp_depends_on_the_extras(tmp_path: Path) -> None:
    """demo.sh then test.sh on a fresh clone: the second must install the test extras (it did not:
    one stamp stood for any set of extras, and the tests failed with "No module named 'pyspark'")."""
    project = _project(tmp_path)
    assert _setup(project, None) == [".[dev]"]  # demo.sh
    assert _setup(project, "dev,pipeline") == [".[dev,pipeline]"]  # test.sh
    assert _setup(project, "dev,pipeline") == []  # test.sh again: installed
    assert _setup(project, None) == []  # demo.sh again
    future = time.time() + 3600
    os.utime(project / "pyproject.toml", (future, future))
    assert _setup(project, "dev,pipeline") == [".[dev,pipeline]"]  # the dependencies changed


def test_ci_runs_the_readme_quick_start_in_order() -> None:
    """.ci/run must run what the README tells a newcomer to run, in the same order."""
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in quick_start.splitlines() if line.strip()]
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    ran = [next(i for i, line in enumerate(ci) if re.match(re.escape(c) + r"(\s|$)", line)) for c in commands]
    assert ran == sorted(ran), ci


# scripts/ensure_mysql.py: the suite's MySQL, the machine's server or a throwaway one.

ENSURE_MYSQL = ROOT / "scripts" / "ensure_mysql.py"


def _ensure_mysql(*args: str, default: str | None = None, env: dict[str, str] | None = None) -> CompletedProcess[str]:
    """Run ensure_mysql.py as test.sh does (its own process, so that a server it starts outlives it), with
    ``default`` in place of mysql://root@127.0.0.1:3306/test; without $CONVEYOR_TEST_MYSQL_URL unless given."""
    environ = {k: v for k, v in os.environ.items() if k != "CONVEYOR_TEST_MYSQL_URL"} | (env or {})
    if default is None:
        command = [sys.executable, str(ENSURE_MYSQL), *args]
    else:
        call = f"import ensure_mysql; ensure_mysql.main({list(args)!r}, default={default!r})"
        command = [sys.executable, "-c", call]
    return subprocess.run(
        command, cwd=ENSURE_MYSQL.parent, env=environ, capture_output=True, text=True, timeout=60, check=False
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with mysql_connect(url) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    except pymysql.Error:
        return False


@pytest.mark.timeout(60)
def test_ensure_mysql_starts_a_throwaway_server_where_none_answers_and_stop_removes_it(
    mysql_server_url: str,
) -> None:
    """Where nothing listens it initialises a datadir, starts a server on a free port of 127.0.0.1 with a
    root that logs in over TCP without a password, and creates the database test; `stop` ends it."""
    started = _ensure_mysql(default=f"mysql://root@127.0.0.1:{_free_port()}/test")
    assert started.returncode == 0, started.stderr
    url, datadir = started.stdout.split()
    try:
        assert re.fullmatch(r"mysql://root@127\.0\.0\.1:\d+/test", url)
        assert Path(datadir).name.startswith("conveyor-mysql-")
        with mysql_connect(url) as conn, conn.cursor() as cur:
            cur.execute("SELECT CURRENT_USER(), DATABASE(), @@collation_database, @@bind_address, @@socket")
            assert cur.fetchone() == (
                "root@127.0.0.1",
                "test",
                "utf8mb4_nopad_bin",
                "127.0.0.1",
                f"{datadir}/mysqld.sock",
            )
            cur.execute("SELECT plugin FROM mysql.user WHERE user = 'root' AND host = '127.0.0.1'")
            assert cur.fetchone() in (("",), ("mysql_native_password",))  # a password, not the OS user
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
            cur.execute("INSERT INTO t VALUES (1)")
    finally:
        stopped = _ensure_mysql("stop", datadir)
    assert stopped.returncode == 0, stopped.stderr
    assert not Path(datadir).exists()
    assert not _answers(url)
    assert _answers(mysql_server_url)  # the suite's own server was left alone


def test_ensure_mysql_takes_the_default_server_when_it_answers(mysql_server_url: str) -> None:
    found = _ensure_mysql(default=mysql_server_url)
    assert (found.returncode, found.stdout) == (0, f"{mysql_server_url} -\n"), found.stderr


def test_ensure_mysql_takes_the_configured_url_and_fails_when_it_does_not_answer(mysql_server_url: str) -> None:
    """$CONVEYOR_TEST_MYSQL_URL is used as given, never replaced by a throwaway server; one that does not
    answer (or does not parse) stops the suite with one line that does not show its password."""
    configured = _ensure_mysql(env={"CONVEYOR_TEST_MYSQL_URL": mysql_server_url})
    assert (configured.returncode, configured.stdout) == (0, f"{mysql_server_url} -\n"), configured.stderr
    for url in (f"mysql://root:hunter2@127.0.0.1:{_free_port()}/test", "mysql://root:hunter2@127.0.0.1:x/test"):
        failed = _ensure_mysql(env={"CONVEYOR_TEST_MYSQL_URL": url})
        assert failed.returncode != 0
        assert failed.stdout == ""
        assert failed.stderr.count("\n") == 1 and "CONVEYOR_TEST_MYSQL_URL" in failed.stderr
        assert "hunter2" not in failed.stderr


def test_ensure_mysql_stop_deletes_only_a_directory_it_made(tmp_path: Path) -> None:
    refused = _ensure_mysql("stop", str(tmp_path))
    assert refused.returncode != 0 and "not a datadir of ensure_mysql.py" in refused.stderr
    assert tmp_path.exists()


# scripts/test.sh: the services it starts are stopped however the run ends.

FAKE_TOOL = """#!/usr/bin/env bash
# Stands in for python (and ruff, mypy, id) in test.sh: records each call, answers the ensure scripts.
echo "$(basename "$0") $*" >> "$(dirname "$0")/../../calls.log"
case "$(basename "$0") $1 $2" in
  "id -u ") echo 1000 ;;
  "python scripts/ensure_postgres.py ") echo "postgresql://pg/test $FAKE_PG_DATADIR" ;;
  "python scripts/ensure_mysql.py ") [ -z "${FAKE_MYSQL_FAILS:-}" ] || exit 1
    echo "mysql://my/test $FAKE_MYSQL_DATADIR" ;;
  "python scripts/ensure_rabbitmq.py ") [ -z "${FAKE_AMQP_FAILS:-}" ] || exit 1
    echo "amqp://mq/ $FAKE_AMQP_DIR" ;;
  "python -m pytest") echo "pytest pg=$CONVEYOR_TEST_POSTGRES_URL mysql=$CONVEYOR_TEST_MYSQL_URL" \\
    "amqp=$CONVEYOR_TEST_AMQP_URL" \\
    >> "$(dirname "$0")/../../calls.log"; exit "${FAKE_PYTEST_EXIT:-0}" ;;
esac
"""


def _run_test_sh(tmp_path: Path, **fakes: str) -> tuple[int, list[str]]:
    """Run a copy of test.sh whose python, ruff, mypy and id are fakes (``id -u`` is not 0, so nothing is
    installed with apt-get); return its exit code and the calls it made."""
    project = _project(tmp_path)
    shutil.copy(ROOT / "scripts" / "test.sh", project / "scripts" / "test.sh")
    shutil.copy(ROOT / "scripts" / "dev-constraints.txt", project / "scripts" / "dev-constraints.txt")
    for tool in ("python", "ruff", "mypy", "id", "java"):
        fake = project / ".venv" / "bin" / tool
        fake.write_text(FAKE_TOOL)
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVEYOR_", "FAKE_"))}
    env |= {"FAKE_PG_DATADIR": "-", "FAKE_MYSQL_DATADIR": "-", "FAKE_AMQP_DIR": "-", **fakes}
    done = subprocess.run(
        ["bash", "scripts/test.sh", "-q"], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    calls = (project / "calls.log").read_text().splitlines()
    return done.returncode, [c for c in calls if c.startswith(("python scripts/", "pytest "))]


def test_test_sh_exports_the_urls_and_stops_every_throwaway_server_on_exit(tmp_path: Path) -> None:
    code, calls = _run_test_sh(
        tmp_path,
        FAKE_PG_DATADIR="/tmp/pg",
        FAKE_MYSQL_DATADIR="/tmp/my",
        FAKE_AMQP_DIR="/tmp/mq",
        FAKE_PYTEST_EXIT="3",
    )
    assert code == 3  # pytest's failure is the script's, the trap notwithstanding
    assert calls == [
        "python scripts/ensure_postgres.py",
        "python scripts/ensure_mysql.py",
        "python scripts/ensure_rabbitmq.py",
        "pytest pg=postgresql://pg/test mysql=mysql://my/test amqp=amqp://mq/",
        "python scripts/ensure_rabbitmq.py stop /tmp/mq",
        "python scripts/ensure_mysql.py stop /tmp/my",
        "python scripts/ensure_postgres.py stop /tmp/pg",
    ]


def test_test_sh_stops_the_throwaway_databases_when_rabbitmq_cannot_be_had(tmp_path: Path) -> None:
    code, calls = _run_test_sh(tmp_path, FAKE_PG_DATADIR="/tmp/pg", FAKE_MYSQL_DATADIR="/tmp/my", FAKE_AMQP_FAILS="1")
    assert code != 0
    assert calls == [
        "python scripts/ensure_postgres.py",
        "python scripts/ensure_mysql.py",
        "python scripts/ensure_rabbitmq.py",
        "python scripts/ensure_mysql.py stop /tmp/my",
        "python scripts/ensure_postgres.py stop /tmp/pg",
    ]


def test_test_sh_stops_the_throwaway_postgres_when_mysql_cannot_be_had(tmp_path: Path) -> None:
    code, calls = _run_test_sh(tmp_path, FAKE_PG_DATADIR="/tmp/pg", FAKE_MYSQL_FAILS="1")
    assert code != 0
    assert calls == [
        "python scripts/ensure_postgres.py",
        "python scripts/ensure_mysql.py",
        "python scripts/ensure_postgres.py stop /tmp/pg",
    ]


def test_test_sh_stops_nothing_it_did_not_start(tmp_path: Path) -> None:
    code, calls = _run_test_sh(tmp_path)
    assert code == 0
    assert calls == [
        "python scripts/ensure_postgres.py",
        "python scripts/ensure_mysql.py",
        "python scripts/ensure_rabbitmq.py",
        "pytest pg=postgresql://pg/test mysql=mysql://my/test amqp=amqp://mq/",
    ]
