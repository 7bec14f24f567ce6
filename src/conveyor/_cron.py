"""Cron expressions: the five classic fields, evaluated in UTC, to find a schedule's next tick."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from conveyor._errors import ConfigurationError
from conveyor._limits import preview

# What separates the five fields.
_SPACES = " \t"
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NAMES = {
    3: {
        m: i + 1
        for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])
    },
    4: {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
}
_BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
_FIELDS = ["minute", "hour", "day of month", "month", "day of week"]
#: Each field's unit and the cycle it repeats in (for a step longer than the cycle).
_STEP_UNITS = [("minute", "an hour"), ("hour", "a day"), ("day", "a month"), ("month", "a year"), ("day", "a week")]
# The longest expression parse takes. Every value of every field listed one by one is under 400
# characters; a longer one is a mistake, and one of 10 MB held a worker's event loop (its heartbeats
# with it) for seconds at every fire.
MAX_CRON_CHARS = 1000
# How many days ahead next_after looks. The rarest day an expression can name is 29 February that is
# also a given weekday (``0 0 29 2 */7``: a day of week starting with ``*`` is ANDed with the day of
# month, as in cron), and in the Gregorian 400-year cycle that can be 40 years away (29 February
# 2072 is a Monday, the next Monday one is in 2112, 2100 not being a leap year).
_HORIZON_DAYS = 40 * 366 + 1


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression. ``next_after(t)`` is the first tick strictly after ``t``."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_any: bool
    weekdays_any: bool

    @classmethod
    def parse(cls, expression: str, *, stored: bool = False) -> Cron:
        """Parse ``m h dom mon dow`` (``*``, ``a-b``, ``*/n``, ``a-b/n``, lists, names) or an ``@alias``.

        Raises ConfigurationError with the offending field for anything else, for an expression that
        never fires (a day none of its months has, such as ``0 0 31 2 *``), and for a step longer than its
        field's cycle (``*/90`` minutes: cron fires it once an hour). ``stored``: an expression read back
        from the database, which a version before that refusal stored: its long step is taken as cron
        takes it, so that the schedule goes on firing as it did."""
        if not isinstance(expression, str):
            raise ConfigurationError(f"a cron expression must be a string, got {type(expression).__name__}")
        if len(expression) > MAX_CRON_CHARS:
            raise ConfigurationError(
                f"cron expression {_shown(expression)} is {len(expression):,} characters long, "
                f"over the {MAX_CRON_CHARS:,}-character limit"
            )
        stripped = expression.strip(_SPACES + "\r\n")
        if stripped.startswith("@") and stripped.lower() not in _ALIASES:
            # Without this, "@reboot" was refused as "must have 5 fields, got 1".
            why = " (a schedule's ticks are times, not worker starts)" if stripped.lower() == "@reboot" else ""
            raise ConfigurationError(
                f"cron expression {_shown(expression)} is not supported{why}: the aliases are {', '.join(_ALIASES)}"
            )
        text = _ALIASES.get(stripped.lower(), stripped)
        # Fields are apart by spaces and tabs only: str.split() also split at a no-break space or an em
        # space, which a crontab line pasted from a document brings, and crond would not.
        parts = [part for part in re.split(f"[{_SPACES}]+", text) if part]
        if len(parts) != 5:
            raise ConfigurationError(
                f"cron expression {_shown(expression)} must have 5 fields (minute hour day month weekday), "
                f"got {len(parts)}"
            )
        sets = [_field(parts[i], i, expression, stored) for i in range(5)]
        weekdays = frozenset(d % 7 for d in sets[4])
        # As in Vixie cron and cronie, a day field that starts with "*" ("*", "*/2") counts as
        # unrestricted: "0 0 */1 * mon" fires on Mondays only, not every day.
        days_any, weekdays_any = parts[2].startswith("*"), parts[4].startswith("*")
        # Only a day of month restricted alone can rule out every day: a restricted day of week
        # matches in every month, and with both restricted a day matching either one fires.
        # February counts 29 days, which it has in leap years.
        if weekdays_any and not days_any and not any(d <= _month_days(m) for m in sets[3] for d in sets[2]):
            raise ConfigurationError(
                f"cron expression {_shown(expression)} never fires: no month it names has a day it names"
            )
        return cls(expression, sets[0], sets[1], sets[2], sets[3], weekdays, days_any, weekdays_any)

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        # Classic cron: when both day fields are restricted, a day matching either one fires.
        if self.days_any or self.weekdays_any:
            return dom and dow
        return dom or dow

    def next_after(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (an aware datetime; ticks are whole minutes, UTC).

        Raises ConfigurationError when there is no tick before the year 10000 (datetime's last)."""
        try:
            start = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
            day = start.replace(hour=0, minute=0)
            for _ in range(_HORIZON_DAYS):
                if self._day_matches(day):
                    for hour in sorted(self.hours):
                        for minute in sorted(self.minutes):
                            tick = day.replace(hour=hour, minute=minute)
                            if tick >= start:
                                return tick
                day += timedelta(days=1)
        except OverflowError:
            raise ConfigurationError(
                f"cron expression {_shown(self.expression)} has no tick after {after.isoformat()} before the year 10000"
            ) from None
        # Unreachable for an expression parse accepted (see _HORIZON_DAYS); kept as a guard.
        raise ConfigurationError(f"cron expression {_shown(self.expression)} never fires")

    def latest_between(self, earliest: datetime, at: datetime) -> datetime | None:
        """The last tick at or before ``at`` and not before ``earliest`` (aware datetimes), or None.

        A scheduler back after downtime fires this one tick for all those it missed."""
        end = at.replace(second=0, microsecond=0)
        day = end.replace(hour=0, minute=0)
        while True:
            if self._day_matches(day):
                for hour in sorted(self.hours, reverse=True):
                    for minute in sorted(self.minutes, reverse=True):
                        tick = day.replace(hour=hour, minute=minute)
                        if tick <= end:
                            return tick if tick >= earliest else None
            # Stop at the day holding earliest: every tick before it is too early.
            if day <= earliest:
                return None
            day -= timedelta(days=1)


