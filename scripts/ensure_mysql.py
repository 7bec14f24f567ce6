"""Print a MySQL URL for the test suite, starting a throwaway MariaDB server when none is reachable.

Order: $CONVEYOR_TEST_MYSQL_URL (must answer), else mysql://root@127.0.0.1:3306/test if it answers, else a
new server in a temporary directory on a free port of 127.0.0.1 (installing Debian's mariadb-server package
first when no server binaries exist and we are root). Prints ``URL DATADIR`` (DATADIR ``-`` when nothing was
started) so the caller can stop the server with ``ensure_mysql.py stop DATADIR``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymysql

from conveyor._errors import ConfigurationError
from conveyor.backends._redact import redact_url
from conveyor.backends.mysql._url import connect_kwargs

DEFAULT = "mysql://root@127.0.0.1:3306/test"
# Every datadir this script makes starts so; `stop` refuses any other directory, as it deletes what it is given.
PREFIX = "conveyor-mysql-"
PID_FILE = "mysqld.pid"
# Binaries live in /usr/sbin, which is not on every user's PATH.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


def answers(url: str) -> bool:
    """Whether a server answers ``SELECT 1`` at ``url``; raises ConfigurationError for a malformed URL."""
    try:
        with pymysql.connect(**connect_kwargs(url) | {"connect_timeout": 3}) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    except pymysql.Error:
        return False


def binaries() -> tuple[str, str] | None:
    """The server and the datadir initialiser (MariaDB's names first, then their mysql_ aliases)."""
    server = shutil.which("mariadbd", path=SEARCH_PATH) or shutil.which("mysqld", path=SEARCH_PATH)
    install = shutil.which("mariadb-install-db", path=SEARCH_PATH) or shutil.which("mysql_install_db", path=SEARCH_PATH)
    return (server, install) if server and install else None


def install_mariadb() -> None:
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "mariadb-server"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[str, str]:
    """Initialise a datadir and start a server on it; return its ``test`` database's URL and the datadir."""
    bins = binaries()
    if bins is None and os.geteuid() == 0 and shutil.which("apt-get"):
        install_mariadb()
        bins = binaries()
    if bins is None:
        sys.exit(
            "no MySQL reachable and no MariaDB server binaries found: "
            "install mariadb-server or set CONVEYOR_TEST_MYSQL_URL"
        )
    server, install = bins
    datadir = tempfile.mkdtemp(prefix=PREFIX)
    # mariadbd refuses to run as root unless told to; the datadir is ours, so it runs as its owner.
    user = ["--user=root"] if os.geteuid() == 0 else []
    # --no-defaults: the machine's /etc/mysql files name another datadir, port and socket.
    # 'normal' authentication creates root@127.0.0.1 (and localhost, ::1) with an empty password; the
    # default on Debian, unix_socket, would let only the OS root in, over the socket.
    with open(f"{datadir}/install.log", "w") as install_log:
        initialised = subprocess.run(
            [
                install,
                "--no-defaults",
                f"--datadir={datadir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                *user,
            ],
            check=False,
            stdout=install_log,
            stderr=subprocess.STDOUT,
        )
    if initialised.returncode != 0:
        sys.exit(f"{install} could not initialise {datadir}; see {datadir}/install.log")
    port = free_port()
    log = f"{datadir}/error.log"
    # Detached, with no inherited stdout: the caller reads this script's output with $(...), which would
    # otherwise wait for the server to exit.
    process = subprocess.Popen(
        [
            server,
            "--no-defaults",
            f"--datadir={datadir}",
            f"--socket={datadir}/mysqld.sock",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={datadir}/{PID_FILE}",
            f"--log-error={log}",
            "--skip-name-resolve",
            "--character-set-server=utf8mb4",
            # A throwaway server's data need not survive a crash: no flush at each commit, as fsync=off.
            "--innodb-flush-log-at-trx-commit=0",
            "--innodb-doublewrite=0",
            *user,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    admin = f"mysql://root@127.0.0.1:{port}/mysql"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        if answers(admin):
            with pymysql.connect(**connect_kwargs(admin)) as conn, conn.cursor() as cur:
                cur.execute("CREATE DATABASE test CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin")
            return f"mysql://root@127.0.0.1:{port}/test", datadir
        time.sleep(0.1)
    if process.poll() is None:
        process.kill()
    sys.exit(f"the throwaway MariaDB in {datadir} did not start; see {log}")


def server_pid(datadir: Path) -> int | None:
    """The pid of the server running on ``datadir``, or None: a stale pid file's number may be another
    process's by now, so the process must have been started on this datadir."""
    try:
        pid = int((datadir / PID_FILE).read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if f"--datadir={datadir}".encode() in command else None


def stop(datadir: str) -> None:
    """Stop a server started by this script and delete its directory."""
    path = Path(datadir)
    if not path.name.startswith(PREFIX):
        sys.exit(f"not a datadir of ensure_mysql.py (its name starts with {PREFIX}): {datadir}")
    pid = server_pid(path)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        # The server removes its pid file when it has shut down; its exit may never be reaped (a container's
        # init that reaps no orphans), so the process itself can linger as a zombie.
        deadline = time.monotonic() + 30
        while (path / PID_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if (path / PID_FILE).exists():
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None, default: str = DEFAULT) -> None:
    """``ensure_mysql.py`` prints ``URL DATADIR``; ``ensure_mysql.py stop DATADIR`` stops that server.

    ``default`` is the server tried when $CONVEYOR_TEST_MYSQL_URL is unset (a test points it where none listens)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["stop"] and len(args) == 2:
        stop(args[1])
        return
    if args:
        sys.exit("usage: ensure_mysql.py [stop DATADIR]")
    configured = os.environ.get("CONVEYOR_TEST_MYSQL_URL")
    try:
        if configured:
            if not answers(configured):
                sys.exit(f"CONVEYOR_TEST_MYSQL_URL={redact_url(configured)} does not answer")
            print(configured, "-")
        elif answers(default):
            print(default, "-")
        else:
            url, datadir = start_server()
            print(url, datadir)
    except ConfigurationError as exc:
        sys.exit(f"CONVEYOR_TEST_MYSQL_URL: {exc}")


if __name__ == "__main__":
    main()
