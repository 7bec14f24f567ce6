"""The benchmark runner: ``python -m bench`` (see bench/README.md).

Installs the peers into their own virtualenv (bench/.venv-peers), then runs every workload for
every library, each in its own subprocess (bench/driver.py) on a fresh PostgreSQL database or a
flushed Redis db, and writes one JSON line per figure to ``bench/results/<stamp>.jsonl`` plus a
markdown table next to it. ``--smoke`` is the seconds-long form CI runs: Conveyor only, tiny N,
no network.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import ROOT

BENCH = ROOT / "bench"
PEERS_VENV = BENCH / ".venv-peers"
PEER_PACKAGES = ["pgqueuer", "procrastinate", "celery[redis]", "dramatiq[redis]", "rq", "redis", "psycopg[binary]"]
PEERS = ["pgqueuer", "procrastinate", "celery", "dramatiq", "rq"]
POSTGRES_PEERS = {"pgqueuer", "procrastinate"}
DEFAULT_PG = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
DEFAULT_MYSQL = os.environ.get("CONVEYOR_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


def _with_db(url: str, name: str) -> str:
    """``url`` naming the database ``name`` instead."""
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


REDIS_DB = "redis://127.0.0.1:6379/13"
BIG_DB = "bench_big_tables"


@dataclass
class Sizes:
    batch: int = 20_000
    single: int = 5_000
    drain: int = 20_000
    latency: int = 200
    latency_interval: float = 0.020
    idle: float = 1.0
    rss: int = 1_000_000
    rss_at: tuple[int, ...] = (100_000, 1_000_000)
    scheduled: int = 1_000_000
    archived: int = 10_000_000
    raw_batches: tuple[int, ...] = (10, 100)
    repeats: int = 1
    timeout: float = 600.0


SMOKE = Sizes(
    batch=300, single=50, drain=300, latency=10, latency_interval=0.01, idle=0.2, rss=2_000, rss_at=(500, 2_000),
    scheduled=1_000, archived=10_000, raw_batches=(10,), repeats=1, timeout=60.0,
)  # fmt: skip


@dataclass
class Runner:
    args: argparse.Namespace
    sizes: Sizes
    out: Path
    work: Path
    results: list[dict[str, Any]] = field(default_factory=list)
    created: list[str] = field(default_factory=list)

    # -- databases ----------------------------------------------------------------------------

    def url(self, name: str) -> str:
        base, _, _ = self.args.pg.rpartition("/")
        return f"{base}/{name}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.args.pg, autocommit=True) as conn:
            conn.execute(sql)

    def fresh_db(self) -> str:
        name = f"bench_{uuid.uuid4().hex[:10]}"
        self.admin(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return name

    def mysql_admin(self, sql: str) -> None:
        """One statement on the MySQL server of ``--mysql`` (PyMySQL: the ``mysql`` extra)."""
        import pymysql

        from conveyor.backends.mysql._url import connect_kwargs

        with pymysql.connect(**connect_kwargs(self.args.mysql), autocommit=True) as conn:
            conn.cursor().execute(sql)

    def fresh_mysql_db(self) -> str:
        """A new database on the MySQL server, in the collation Conveyor expects (see docs/decisions.md)."""
        name = f"bench_{uuid.uuid4().hex[:10]}"
        self.mysql_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin")
        return name

    def drop_db(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def db_exists(self, name: str) -> bool:
        import psycopg

        with psycopg.connect(self.args.pg, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None

    # -- running one figure ---------------------------------------------------------------------

    def python_for(self, lib: str) -> str:
        return sys.executable if lib == "conveyor" else str(PEERS_VENV / "bin" / "python")

    def run(self, lib: str, workload: str, n: int, label: str | None = None, **extra: Any) -> dict[str, Any] | None:
        """Run one driver on a fresh database (or flushed Redis db); record and return its result."""
        options = extra.pop("options", {})
        timeout = float(extra.pop("timeout", self.sizes.timeout))
        db_name = extra.pop("db_name", None)
        sqlite = options.get("sqlite", False)
        fresh = None
        mysql_db = None
        if sqlite:
            path = self.work / f"{uuid.uuid4().hex[:8]}.db"
            db = f"sqlite:///{path}"
        elif options.get("mysql"):
            mysql_db = self.fresh_mysql_db()
            db = _with_db(self.args.mysql, mysql_db)
        elif lib == "conveyor" or lib in POSTGRES_PEERS:
            fresh = db_name is None
            db_name = db_name or self.fresh_db()
            db = self.url(db_name)
        else:
            db = ""
        tag = f"{lib}-{workload}-{uuid.uuid4().hex[:6]}"
        argv = [
            self.python_for(lib), "-m", "bench.driver", lib, workload, "--n", str(n), "--db", db,
            "--redis", REDIS_DB, "--side", str(self.work / f"{tag}.side"), "--log", str(self.work / f"{tag}.log"),
            "--timeout", str(timeout), "--options", json.dumps(options),
        ]  # fmt: skip
        for key, value in extra.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        try:
            return self._call(
                argv, label or workload, lib, fresh_db=db_name if fresh else None, sqlite_path=db, timeout=timeout
            )
        finally:
            if mysql_db:
                self.mysql_admin(f"DROP DATABASE IF EXISTS `{mysql_db}`")

    def raw_sql(self, n: int, batch: int) -> dict[str, Any] | None:
        name = self.fresh_db()
        argv = [sys.executable, "-m", "bench.raw_sql", "--db", self.url(name), "--n", str(n), "--batch", str(batch)]
        return self._call(argv, f"raw_sql_b{batch}", "raw-sql", fresh_db=name)

    def _call(
        self,
        argv: list[str],
        label: str,
        lib: str,
        fresh_db: str | None = None,
        sqlite_path: str = "",
        timeout: float | None = None,
    ) -> dict[str, Any] | None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        print(f"  {label:<16} {lib:<14}", end=" ", flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=(timeout or self.sizes.timeout) + 120
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH-RESULT ")]
            if proc.returncode != 0 or not lines:
                result: dict[str, Any] = {"lib": lib, "ok": False, "error": (proc.stderr or proc.stdout)[-2000:]}
            else:
                result = json.loads(lines[-1].removeprefix("BENCH-RESULT "))
        except subprocess.TimeoutExpired:
            result = {"lib": lib, "ok": False, "error": "timed out"}
        finally:
            if fresh_db:
                self.drop_db(fresh_db)
            if sqlite_path.startswith("sqlite:///"):
                for suffix in ("", "-wal", "-shm"):
                    Path(sqlite_path.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
        result.update(figure=label, lib=lib, wall_seconds=round(time.monotonic() - t0, 1), at=time.time())
        self.results.append(result)
        with self.out.open("a") as f:
            f.write(json.dumps(result, sort_keys=True) + "\n")
        print(describe(result), flush=True)
        return result


def describe(r: dict[str, Any]) -> str:
    if not r.get("ok") and r.get("done"):
        return f"TIMED OUT after {r['done']:,} of {r['n']:,} jobs ({r.get('rate') or 0:,.0f} jobs/s until then)"
    if not r.get("ok"):
        return "FAILED: " + str(r.get("error", ""))[-300:].replace("\n", " | ")
    if "p50_ms" in r:
        return f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  (n={r['done']})"
    text = f"{r['rate']:,.0f} jobs/s  ({r['n']:,} in {r['seconds']:.2f}s)"
    if r.get("rss_kib"):
        text += "  RSS " + ", ".join(f"{c:,}: {kib / 1024:.1f} MiB" for c, kib in r["rss_kib"])
    return text


# -- peers ------------------------------------------------------------------------------------


def ensure_peers(offline: bool) -> dict[str, str]:
    """Create bench/.venv-peers and install the peers from PyPI (once); return their versions."""
    python = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / ".installed"
    wanted = "\n".join(PEER_PACKAGES)
    if not (marker.exists() and marker.read_text() == wanted):
        if offline:
            raise SystemExit("bench/.venv-peers is not installed; run without --no-install once")
        print(f"installing peers into {PEERS_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
        marker.write_text(wanted)
    names = [*PEERS, "redis", "psycopg", "kombu"]
    code = f"import json, importlib.metadata as m; print(json.dumps({{p: m.version(p) for p in {names!r}}}))"
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out))


def machine(pg: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(pg, autocommit=True) as conn:
        # What one durable commit costs here (the WAL flush): every PostgreSQL figure is bounded by
        # it. An unlogged or temporary table would not flush, hence a throwaway database.
        probe = f"bench_probe_{os.getpid()}"
        conn.execute(f'CREATE DATABASE "{probe}"')
        try:
            with psycopg.connect(pg.rpartition("/")[0] + "/" + probe, autocommit=True) as p:
                p.execute("CREATE TABLE probe (x int)")
                t0 = time.perf_counter()
                for _ in range(100):
                    p.execute("INSERT INTO probe VALUES (1)")
                commit_ms = (time.perf_counter() - t0) / 100 * 1000
        finally:
            conn.execute(f'DROP DATABASE IF EXISTS "{probe}" WITH (FORCE)')
        row = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
        shared = conn.execute("SHOW shared_buffers").fetchone()
        autovacuum = conn.execute("SHOW autovacuum").fetchone()
    mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    redis_version = None
    try:
        info = subprocess.run(["redis-cli", "INFO", "server"], capture_output=True, text=True, timeout=5).stdout
        match = re.search(r"redis_version:(\S+)", info)
        redis_version = match.group(1) if match else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "nproc": os.cpu_count(),
        "ram_gib": round(int(mem) / 1024 / 1024, 1),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "postgres": row[0] if row else None,
        "postgres_synchronous_commit": sync[0] if sync else None,
        "postgres_shared_buffers": shared[0] if shared else None,
        "postgres_autovacuum": autovacuum[0] if autovacuum else None,
        "postgres_commit_ms": round(commit_ms, 2),
        "redis": redis_version,
        "loadavg_start": load,
    }


def git_state() -> dict[str, Any]:
    """The commit measured, and which tracked files differed from it (other people's work in progress)."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"), "modified": git("diff", "--name-only").split()}


# -- the plan -----------------------------------------------------------------------------------


def plan(r: Runner, libs: list[str], workloads: set[str]) -> None:
    s = r.sizes
    for rep in range(s.repeats):
        suffix = f" (repeat {rep + 1}/{s.repeats})" if s.repeats > 1 else ""
        if "batch" in workloads:
            print(f"(1) batch enqueue of {s.batch:,} jobs{suffix}")
            for lib in libs:
                r.run(lib, "batch", s.batch)
        if "single" in workloads:
            print(f"(2) single enqueue of {s.single:,} jobs{suffix}")
            for lib in libs:
                r.run(lib, "single", s.single)
        if "drain" in workloads:
            print(f"(3) drain of {s.drain:,} jobs, 1 process x 10 slots{suffix}")
            for lib in libs:
                r.run(lib, "drain", s.drain)
        if "latency" in workloads:
            print(f"(4) pickup latency, idle worker, {s.latency} jobs {s.latency_interval * 1000:.0f} ms apart{suffix}")
            for lib in libs:
                r.run(lib, "latency", s.latency, interval=s.latency_interval, idle=s.idle)
        if "conveyor" in workloads:
            print(f"(5) Conveyor alone{suffix}")
            r.run("conveyor", "drain", s.drain, label="sqlite_drain", options={"sqlite": True})
            r.run("conveyor", "drain", s.drain, label="mysql_drain", options={"mysql": True})
            r.run("conveyor", "batch", s.batch, label="mysql_batch", options={"mysql": True})
            if not r.args.smoke:
                r.run("conveyor", "drain", s.drain, label="drain_2proc", options={"processes": 2})
                r.run("conveyor", "drain", s.drain, label="drain_sync_def", options={"sync": True})
                # Not the default: the earlier default prefetch of 20 (2 x concurrency; the default is
                # now 40, Celery's reservation for 10 slots), and outcomes that wait for the WAL flush
                # (PostgresBackend(durable_acks=True)).
                r.run("conveyor", "drain", s.drain, label="drain_prefetch20", options={"prefetch": 20})
                r.run("conveyor", "drain", s.drain, label="drain_durable_acks", options={"durable_acks": True})
                r.run(
                    "conveyor", "latency", s.latency, label="latency_durable_acks", interval=s.latency_interval,
                    idle=s.idle, options={"durable_acks": True},
                )  # fmt: skip
        if "raw" in workloads:
            print(f"(6) the database's own limit: acquire + finish SQL in a tight loop{suffix}")
            # Conveyor's drain again, right next to the raw loop, so that both see the same load.
            r.run("conveyor", "drain", s.drain, label="drain_next_to_raw")
            for batch in s.raw_batches:
                r.raw_sql(s.drain, batch)
    if "scale" in workloads:
        scale(r)
    if "rss" in workloads:
        print(f"(5) worker RSS over {s.rss:,} jobs")
        name = r.fresh_db()
        fill_ready(r, name, s.rss)
        r.run(
            "conveyor", "rss", s.rss, db_name=name, rss_at=",".join(map(str, s.rss_at)), prefilled=1,
            timeout=s.timeout * 2,
        )  # fmt: skip
        r.drop_db(name)


def fill_ready(r: Runner, name: str, n: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "bench.fill", "--db", r.url(name), "--ready", str(n)],
        cwd=ROOT, check=True, capture_output=True, timeout=r.sizes.timeout,
    )  # fmt: skip


