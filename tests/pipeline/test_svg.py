"""The inline-SVG chart helper: valid, self-contained markup with the data in it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from conveyor.pipeline._html import table_html
from conveyor.pipeline._svg import bar_chart, line_chart, nice_ticks

T = datetime(2026, 1, 1, tzinfo=UTC)


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0, 0.37) == [0, 0.1, 0.2, 0.3, 0.4]
    assert nice_ticks(0, 1234)[-1] >= 1234


def test_line_chart_is_well_formed_svg_with_one_line_per_series() -> None:
    svg = line_chart("Depth <q>", {"a": [(T, 1), (T + timedelta(minutes=1), 3)], "b": [(T, 2)]}, "jobs", step=True)
    root = ET.fromstring(svg)
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 2
    # A step line has an extra corner point per step.
    assert len(lines[0].get("points", "").split()) == 3
    assert "Depth &lt;q&gt;" in svg


def test_bar_chart_skips_missing_values_and_handles_no_data() -> None:
    svg = bar_chart("p95", ["q1", "q2"], {"p50": [1.0, None], "p95": [2.0, 3.0]})
    assert len(ET.fromstring(svg).findall("{http://www.w3.org/2000/svg}rect")) == 3 + 2  # bars + legend
    assert "no data" in bar_chart("empty", [], {})
    assert "no data" in line_chart("empty", {})


def test_table_html_escapes_and_truncates() -> None:
    html = table_html([{"q": "<b>", "n": 1.5}] * 3, ["q", "n"], limit=2)
    assert "&lt;b&gt;" in html and html.count("<tr>") == 3 and "1 more rows" in html
