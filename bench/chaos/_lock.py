"""The benchmark lock: long runs on this shared machine take turns (``/tmp/conveyor-bench.lock``)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager

LOCK = "/tmp/conveyor-bench.lock"


@contextmanager
def bench_lock() -> Iterator[None]:
    with open(LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {LOCK} (another benchmark runs)", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
