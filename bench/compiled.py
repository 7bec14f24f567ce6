"""A copy of ``src/`` with the worker's per-job modules compiled by mypyc, for an A/B in the harness.

``.venv/bin/python -m bench.compiled /tmp/compiled`` copies ``src/`` to ``/tmp/compiled/src``, compiles
:data:`MODULES` there (mypyc ships with mypy, a dev dependency; it needs a C compiler and Python's
headers) and prints the directory to put first on ``PYTHONPATH``::

    flock /tmp/conveyor-bench.lock .venv/bin/python -m bench.independent --sections body --libs conveyor \\
        --repeats 3 --variants 'mypyc=PYTHONPATH=/tmp/compiled/src;plain='

It answers one question of issue 13 (would a compiled per-job path close the drain targets?) with a
measurement; Conveyor itself ships pure Python (docs/benchmarks.md, session 28). Not compiled: the
PostgreSQL loop statements (an async context manager is an async generator, which mypyc does not
support) and everything off the per-job path. A compiled class cannot be patched at run time, so
tests that patch the worker's classes do not apply to the copy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from bench._common import ROOT

#: The modules a job passes through between its acquire and its ack.
MODULES = (
    "conveyor/worker/executor.py",
    "conveyor/worker/completer.py",
    "conveyor/worker/fetcher.py",
    "conveyor/worker/_buffer.py",
    "conveyor/worker/_state.py",
    "conveyor/worker/_calls.py",
    "conveyor/backends/postgres/_args.py",
    "conveyor/backends/postgres/_rows.py",
    "conveyor/_job.py",
    "conveyor/_outcomes.py",
    "conveyor/_context.py",
    "conveyor/_message.py",
)


#: Written into a directory this tool built: only such a directory's ``src`` is ever replaced.
MARKER = ".conveyor-compiled"


def build(target: Path) -> Path:
    """Copy src/ into ``target`` and compile :data:`MODULES` there; return the copy's src directory.

    Refuses a ``target`` whose ``src`` exists but that this tool did not build (the repository itself,
    say: ``python -m bench.compiled .`` must not delete the tree it copies)."""
    if target.exists() and not target.is_dir():
        sys.exit(f"{target} is not a directory")
    if target.is_relative_to(ROOT / "src"):
        sys.exit(f"{target} is inside the src/ it would copy: choose a directory outside it")
    src = target / "src"
    if src.exists():
        if not (target / MARKER).is_file():
            sys.exit(f"{target} holds a src/ that bench.compiled did not build: choose an empty or new directory")
        shutil.rmtree(src)
    target.mkdir(parents=True, exist_ok=True)
    (target / MARKER).write_text("built by python -m bench.compiled\n")
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    mypyc = Path(sys.executable).with_name("mypyc")
    done = subprocess.run([str(mypyc), *MODULES], cwd=src, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"mypyc failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    shutil.rmtree(src / "build", ignore_errors=True)
    return src


def main() -> None:
    if len(sys.argv) != 2 or not sys.argv[1].strip():
        sys.exit("usage: python -m bench.compiled DIR")
    print(build(Path(sys.argv[1]).resolve()))


if __name__ == "__main__":
    main()
