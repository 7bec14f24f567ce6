"""Benchmark: the whole `pipeline report` on synthetic archives of 1M and 10M jobs, with peak memory.

Each size is generated once with numpy/pyarrow (cached under --data-dir), then the report runs as
a separate process, exactly as a user runs it (`python -m conveyor.pipeline report ...`), so the
wall time includes starting Spark. Peak memory is the largest sum of RSS over the report's process
tree (the Python driver, the JVM, any Python workers), sampled from /proc every 100 ms. Prints one
JSON line per size.

    .venv/bin/python bench/pipeline/bench_report.py --rows 1000000 --rows 10000000

Wrap timed runs in `flock /tmp/conveyor-bench.lock ...` on a shared machine. Each size also runs the floor
(floor.py: one Spark pass reading the report's columns, one grouped count) for the ratio; docs/pipeline.md
has the figures (1M, 10M, 100M: wall, floor, peak memory, CPU, per stage) and what mattered. Targets
(issue 12): report <= 3x the floor at 10M; fixed cost < 1/3 of the 1M time; 100M within 3 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth import generate

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


TICK = os.sysconf("SC_CLK_TCK")


def tree_rss(root: int, cpu: dict[int, float] | None = None) -> int:
    """Resident bytes of ``root`` and all its descendants; with ``cpu``, also note each one's CPU
    seconds so far (user + system, from /proc/PID/stat)."""
    tree = _children()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
            if cpu is not None:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                cpu[pid] = max(cpu.get(pid, 0.0), (int(fields[11]) + int(fields[12])) / TICK)
        except OSError:
            pass
        stack.extend(tree.get(pid, []))
    return total


def _sampled(cmd: list[str], env: dict[str, str]) -> tuple[int, str, str, float, int, float]:
    """Run ``cmd``; return its exit code, stdout, stderr, wall seconds, peak tree RSS (bytes) and CPU seconds."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    cpu: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(proc.pid, cpu))
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.monotonic() - start
    done.set()
    sampler.join()
    # CPU seconds of the whole tree as last sampled (each process's last 100 ms may be missed):
    # far less disturbed than wall time by other work on a shared machine.
    return proc.returncode, out, err, wall, peak, sum(cpu.values())


_STAGE = re.compile(r"^✓ (.+?) ([0-9.]+)s$")


def run_floor(input_dir: Path, master: str, driver_memory: str) -> dict[str, float]:
    """The floor: one Spark pass reading the report's columns with one grouped count (floor.py)."""
    env = dict(os.environ, CONVEYOR_SPARK_DRIVER_MEMORY=driver_memory)
    cmd = [sys.executable, str(Path(__file__).with_name("floor.py")), "--input", str(input_dir), "--master", master]
    code, out, err, wall, peak, cpu = _sampled(cmd, env)
    if code != 0:
        raise SystemExit(f"floor failed ({code}):\n{err}")
    result = json.loads(out.strip().splitlines()[-1])
    return {
        "floor_wall_s": round(wall, 1),
        "floor_scan_s": result["scan_s"],
        "floor_cpu_s": round(cpu, 1),
        "floor_peak_rss_mib": round(peak / 2**20),
    }


def run_report(input_dir: Path, out_dir: Path, master: str, driver_memory: str) -> dict[str, object]:
    env = dict(os.environ, CONVEYOR_SPARK_DRIVER_MEMORY=driver_memory, COLUMNS="200")
    cmd = [sys.executable, "-m", "conveyor.pipeline", "report", "--input", str(input_dir), "--out", str(out_dir)]
    cmd += ["--master", master]
    code, _, err, wall, peak, cpu = _sampled(cmd, env)
    # The stage lines (with their times) are kept beside the report for a closer look.
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "stderr.log").write_text(err)
    if code != 0:
        raise SystemExit(f"report failed ({code}):\n{err}")
    summary = json.loads((out_dir / "summary.json").read_text())
    stages = {m.group(1): float(m.group(2)) for m in map(_STAGE.match, err.splitlines()) if m}
    return {
        "wall_s": round(wall, 1),
        "report_s": summary["elapsed_s"],
        # Everything before the report's first stage: Python start, imports, Spark start.
        "fixed_s": round(wall - summary["elapsed_s"], 1),
        "peak_rss_mib": round(peak / 2**20),
        "cpu_s": round(cpu, 1),
        "stages": stages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", help="archive size (repeatable)")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "conveyor-bench")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="1600m")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor pass")
    args = parser.parse_args()
    for rows in args.rows or [1_000_000, 10_000_000]:
        data = args.data_dir / f"archive-{rows}"
        t0 = time.monotonic()
        generate(rows, data)
        gen_s = time.monotonic() - t0
        floor = {} if args.no_floor else run_floor(data, args.master, args.driver_memory)
        result = run_report(data, args.data_dir / f"report-{rows}", args.master, args.driver_memory)
        line: dict[str, object] = {"rows": rows, "master": args.master, "driver_memory": args.driver_memory}
        line.update(result)
        line.update(floor)
        if floor:
            line["x_floor"] = round(float(result["wall_s"]) / floor["floor_wall_s"], 2)  # type: ignore[arg-type]
            line["x_floor_cpu"] = round(float(result["cpu_s"]) / floor["floor_cpu_s"], 2)  # type: ignore[arg-type]
        line["generate_s"] = round(gen_s, 1)
        line["cpus"] = os.cpu_count()
        line["load_avg_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
