"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from ._support import Procs


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    """Starts real subprocesses; kills any left running at teardown and shows their output on failure."""
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.cleanup()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(p.outputs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep
