"""A PostgreSQL cluster of the benchmark's own, with default settings (fsync, synchronous_commit and
autovacuum on, shared_buffers 128MB: the way users run it), started in a temporary directory and
removed afterwards; and the CPU accounting of its processes. Used by bench/http and
bench/independent.py."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bindir() -> str:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if not found:
        sys.exit("PostgreSQL server binaries not found (apt-get install postgresql)")
    return str(found[0].parent)


class Cluster:
    """A PostgreSQL cluster with default settings in a temporary directory."""

    def __init__(self) -> None:
        self.bins = bindir()
        self.dir = tempfile.mkdtemp(prefix="conveyor-http-bench-pg-")
        self.user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.port = free_port()
        subprocess.run(
            [*self.user, f"{self.bins}/initdb", "-D", self.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # Only where to listen: every other setting is PostgreSQL's default.
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        subprocess.run(
            [*self.user, f"{self.bins}/pg_ctl", "-D", self.dir, "-l", f"{self.dir}/log", "-w", "-o", options, "start"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.admin = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database(self, name: str) -> str:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def settings(self) -> dict[str, str]:
        with psycopg.connect(self.admin) as conn:
            names = ("server_version", "fsync", "synchronous_commit", "autovacuum", "shared_buffers", "wal_sync_method")
            return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]

    def pids(self) -> list[int]:
        postmaster = int(Path(self.dir, "postmaster.pid").read_text().split()[0])
        return [postmaster, *children(postmaster)]

    def stop(self) -> None:
        subprocess.run(
            [*self.user, f"{self.bins}/pg_ctl", "-D", self.dir, "-m", "fast", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    found = [int(p) for p in out]
    for child in list(found):
        found.extend(children(child))
    return found
