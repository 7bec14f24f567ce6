"""UUIDv7 job ids: time-ordered, so that id order is enqueue order and B-tree inserts stay local."""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> UUID:
    """A new UUIDv7 (RFC 9562), monotonic within this process.

    Within one millisecond a 12-bit counter in ``rand_a`` keeps ids ordered, so that jobs sent
    one after another by the same producer sort in send order."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:
                # The counter overflowed: borrow the next millisecond rather than lose order.
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _counter = 0
        counter = _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & 0x3FFF_FFFF_FFFF_FFFF
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= rand_b
    return UUID(int=value)