def _field(text: str, index: int, expression: str, stored: bool = False) -> frozenset[int]:
    low, high = _BOUNDS[index]
    values: set[int] = set()
    for item in text.lower().split(","):
        try:
            values.update(_item(item, index, low, high, stored))
        except _Explained as exc:
            raise ConfigurationError(f"cron expression {_shown(expression)}: {_FIELDS[index]} {exc}") from None
        except ValueError:
            raise ConfigurationError(
                f"cron expression {_shown(expression)}: bad {_FIELDS[index]} field {_shown(text)} "
                f"(allowed {low}-{high}, '*', ranges a-b, steps */n, lists a,b)"
            ) from None
    return frozenset(values)


class _Explained(ValueError):
    """An item refused with a reason: a range whose start is after its end (``fri-sun``, ``22-2``), a step
    longer than its field's cycle (``*/90`` minutes); the text says what to write."""


def _item(item: str, index: int, low: int, high: int, stored: bool = False) -> range:
    body, slash, step_text = item.partition("/")
    step = _number(step_text) if slash else 1
    if step < 1:
        raise ValueError(item)
    cycle = 7 if index == 4 else high - low + 1
    if step > cycle and not stored:
        # Cron takes it and fires at the range's first value only, once a cycle: "*/90" minutes ran hourly.
        unit, period = _STEP_UNITS[index]
        raise _Explained(
            f"step {_shown(item)} is longer than {period} ({cycle} {unit}s): it would fire once {period}, not "
            f"every {step} {unit}s, which cron cannot express; list the values instead"
        )
    if body == "*":
        first, last = low, high
    elif "-" in body:
        a, b = body.split("-", 1)
        first, last = _value(a, index), _value(b, index)
    else:
        first = _value(body, index)
        last = high if step_text else first
    if low <= last < first <= high:
        raise _Explained(_wrap_hint(item, index, first, last, low, high))
    if not (low <= first <= last <= high):
        raise ValueError(item)
    return range(first, last + 1, step)


def _wrap_hint(item: str, index: int, first: int, last: int, low: int, high: int) -> str:
    # Cron refuses a range that wraps around too; the message says so and what to write instead.
    if "/" in item:
        return f"range {_shown(item)} runs backwards: ranges do not wrap around, split it into two ranges"
    if index == 4:  # day of week: 7 is Sunday as well as 0, so a range that ends on Sunday can end at 7
        high = 6
    wrapped = [*range(first, high + 1), *range(low, last + 1)]
    names = {number: name for name, number in _NAMES.get(index, {}).items()}
    listed = ",".join(names.get(v, str(v)) for v in wrapped) if len(wrapped) <= 12 else None
    if index == 4:
        ranges = f"{first}-7" + (f",{_span(1, last)}" if last else "")
    else:
        ranges = f"{_span(first, high)},{_span(low, last)}"
    instead = f"{listed!r} or {ranges!r}" if listed else repr(ranges)
    return f"range {_shown(item)} runs backwards: ranges do not wrap around, as in cron; write {instead}"


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _value(text: str, index: int) -> int:
    names = _NAMES.get(index, {})
    return names[text] if text in names else _number(text)


def _shown(text: str) -> str:
    # An expression is quoted in its errors, cut as names are: one of 100 KB made a 100 KB message (and
    # log line, and CLI line).
    return preview(text, 100)


def _number(text: str) -> int:
    # int() also takes "+5", " 5", "1_0" and the digits of other scripts (an Arabic-Indic 5, say):
    # a number in a field is ASCII digits only.
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def _month_days(month: int) -> int:
    """The most days ``month`` has in any year (29 for February)."""
    return calendar.monthrange(2000, month)[1]
