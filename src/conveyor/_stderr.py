"""The log handler of Conveyor's own processes (``conveyor ...`` and its worker processes): standard error,
never raising into the code that logs.

Python's ``StreamHandler`` reports a failed write by writing to ``sys.stderr`` again, and a closed
``sys.stderr`` (a handler's ``sys.stderr.close()``) made that raise ``ValueError`` out of every log call: the
worker's loops ended on their own log lines, and a ``--burst`` worker, whose last line failed, never stopped.
A record the stream refuses goes to file descriptor 2 instead, and is dropped only if that fails too."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import TextIO


class StderrHandler(logging.StreamHandler[TextIO]):
    """Writes records to ``sys.stderr`` as it was when created (a handler's ``redirect_stderr`` does not take
    the worker's lines); falls back to file descriptor 2; never raises."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:  # a record whose arguments do not fit its message: Python's report, if it can
            with contextlib.suppress(Exception):
                self.handleError(record)
            return
        try:
            self.stream.write(line)
            self.flush()
        except Exception:
            with contextlib.suppress(Exception):
                os.write(2, line.encode("utf-8", "backslashreplace"))


def log_to_stderr(level: int, fmt: str) -> None:
    """Configure the root logger as ``logging.basicConfig`` does, with a :class:`StderrHandler`."""
    logging.basicConfig(level=level, format=fmt, handlers=[StderrHandler()])