def vacuum(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM jobs")


def scale(r: Runner) -> None:
    """Drain on empty tables and on big ones (1M scheduled in the same queue, 10M archived),
    alternately, so that both see the same machine load."""
    s = r.sizes
    big = BIG_DB if not r.args.smoke else f"{BIG_DB}_smoke_{os.getpid()}"
    print(f"(5) drain with {s.scheduled:,} scheduled + {s.archived:,} archived rows present")
    if not r.db_exists(big) or r.args.smoke:
        r.admin(f'DROP DATABASE IF EXISTS "{big}" WITH (FORCE)')
        r.admin(f'CREATE DATABASE "{big}"')
        print(f"  generating {big} (once; --keep-big keeps it for the next run) ...", flush=True)
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "bench.fill", "--db", r.url(big), "--scheduled", str(s.scheduled),
             "--archived", str(s.archived)],
            cwd=ROOT, check=True, timeout=3600,
        )  # fmt: skip
        print(f"  generated in {time.monotonic() - t0:.0f}s", flush=True)
    if r.args.smoke:  # the code path only: one drain on the (tiny) big tables
        r.run("conveyor", "drain", s.drain, label="drain_big_tables", db_name=big)
    for _ in range(0 if r.args.smoke else 3):
        r.run("conveyor", "drain", s.drain, label="drain_empty")
        # The empty side gets a fresh database every round; the big one is reused, so give it what
        # autovacuum would have done between rounds (autovacuum may be off, as on our test server).
        vacuum(r.url(big))
        r.run("conveyor", "drain", s.drain, label="drain_big_tables", db_name=big)
    if r.args.smoke or not r.args.keep_big:
        r.admin(f'DROP DATABASE IF EXISTS "{big}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="seconds-long: Conveyor only, tiny N, no installs")
    parser.add_argument("--libs", default=None, help=f"comma list (default: conveyor,{','.join(PEERS)})")
    parser.add_argument(
        "--workloads",
        default="batch,single,drain,latency,conveyor,raw,scale,rss",
        help="comma list of: batch,single,drain,latency,conveyor,raw,scale,rss",
    )
    parser.add_argument("--pg", default=DEFAULT_PG, help="admin URL of the PostgreSQL server (databases are made here)")
    parser.add_argument(
        "--mysql", default=DEFAULT_MYSQL, help="admin URL of the MySQL/MariaDB server (databases are made here)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="run the peer workloads this many times")
    parser.add_argument("--out", type=Path, default=None, help="JSON-lines file (default bench/results/<stamp>.jsonl)")
    parser.add_argument("--no-install", action="store_true", help="never touch the network; peers must be installed")
    parser.add_argument("--keep-big", action="store_true", help="keep the 10M-row database for the next run")
    parser.add_argument("--docs", action="store_true", help="also write the table into docs/benchmarks.md")
    for name in ("batch", "single", "drain", "rss", "scheduled", "archived"):
        parser.add_argument(f"--n-{name}", type=int, default=None)
    args = parser.parse_args()

    sizes = Sizes(**vars(SMOKE)) if args.smoke else Sizes()
    for name in ("batch", "single", "drain", "rss", "scheduled", "archived"):
        value = getattr(args, f"n_{name}")
        if value is not None:
            setattr(sizes, name, value)
    if args.repeats:
        sizes.repeats = args.repeats
    libs = args.libs.split(",") if args.libs else (["conveyor"] if args.smoke else ["conveyor", *PEERS])
    workloads = set(args.workloads.split(","))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or BENCH / "results" / f"{'smoke-' if args.smoke else ''}{stamp}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    work = Path(os.environ.get("BENCH_WORK_DIR") or f"/tmp/conveyor-bench-{os.getpid()}")
    work.mkdir(parents=True, exist_ok=True)

    versions: dict[str, str] = {}
    from importlib.metadata import version

    versions["conveyor"] = version("conveyor")
    if any(lib != "conveyor" for lib in libs):
        versions.update(ensure_peers(offline=args.no_install or args.smoke))
    meta: dict[str, Any] = {
        "figure": "meta",
        "machine": machine(args.pg),
        "versions": versions,
        "command": "python -m bench " + " ".join(sys.argv[1:]),
        "git": git_state(),
        "sizes": {k: v for k, v in vars(sizes).items()},
        "at": time.time(),
    }
    with out.open("a") as f:
        f.write(json.dumps(meta, sort_keys=True) + "\n")
    m = meta["machine"]
    print(f"machine: {m['nproc']} cores, {m['ram_gib']} GiB, PostgreSQL {m['postgres']}, load {m['loadavg_start']}")
    print(f"results: {out}")

    runner = Runner(args, sizes, out, work)
    try:
        plan(runner, libs, workloads)
    finally:
        for name in list(runner.created):
            runner.drop_db(name)
        # The side-channel files can be large (36 MB for the 1M-job RSS run); the worker logs stay.
        for side in work.glob("*.side"):
            side.unlink()
    from bench.report import render

    table = render(out)
    md = out.with_suffix(".md")
    md.write_text(table)
    print()
    print(table)
    if args.docs:
        from bench.report import write_docs

        write_docs(table)
        print("docs/benchmarks.md updated")


if __name__ == "__main__":
    main()
