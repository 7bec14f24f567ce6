"""A throwaway PostgreSQL cluster in a temporary directory, for tests that stop and start the server.

::

    with PgCluster() as cluster:        # initdb + start, on a free port, trust auth
        url = cluster.url               # postgresql://postgres@127.0.0.1:PORT/postgres
        cluster.stop()                  # pg_ctl stop -m fast
        cluster.start()                 # same data, same port
    # stopped (immediate) and removed

The server binaries come from ``$CONVEYOR_PG_BIN``, else ``pg_config --bindir``, else the first
``/usr/lib/postgresql/*/bin`` found. PostgreSQL refuses to run as root: when the tests run as root
the cluster is created and run as the ``postgres`` OS user (``$CONVEYOR_PG_USER`` to change it).
Run as a script (``python tests/e2e/_pgcluster.py``) it starts a cluster, prints its URL and
keeps it until interrupted.
"""

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
from pathlib import Path
from types import TracebackType
from typing import Any


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres."""
    configured = os.environ.get("CONVEYOR_PG_BIN")
    if configured:
        return Path(configured)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if out.returncode == 0 and (candidate / "initdb").exists():
            return candidate
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError("PostgreSQL server binaries not found: set CONVEYOR_PG_BIN to the directory with initdb")


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgCluster:
    """One PostgreSQL server of its own: created on :meth:`start`, removed on :meth:`destroy`."""

    def __init__(self, port: int | None = None, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="conveyor-pg-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            user = pwd.getpwnam(os.environ.get("CONVEYOR_PG_USER", "postgres"))
            self._as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            os.chown(self.root, user.pw_uid, user.pw_gid)
        os.chmod(self.root, 0o700)
        self._initialised = False

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bindir / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            check=False,
            **self._as,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
        return done

    def start(self) -> None:
        """initdb (the first time) and start the server; returns once it accepts connections."""
        if not self._initialised:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            self._initialised = True
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``: fast disconnects every client and shuts down cleanly."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    @property
    def running(self) -> bool:
        if not self._initialised:
            return False
        done = subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"],
            capture_output=True,
            check=False,
            **self._as,
        )
        return done.returncode == 0

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""

    def destroy(self) -> None:
        """Stop the server (immediate) if it runs and remove its directory."""
        try:
            if self.running:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.destroy()


def main() -> int:
    with PgCluster() as cluster:
        print(cluster.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
