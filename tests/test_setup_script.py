"""A fresh machine (issue 14): the README's set-up path, as a newcomer runs it.

``.ci/run`` runs the README's quick start on a clean clone (the demo, then the tests); these cheap tests
keep it and the install stamp honest without a network or a second virtualenv."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
# Records what _setup.sh asks of the virtualenv's python instead of installing anything.
echo "$*" >> "$(dirname "$0")/../../calls.log"
"""


def _project(tmp_path: Path) -> Path:
    """A copy of the set-up script next to a pyproject.toml, with a fake .venv/bin/python."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_setup.sh", tmp_path / "scripts" / "_setup.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    old = time.time() - 3600
    os.utime(tmp_path / "pyproject.toml", (old, old))
    return tmp_path


def _setup(project: Path, extras: str | None) -> list[str]:
    """Source _setup.sh as demo.sh (no extras given) or test.sh do; return the installs it ran."""
    log = project / "calls.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_EXTRAS"}
    if extras is not None:
        env["CONVEYOR_EXTRAS"] = extras
    done = subprocess.run(
        ["bash", "-c", "source scripts/_setup.sh"], cwd=project, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return [c.split()[-1] for c in calls if " install " in f" {c} " and "-e" in c.split()]


def test_the_install_stamp_depends_on_the_extras(tmp_path: Path) -> None:
    """demo.sh then test.sh on a fresh clone: the second must install the test extras (it did not:
    one stamp stood for any set of extras, and the tests failed with "No module named 'pyspark'")."""
    project = _project(tmp_path)
    assert _setup(project, None) == [".[dev]"]  # demo.sh
    assert _setup(project, "dev,pipeline") == [".[dev,pipeline]"]  # test.sh
    assert _setup(project, "dev,pipeline") == []  # test.sh again: installed
    assert _setup(project, None) == []  # demo.sh again
    future = time.time() + 3600
    os.utime(project / "pyproject.toml", (future, future))
    assert _setup(project, "dev,pipeline") == [".[dev,pipeline]"]  # the dependencies changed


def test_ci_runs_the_readme_quick_start_in_order() -> None:
    """.ci/run must run what the README tells a newcomer to run, in the same order."""
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in quick_start.splitlines() if line.strip()]
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    ran = [next(i for i, line in enumerate(ci) if re.match(re.escape(c) + r"(\s|$)", line)) for c in commands]
    assert ran == sorted(ran), ci
