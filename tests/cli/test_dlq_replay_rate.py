"""`conveyor dlq replay --rate`: the operator API's rule (a finite 0.01 to 1,000,000 jobs per second), one line and
a non-zero exit otherwise."""

from __future__ import annotations

import pytest
from tests.conftest import make_dead_letters

from conveyor import App
from conveyor.cli import main


@pytest.mark.parametrize("rate", ["nan", "inf", "-1", "0", "1e-6", "0.009", "1e7"])
def test_a_rate_out_of_range_is_one_line_and_exit_2(
    sqlite_url: str, rate: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = make_dead_letters(sqlite_url)[0]
    code = main(["--db", sqlite_url, "dlq", "replay", dead, "--reason", "r", f"--rate={rate}"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("conveyor: error: ") and "--rate" in lines[0], err
    with App(sqlite_url) as app:
        assert app.job(dead).replayed_by is None


def test_the_slowest_rate_is_accepted(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    dead = make_dead_letters(sqlite_url)[0]
    # One job: no wait between chunks, however slow the rate.
    assert main(["--db", sqlite_url, "dlq", "replay", dead, "--reason", "r", "--rate", "0.01"]) == 0
    assert "replayed 1 of 1" in capsys.readouterr().out
