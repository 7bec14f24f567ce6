"""UUIDv7 job ids: time-ordered, so that id order is enqueue order and B-tree inserts stay local."""

from __future__ import annotations

import os
import struct
import threading
import time
from uuid import UUID, SafeUUID

_lock = threading.Lock()
_last_ms = 0
_counter = 0

# Randomness is read from the OS in blocks: one urandom() system call per id (and two more per
# traceparent) was a third of the cost of building a 20,000-job batch. Guarded by _lock.
_POOL_SIZE = 4096
_pool = b""
_pool_at = 0
_unpack_u64 = struct.Struct(">Q").unpack_from


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's unread randomness and its id clock. Otherwise parent
    and child (or two children of one prefork server) would mint the same ids from the same pool
    in the same millisecond, and the second job would be taken for a resend of the first."""
    global _lock, _pool, _pool_at, _last_ms, _counter
    _lock = threading.Lock()
    _pool, _pool_at, _last_ms, _counter = b"", 0, 0, 0


os.register_at_fork(after_in_child=_forget_after_fork)

_VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)
_new_uuid = object.__new__
# UUID's slots, set through their descriptors (UUID.__setattr__ refuses every assignment).
_set_int = vars(UUID)["int"].__set__
_set_is_safe = vars(UUID)["is_safe"].__set__
_UNKNOWN = SafeUUID.unknown


def _take_random(n: int) -> bytes:
    """``n`` bytes from the pool; the caller holds ``_lock``."""
    global _pool, _pool_at
    if _pool_at + n > len(_pool):
        _pool, _pool_at = os.urandom(_POOL_SIZE), 0
    chunk = _pool[_pool_at : _pool_at + n]
    _pool_at += n
    return chunk


def random_bytes(n: int) -> bytes:
    """``n`` (at most 4096) bytes from the operating system's CSPRNG, served from a buffer."""
    with _lock:
        return _take_random(n)


class MintedId(UUID):
    """A job id minted here by :func:`uuid7`, which remembers whether a send has used it yet.

    A job id is accepted once: a resend of an id whose job is live or archived enqueues nothing.
    Looking an id up in the archive costs an index probe per archive partition, which a bulk send
    of fresh ids cannot afford and does not need: an id minted in this process that no send has
    used cannot be anywhere yet. :meth:`first_use` tells the producer which ids those are. A copy
    (pickle, ``copy``) is a plain UUID, so it is always looked up."""

    __slots__ = ("_used",)
    _used: bool

    def first_use(self) -> bool:
        """True the first time a send uses this id (it is then fresh), False afterwards."""
        try:
            if self._used:
                return False
        except AttributeError:  # built without uuid7()
            pass
        _set_used(self, True)
        return True

    def __reduce__(self) -> tuple[type[UUID], tuple[None, None, None, None, int]]:
        return UUID, (None, None, None, None, self.int)

    def __repr__(self) -> str:
        return f"UUID('{self}')"


# The slot's setter: object.__setattr__ (UUID refuses assignments) costs twice as much per id.
_set_used = vars(MintedId)["_used"].__set__


def uuid7() -> MintedId:
    """A new UUIDv7 (RFC 9562), monotonic within this process.

    Within one millisecond a 12-bit counter in ``rand_a`` keeps ids ordered, so that jobs sent
    one after another by the same producer sort in send order."""
    global _last_ms, _counter, _pool, _pool_at
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
        if _pool_at + 8 > len(_pool):
            _pool, _pool_at = os.urandom(_POOL_SIZE), 0
        rand = _unpack_u64(_pool, _pool_at)[0]
        _pool_at += 8
    value = ((ms & 0xFFFF_FFFF_FFFF) << 80) | _VERSION_AND_VARIANT | (counter << 64) | (rand & 0x3FFF_FFFF_FFFF_FFFF)
    # UUID(int=value) re-checks the range and the arguments; the value is in range by construction.
    uid: MintedId = _new_uuid(MintedId)
    _set_int(uid, value)
    _set_is_safe(uid, _UNKNOWN)
    _set_used(uid, False)
    return uid
