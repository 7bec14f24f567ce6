"""The named statements shipped with each backend, as conveyor.backends._sql loads them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conveyor.backends._sql import load_queries


def test_whole_line_comments_are_left_out_of_the_statements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A placeholder spelled in a comment (say, explaining a parameter) must not reach the driver,
    # which would ask for it as a parameter of the statement (psycopg did, session 22).
    package = tmp_path / "conveyor_sql_probe"
    (package / "sql").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sql" / "queries.sql").write_text(
        "-- The file's own header.\n"
        "-- name: first\n"
        "-- Takes %(limit)s rows; ? marks nothing here either.\n"
        "SELECT *\n"
        "    -- an indented comment with %(other)s\n"
        "FROM t WHERE n < %(limit)s  -- a trailing comment stays\n"
        "\n"
        "-- name: second\n"
        "SELECT '--not a comment', 1\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        queries = load_queries("conveyor_sql_probe")
    finally:
        sys.modules.pop("conveyor_sql_probe", None)
    assert queries == {
        "first": "SELECT *\nFROM t WHERE n < %(limit)s  -- a trailing comment stays",
        "second": "SELECT '--not a comment', 1",
    }


@pytest.mark.parametrize("package", ["conveyor.backends.postgres", "conveyor.backends.sqlite"])
def test_every_shipped_statement_has_code(package: str) -> None:
    queries = load_queries(package)
    assert len(queries) > 40
    empty = [name for name, text in queries.items() if not text.strip()]
    assert not empty, empty
