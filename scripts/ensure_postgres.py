"""Print a PostgreSQL URL for the test suite, starting a throwaway cluster when none is reachable.

Order: $CONVEYOR_TEST_POSTGRES_URL (must answer), else postgresql://postgres@127.0.0.1:5432/test if it
answers, else a new cluster in a temporary directory on a free port (installing Debian's postgresql
package first when no server binaries exist and we are root). Prints ``URL DATADIR`` (DATADIR ``-``
when nothing was started) so the caller can stop the cluster with ``pg_ctl -D DATADIR stop``."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psycopg

DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return os.path.dirname(found[0])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster() -> tuple[str, str]:
    bins = bindir()
    if bins is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "postgresql"],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        bins = bindir()
    if bins is None:
        sys.exit(
            "no PostgreSQL reachable and no server binaries found: install postgresql or set CONVEYOR_TEST_POSTGRES_URL"
        )
    datadir = tempfile.mkdtemp(prefix="conveyor-pg-")
    user: list[str] = []
    if os.geteuid() == 0:
        # initdb refuses to run as root; run the cluster as the postgres user.
        pw = pwd.getpwnam("postgres")
        os.chown(datadir, pw.pw_uid, pw.pw_gid)
        user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run(
        [*user, f"{bins}/initdb", "-D", datadir, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [
            *user,
            f"{bins}/pg_ctl",
            "-D",
            datadir,
            "-l",
            f"{datadir}/log",
            "-w",
            "-o",
            f"-p {port} -k {datadir} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    for _ in range(50):
        if answers(url):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE DATABASE test")
            return f"postgresql://postgres@127.0.0.1:{port}/test", datadir
        time.sleep(0.2)
    sys.exit(f"the throwaway PostgreSQL in {datadir} did not start; see {datadir}/log")


def stop(datadir: str) -> None:
    """Stop a cluster started by this script and delete its directory."""
    bins = bindir()
    user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if bins:
        subprocess.run(
            [*user, f"{bins}/pg_ctl", "-D", datadir, "-m", "fast", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    shutil.rmtree(datadir, ignore_errors=True)


def main() -> None:
    if sys.argv[1:2] == ["stop"]:
        stop(sys.argv[2])
        return
    configured = os.environ.get("CONVEYOR_TEST_POSTGRES_URL")
    if configured:
        if not answers(configured):
            sys.exit(f"CONVEYOR_TEST_POSTGRES_URL={configured} does not answer")
        print(configured, "-")
    elif answers(DEFAULT):
        print(DEFAULT, "-")
    else:
        url, datadir = start_cluster()
        print(url, datadir)


if __name__ == "__main__":
    main()
