"""The end-to-end tests' own helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ._support import Procs, wait_until

# A process that starts a child of its own (in its process group) and exits at once, leaving it behind.
LEAVES_A_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(child.pid))
"""


def _gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (exited, or a zombie that its new parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_cleanup_kills_what_a_process_left_behind_after_it_exited(tmp_path: Path) -> None:
    # Before: cleanup signalled only processes that still ran, so the children of one that had
    # already exited (a supervisor killed by its test, say) were left running after the test.
    procs = Procs(tmp_path)
    pid_file = tmp_path / "child.pid"
    top = procs.start("leaves-a-child", [sys.executable, "-c", LEAVES_A_CHILD, str(pid_file)])
    assert top.wait(timeout=30) == 0
    child = int(pid_file.read_text())
    assert not _gone(child)
    try:
        procs.cleanup()
        wait_until(lambda: _gone(child), 10, f"process {child} to be killed")
    finally:
        if not _gone(child):
            os.kill(child, 9)
