"""Cron expressions: what the parser refuses, and the next tick wherever it lies in datetime's range."""

from __future__ import annotations

import calendar
import itertools
import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from conveyor import ConfigurationError
from conveyor._cron import Cron

BAD_FIELDS = [
    ("*/ * * * *", "minute", "'*/'"),  # an empty step was taken as a step of 1
    ("0-59/ * * * *", "minute", "'0-59/'"),
    ("1_0 * * * *", "minute", "'1_0'"),  # int() takes these four; a field is ASCII digits
    ("+5 * * * *", "minute", "'+5'"),
    ("\u0665 * * * *", "minute", "'\u0665'"),
    ("0 1-+5 * * *", "hour", "'1-+5'"),
    ("0 0 */\u0662 * *", "day of month", "'*/\u0662'"),
    ("0 0 * 1_2 *", "month", "'1_2'"),
    ("0 0 * * +1", "day of week", "'+1'"),
]


@pytest.mark.parametrize(("expression", "field", "shown"), BAD_FIELDS, ids=[e for e, _, _ in BAD_FIELDS])
def test_a_field_that_is_not_ascii_digits_names_or_a_full_step_is_refused(
    expression: str, field: str, shown: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(f"bad {field} field {shown}")) as raised:
        Cron.parse(expression)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("value", "kind"), [(None, "NoneType"), (5, "int"), (b"* * * * *", "bytes")])
def test_an_expression_that_is_not_a_string_is_refused_in_one_line(value: Any, kind: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^a cron expression must be a string, got {kind}$"):
        Cron.parse(value)


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30,31 2 *", "0 0 31 4,6,9,11 *", "0 0 30-31 2 *"])
def test_an_expression_that_never_fires_is_refused_when_parsed(expression: str) -> None:
    with pytest.raises(ConfigurationError, match="never fires: no month it names has a day it names"):
        Cron.parse(expression)


def test_29_february_is_found_across_a_century_year_that_is_not_leap() -> None:
    """After 29 February 2096 the next is 2104 (2100 is not a leap year): the old 5-year search said
    "never fires" from March 2096 to the end of 2099."""
    feb29 = Cron.parse("0 0 29 2 *")
    expected = datetime(2104, 2, 29, tzinfo=UTC)
    for start in [datetime(2096, 2, 29, 0, 0, 1), datetime(2096, 3, 1), datetime(2099, 12, 31, 23, 59)]:
        assert feb29.next_after(start.replace(tzinfo=UTC)) == expected
    # With the day of week restricted too, a day matching either one fires (classic cron): here a
    # Monday in February, though no February has a 31st.
    assert Cron.parse("0 0 31 2 1").next_after(datetime(2096, 3, 1, tzinfo=UTC)) == datetime(2097, 2, 4, tzinfo=UTC)


def test_every_day_of_the_year_is_found_from_just_after_its_last_tick() -> None:
    """The search's horizon holds the longest gap between two of any day: each (month, day), from the
    minute after its tick in the year before its longest gap in the 400-year Gregorian cycle."""
    for month in range(1, 13):
        for day in range(1, calendar.monthrange(2000, month)[1] + 1):
            cron = Cron.parse(f"0 0 {day} {month} *")
            years = [y for y in range(2000, 2400) if day <= calendar.monthrange(y, month)[1]]
            gap, year = max(((date(b, month, day) - date(a, month, day)).days, a) for a, b in itertools.pairwise(years))
            after = datetime(year, month, day, tzinfo=UTC)
            assert cron.next_after(after) == after + timedelta(days=gap), (month, day)


def test_no_tick_before_the_year_10000_is_a_configuration_error_not_an_overflow() -> None:
    with pytest.raises(
        ConfigurationError, match=re.escape("has no tick after 9999-06-01T00:00:00+00:00 before the year 10000")
    ):
        Cron.parse("0 0 1 1 *").next_after(datetime(9999, 6, 1, tzinfo=UTC))
    every_minute = Cron.parse("* * * * *")
    assert every_minute.next_after(datetime(9999, 12, 31, 23, 58, 30, tzinfo=UTC)) == datetime(
        9999, 12, 31, 23, 59, tzinfo=UTC
    )
    with pytest.raises(ConfigurationError, match="before the year 10000"):
        every_minute.next_after(datetime(9999, 12, 31, 23, 59, 30, tzinfo=UTC))


@pytest.mark.parametrize("space", ["\u00a0", "\u2003", "\u3000"])
def test_fields_are_apart_by_spaces_and_tabs_only(space: str) -> None:
    # str.split() took a no-break or an em space (pasted from a document) for a separator; crond does not.
    with pytest.raises(ConfigurationError):
        Cron.parse(f"0{space}* * * *")
    assert Cron.parse(" 0\t*  * * *\n").minutes == frozenset({0})


@pytest.mark.parametrize(
    ("expression", "first_ticks"),
    [
        # A day field starting with "*" is unrestricted, as in Vixie cron and cronie: the other day
        # field alone decides (28 November 2026 is a Saturday). "*/1" fired every day.
        ("0 0 */1 * mon", ["2026-11-30", "2026-12-07"]),
        ("0 0 13 * */1", ["2026-12-13", "2027-01-13"]),
        # Starting with "*" but restricting: both fields must match (odd days that are Mondays).
        ("0 0 */2 * mon", ["2026-12-07", "2026-12-21"]),
        # Neither starts with "*": either field matches.
        ("0 0 1 * mon", ["2026-11-30", "2026-12-01"]),
    ],
)
def test_a_day_field_starting_with_a_star_is_unrestricted_as_in_cron(expression: str, first_ticks: list[str]) -> None:
    cron = Cron.parse(expression)
    tick = datetime(2026, 11, 28, 1, 46, tzinfo=UTC)
    ticks = []
    for _ in first_ticks:
        tick = cron.next_after(tick)
        ticks.append(tick.date().isoformat())
    assert ticks == first_ticks


def test_29_february_that_is_a_sunday_is_found_40_years_on() -> None:
    """ANDed with "*/7" (Sundays), 29 February can be 40 years away (2088, then 2128: 2100 is not a
    leap year), past the old 8-year horizon, which said "never fires"."""
    sunday_feb29 = Cron.parse("0 0 29 2 */7")
    assert sunday_feb29.next_after(datetime(2088, 3, 1, tzinfo=UTC)) == datetime(2128, 2, 29, tzinfo=UTC)
    # A list does not start with "*": either field matches, as before (6 February 2089 is a Sunday).
    assert Cron.parse("0 0 29 2 1,*/7").next_after(datetime(2088, 3, 1, tzinfo=UTC)) == datetime(2089, 2, 6, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("@reboot", "cron expression '@reboot' is not supported (a schedule's ticks are times, not worker starts)"),
        ("@every 1m", "cron expression '@every 1m' is not supported: the aliases are @yearly, @annually, @monthly"),
        (
            "0 0 * * fri-sun",
            "day of week range 'fri-sun' runs backwards: ranges do not wrap around, as in cron; "
            "write 'fri,sat,sun' or '5-7'",
        ),
        (
            "0 22-2 * * *",
            "hour range '22-2' runs backwards: ranges do not wrap around, as in cron; "
            "write '22,23,0,1,2' or '22-23,0-2'",
        ),
        ("0 0 * nov-feb *", "write 'nov,dec,jan,feb' or '11-12,1-2'"),
    ],
)
def test_an_unsupported_alias_or_a_wrapping_range_is_refused_saying_why(expression: str, message: str) -> None:
    """ "@reboot" was refused as "must have 5 fields, got 1", "fri-sun" as a bad field with no reason."""
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Cron.parse(expression)
    assert Cron.parse("0 0 * * 5-7").weekdays == frozenset({5, 6, 0})


