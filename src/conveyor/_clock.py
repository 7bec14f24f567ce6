"""The time an app writes and judges rows by: its host's clock, or the database server's where the two
are apart.

Every process compares times other processes wrote: a worker judges leases another worker took, an
acquire takes the jobs whose ``run_at`` a producer set. A host whose clock is off makes those
comparisons wrong for everyone: a worker 5 minutes ahead rescued leases still held (a job ran twice),
a producer 5 minutes ahead wrote jobs no worker would take for 5 minutes, one behind put its jobs
ahead of older ones. So an app reads the database server's clock once (PostgreSQL's
``clock_timestamp()``; SQLite has none but this host's) and, where its host's is more than
:data:`SKEW_LIMIT` off it, keeps the server's time: its host's clock plus the offset, said once in
the log. See docs/decisions.md, "Whose clock"."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from conveyor.backends.base import Backend

log = logging.getLogger("conveyor")

#: Seconds a host's clock may be off the database server's before an app keeps the server's time.
SKEW_LIMIT = 0.5
# A clock that could not be read (the database away) is read again, in the background, this often.
_RETRY_AFTER = 5.0
# A read of the database's clock that took longer than this is read once more.
_PRECISE = timedelta(milliseconds=20)
# How long a sender waits for the first read (see DatabaseClock.measure).
_WAIT = 0.5


def host_now() -> datetime:
    """This host's clock, timezone-aware UTC."""
    return datetime.now(UTC)


class DatabaseClock:
    """``clock()``: the time now, by this host's clock set to the database's (see the module).

    Calling it never reads the database; :meth:`measure` does, once (blocking, bounded: the producer and
    the operator API call :meth:`now`, which measures first; a worker measures when it starts).
    Until then, where the database has no clock of its own and where it could not be read, it is this
    host's clock."""

    def __init__(self, backend: Callable[[], Backend]) -> None:
        self._backend = backend
        self._offset = timedelta(0)
        self._measured = False
        self._next_try = 0.0
        self._lock = threading.Lock()
        self._reading: threading.Thread | None = None

    def __call__(self) -> datetime:
        if not self._measured and self._next_try:
            # The first read failed (the database was away): read again in the background, at most
            # every _RETRY_AFTER, until it succeeds; whoever asks the time meanwhile gets this host's.
            self.measure(wait=0)
        offset = self._offset
        return host_now() + offset if offset else host_now()

    def now(self) -> datetime:
        """The time now, the database's clock read first if it was not yet (blocking, the first time
        only: later reads, after a failed one, go on in the background)."""
        if not self._measured:
            self.measure(wait=0 if self._next_try else _WAIT)
        return host_now() + self._offset

    @property
    def offset(self) -> timedelta:
        """What is added to this host's clock: the database's clock minus it, or zero."""
        return self._offset

    def forked(self) -> None:
        """In a forked child: a read the parent had under way is not running here (its offset is kept)."""
        self._lock = threading.Lock()
        self._reading = None

    def measure(self, wait: float = _WAIT) -> None:
        """Have the database's clock read, until a read succeeds, and wait up to ``wait`` seconds for it.

        The read runs on a thread of its own: a database that is away makes the caller's own statement
        wait for its connection timeout, and this read must not add another (past ``wait`` the caller goes
        on by this host's clock, and the offset applies once the read returns). After a failed read the
        next one starts ``_RETRY_AFTER`` later at the earliest, at the next call of the clock."""
        if self._measured or time.monotonic() < self._next_try:
            return
        with self._lock:
            if self._measured:
                return
            reading = self._reading
            if reading is None:
                reading = self._reading = threading.Thread(target=self._read, name="conveyor-clock", daemon=True)
                reading.start()
        reading.join(wait)

    def _read(self) -> None:
        try:
            backend = self._backend()
            for _ in range(2):
                before = host_now()
                server = backend.database_now()
                after = host_now()
                # Read again when the first read opened a connection: the midpoint of a long call
                # is not when the server read its clock.
                if after - before < _PRECISE:
                    break
        except Exception as exc:  # the callers' own statements meet the same database and say why
            self._next_try = time.monotonic() + _RETRY_AFTER
            self._reading = None
            log.debug("could not read the database's clock: %s", exc)
            return
        if server is not None:
            self._keep(server - (before + (after - before) / 2))
        self._measured = True
        self._reading = None

    def _keep(self, offset: timedelta) -> None:
        seconds = offset.total_seconds()
        if abs(seconds) <= SKEW_LIMIT:
            return
        log.warning(
            "this host's clock is %.1f s %s the database's; Conveyor keeps the database's time here (run NTP)",
            abs(seconds),
            "behind" if seconds > 0 else "ahead of",
        )
        self._offset = offset
