"""The faces are presenters: nothing in the CLI or the HTTP service imports the storage seam."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("face", ["cli", "http"])
def test_no_face_imports_the_storage_seam(face: str) -> None:
    files = sorted((SRC / face).rglob("*.py"))
    assert files
    offenders = {
        str(f.relative_to(SRC)): sorted(m for m in _imports(f) if m.startswith(("conveyor.backends", "conveyor._sql")))
        for f in files
    }
    assert {f: m for f, m in offenders.items() if m} == {}
