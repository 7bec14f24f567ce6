"""What every driver shares: the side channel, the worker process, timing and result lines.

Standard library only: this module is imported both by Conveyor's driver (the project's venv) and
by the peers' drivers (bench/.venv-peers), so it must not import conveyor nor any peer.

The side channel
----------------
Every library's handler does the same thing, :func:`record`: it appends one fixed-width line
``"<sent> <started>\\n"`` (two ``time.time()`` stamps, 36 bytes) to the file named by
``$BENCH_SIDE_FILE``, opened with ``O_APPEND`` (an append of a few bytes is atomic on Linux, also
across processes). ``sent`` is the producer's stamp from the payload (0 when it does not matter),
``started`` is when the handler ran. A driver counts completions as ``file size / 36``, and the
drain's last completion is the largest ``started`` stamp: no library is asked how many jobs it did.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RECORD = 36
ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"

_fd: int | None = None
_fd_pid = 0


def record(sent: float = 0.0) -> None:
    """The side channel: the one thing every handler does (see the module docstring)."""
    global _fd, _fd_pid
    if _fd is None or _fd_pid != os.getpid():
        _fd = os.open(os.environ["BENCH_SIDE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = os.getpid()
    os.write(_fd, b"%017.6f %017.6f\n" % (sent, time.time()))


# The job body of the I/O-bound figures (``BENCH_BODY=redis``): one ``INCR`` on the local Redis,
# with the async client in ``async def`` handlers and the sync client in plain ``def`` ones, so
# that every library's handler waits for one network round trip as most real handlers do. The
# default (``noop``) does nothing. redis-py is imported only when the body is used.
BODY_REDIS = os.environ.get("BENCH_BODY_REDIS", "redis://127.0.0.1:6379/13")
BODY_KEY = "bench:body"
_sync_client: Any = None
_async_clients: dict[int, Any] = {}


def body_is_redis() -> bool:
    return os.environ.get("BENCH_BODY", "noop") == "redis"


def body_sync() -> None:
    """The job body for a plain ``def`` handler (thread-safe: redis-py's pool hands each thread
    its own connection)."""
    global _sync_client
    if not body_is_redis():
        return
    if _sync_client is None:
        import redis

        _sync_client = redis.Redis.from_url(BODY_REDIS)
    _sync_client.incr(BODY_KEY)


async def body_async() -> None:
    """The job body for an ``async def`` handler: one client per event loop."""
    if not body_is_redis():
        return
    import asyncio

    loop = id(asyncio.get_running_loop())
    client = _async_clients.get(loop)
    if client is None:
        import redis.asyncio

        client = _async_clients[loop] = redis.asyncio.Redis.from_url(BODY_REDIS)
    await client.incr(BODY_KEY)


def side_count(path: Path) -> int:
    try:
        return path.stat().st_size // RECORD
    except FileNotFoundError:
        return 0


def side_rows(path: Path) -> list[tuple[float, float]]:
    rows = []
    for line in path.read_bytes().splitlines():
        sent, started = line.split()
        rows.append((float(sent), float(started)))
    return rows


def wait_count(path: Path, n: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    """Poll the side channel until ``n`` completions (True) or timeout / the worker died (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if side_count(path) >= n:
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def start_worker(argv: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a worker in its own process group (so that stopping it stops its children too)."""
    out = log.open("ab")
    return subprocess.Popen(list(argv), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_worker(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the worker's process group, then SIGKILL it if it is still there after ``grace``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def drain_result(path: Path, n: int, spawned_at: float, ok: bool) -> dict[str, Any]:
    """The drain figures from the side channel: jobs/s from the first handler start to the last
    completion (``rate``), and from the worker's spawn to the last completion (``rate_spawn``)."""
    rows = side_rows(path) if path.exists() else []
    if not rows:
        return {"ok": False, "n": n, "done": 0}
    starts = [r[1] for r in rows]
    first, last = min(starts), max(starts)
    done = len(rows)
    return {
        "ok": ok and done >= n,
        "n": n,
        "done": done,
        "seconds": round(last - first, 4),
        "rate": round((done - 1) / (last - first), 1) if last > first else None,
        "seconds_spawn": round(last - spawned_at, 4),
        "rate_spawn": round(done / (last - spawned_at), 1) if last > spawned_at else None,
    }


def latency_result(path: Path, n: int, ok: bool) -> dict[str, Any]:
    """Enqueue-to-start latency from the side channel, in milliseconds."""
    rows = side_rows(path) if path.exists() else []
    lat = sorted((started - sent) * 1000 for sent, started in rows if sent > 0)
    if not lat:
        return {"ok": False, "n": n, "done": 0}
    return {
        "ok": ok and len(lat) >= n,
        "n": n,
        "done": len(lat),
        "p50_ms": round(percentile(lat, 50), 3),
        "p99_ms": round(percentile(lat, 99), 3),
        "max_ms": round(lat[-1], 3),
        "mean_ms": round(statistics.fmean(lat), 3),
    }


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(pct / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paced_sends(send: Callable[[float], None], n: int, interval: float) -> None:
    """Send ``n`` jobs ``interval`` seconds apart (on a fixed grid, so a slow send does not shift
    the rest); ``send`` receives the stamp to put in the payload, taken right before the call."""
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(time.time())


def emit(result: dict[str, Any]) -> None:
    """A driver's answer: one JSON line on stdout, prefixed so that library noise cannot be mistaken for it."""
    sys.stdout.write("BENCH-RESULT " + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def worker_env(side_file: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["BENCH_SIDE_FILE"] = str(side_file)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def vmrss_kib(pid: int) -> int | None:
    """The resident set of a process (VmRSS in /proc/PID/status), in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


_SWITCHES = ("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")


def context_switches(pids: list[int]) -> int:
    """Voluntary + involuntary context switches of live processes, all their threads (a thread that
    ended took its count with it)."""
    total = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                lines = status.read_text().splitlines()
            except (FileNotFoundError, ProcessLookupError):
                continue
            total += sum(int(line.split()[1]) for line in lines if line.startswith(_SWITCHES))
    return total


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of live processes, in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")