def test_the_latest_tick_between_two_times() -> None:
    every_five = Cron.parse("*/5 * * * *")
    now = datetime(2026, 11, 28, 1, 46, 30, tzinfo=UTC)
    assert every_five.latest_between(now - timedelta(days=1), now) == datetime(2026, 11, 28, 1, 45, tzinfo=UTC)
    assert every_five.latest_between(datetime(2026, 11, 28, 1, 45, tzinfo=UTC), now) == datetime(
        2026, 11, 28, 1, 45, tzinfo=UTC
    )
    assert every_five.latest_between(datetime(2026, 11, 28, 1, 45, 1, tzinfo=UTC), now) is None
    feb29 = Cron.parse("0 0 29 2 *")
    assert feb29.latest_between(datetime(2020, 1, 1, tzinfo=UTC), now) == datetime(2024, 2, 29, tzinfo=UTC)
    assert feb29.latest_between(datetime(2024, 3, 1, tzinfo=UTC), now) is None


@pytest.mark.parametrize(
    "expression",
    [
        "1" + ",1" * 50_000 + " * * * *",  # valid, 100 KB: parsed in 70 ms at every fire
        "* " * 50_000,  # 50,000 fields
        "x" * 100_000,
        "0" * 100_000 + "1-0 * * * *",  # a backwards range whose item is 100 KB
        "0 0 1 1 " + ",".join(["mon"] * 300),
    ],
    ids=["valid", "fields", "garbage", "range", "names"],
)
def test_an_expression_past_1000_characters_is_refused_in_one_short_line(expression: str) -> None:
    # Before: the first was accepted (and a worker parsed it at every fire, on its event loop: 10 MB
    # held it for seconds); the others were refused quoting all 100 KB in the message.
    with pytest.raises(ConfigurationError, match=r"characters long, over the 1,000-character limit") as raised:
        Cron.parse(expression)
    message = str(raised.value)
    assert len(message) < 250 and "\n" not in message, message
    # At the limit an expression is still parsed.
    at_limit = "0," * 495 + "0 * * * * "
    assert len(at_limit) == 1000 and Cron.parse(at_limit).minutes == frozenset({0})


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("*/90 * * * *", "minute step '*/90' is longer than an hour (60 minutes): it would fire once an hour"),
        ("5/70 * * * *", "minute step '5/70' is longer than an hour (60 minutes)"),
        ("0 */25 * * *", "hour step '*/25' is longer than a day (24 hours): it would fire once a day"),
        ("0 0 */45 * *", "day of month step '*/45' is longer than a month (31 days)"),
        ("0 0 1 */13 *", "month step '*/13' is longer than a year (12 months)"),
        ("0 0 * * */8", "day of week step '*/8' is longer than a week (7 days)"),
    ],
)
def test_a_step_longer_than_its_fields_cycle_is_refused_saying_why(expression: str, message: str) -> None:
    # Before: "*/90 * * * *" was taken as cron takes it, minute 0 only: a schedule meant for every 90 minutes
    # fired hourly, and nothing said so.
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Cron.parse(expression)
    assert Cron.parse(expression, stored=True).next_after(datetime(2026, 1, 1, tzinfo=UTC)) is not None


def test_a_step_of_a_whole_cycle_is_the_cycle() -> None:
    assert Cron.parse("*/60 * * * *").minutes == frozenset({0})
    assert Cron.parse("0 */24 * * *").hours == frozenset({0})
    assert Cron.parse("0 0 * * */7").weekdays == frozenset({0})
    assert Cron.parse("*/90 * * * *", stored=True).minutes == frozenset({0})
