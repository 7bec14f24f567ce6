"""A clock that says what a test tells it (the loops take ``clock`` so that tests need not sleep)."""

from __future__ import annotations

from datetime import datetime


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now
