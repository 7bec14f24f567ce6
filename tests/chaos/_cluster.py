"""The chaos runs' PostgreSQL: a throwaway cluster (``tests/e2e/_pgcluster.py``) configured as in
production where it matters for durability, plus the two database faults (immediate restart, a
transaction held open)."""

from __future__ import annotations

import threading
import time

import psycopg
from tests.e2e._pgcluster import PgCluster


class ChaosCluster(PgCluster):
    """A throwaway cluster whose commits are durable across an immediate restart.

    The e2e cluster runs with ``synchronous_commit=off`` for speed; an immediate restart would then
    forget commits of the last few hundred milliseconds, accepted jobs included, and the chaos run
    would report Conveyor losing jobs that the server lost. Here the server default is ``on`` (what
    production runs): inserts wait for the WAL, and only Conveyor's own outcome statements commit
    asynchronously (its ``durable_acks=False`` default), so a crash can lose outcomes, never jobs.
    ``fsync=off`` stays: it only matters when the operating system crashes, which no fault does.
    ``autovacuum_naptime=5s`` (default 1 min) lets the jobs table's own autovacuum thresholds act
    within a run of a few minutes, so that what a vacuum blocker changes can be seen; and
    ``pg_stat_statements`` is loaded, so that the long form can time Conveyor's own statements."""

    def start(self) -> None:
        if not self._initialised:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            self._initialised = True
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=on -c full_page_writes=off -c max_connections=200 -c autovacuum_naptime=5s "
            "-c shared_preload_libraries=pg_stat_statements"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", options, "-w", "-t", "60", "start")

    def __enter__(self) -> ChaosCluster:
        super().__enter__()
        return self

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: every backend dies at once, no checkpoint, crash recovery
        on start (what a power cut does to the server, minus the disk); returns once the server
        accepts connections again."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-m", "immediate", "-w", "-t", "60",
                  "restart")  # fmt: skip

    def create_database(self, name: str) -> str:
        """Create database ``name``; return its URL."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)


class VacuumBlocker:
    """Holds a transaction open (a report, a ``pg_dump``): its snapshot stops vacuum from removing
    any row version deleted after it began, so the jobs table's dead rows pile up meanwhile."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        self.xid: int | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._hold, name="vacuum-blocker", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the vacuum blocker could not open its transaction in 30 s")
        if self.error is not None:
            raise RuntimeError(f"the vacuum blocker failed: {self.error!r}")

    def _hold(self) -> None:
        try:
            with psycopg.connect(self.url) as conn:
                # REPEATABLE READ keeps one snapshot for the whole transaction, and txid_current()
                # gives it an xid: both hold back the horizon vacuum cleans up to.
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                row = conn.execute("SELECT txid_current()").fetchone()
                self.xid = int(row[0]) if row else None
                conn.execute("SELECT count(*) FROM jobs")
                self._ready.set()
                while not self._release.wait(0.5):
                    pass
                conn.rollback()
        except BaseException as exc:  # reported by start() or release()
            self.error = exc
            self._ready.set()

    def release(self) -> None:
        """End the transaction (rollback)."""
        self._release.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def wait_accepting(url: str, timeout: float = 60.0) -> None:
    """Return once ``url`` accepts a connection and a query."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
