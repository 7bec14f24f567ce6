"""A deadline on every database call: a connection whose server gives no answer within it is cut.

A server that stops answering without closing its connections (its host gone in a failover that moved
the address, a network or a proxy that drops everything, a server frozen) leaves each statement waiting on
a socket nothing writes to any more. The kernel has nothing to send again, so it waits for its keepalive:
two hours by default. A worker's loops waited as long, every one of them (its fetcher never leased again,
its outcomes stayed unwritten after the server came back), and so did an HTTP request or a ``delay()``.

One watch thread per process shuts down the socket of a call past its deadline. The driver then fails the
call as a lost connection, which callers already handle (:class:`~conveyor.BackendUnavailable`: a worker
retries it on a new connection; the pool drops the dead one). The call's own code reads its watch's ``fired``
to say why in its message. A watch is cheap (a lock and a set), so that every call of the drain can have one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

from conveyor import _limits
from conveyor._errors import BackendUnavailable, ConfigurationError

#: The backends' default ``statement_deadline`` (seconds). No call of Conveyor's takes nearly as long on a
#: server that answers; the maintenance that may (a migration, a vacuum) has none.
STATEMENT_DEADLINE = 60.0

#: How often the watch thread looks at the calls under way (seconds): a deadline is kept to within this.
_TICK = 0.25
#: After this long with no call under way the watch thread sleeps until the next call (seconds). It is not
#: woken for each call: a call that started the set of calls under way woke it every time, a thread hand-off
#: per ``delay()`` when they come one at a time (6 % of a single enqueue, measured).
_SLEEP_AFTER = 10.0


class Watch:
    """One call under way on the socket ``fd``, to be cut at ``deadline`` (``time.monotonic()``)."""

    __slots__ = ("deadline", "fd", "fired", "socket_id")

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd = fd
        self.deadline = deadline
        # Which socket ``fd`` is now: a driver closes its socket on a lost connection before the call stops
        # watching it, and another connection may take the number meanwhile; that one is not cut.
        self.socket_id = _socket_id(fd)
        #: Set once the watch thread cut the call's connection.
        self.fired = False


class _Watcher:
    """The process's watch thread and the calls it watches (started on the first watch; after a fork
    the child starts its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: set[Watch] = set()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._asleep = False

    def watch(self, fd: int, seconds: float) -> Watch:
        watch = Watch(fd, time.monotonic() + seconds)
        with self._lock:
            self._watched.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="conveyor-deadlines", daemon=True)
                self._thread.start()
            elif self._asleep:
                self._asleep = False
                self._wake.notify()
        return watch

    def done(self, watch: Watch) -> bool:
        """Stop watching; whether the call was cut. Under the lock: once this returns, the watch thread
        cannot cut the connection any more (it may be handed to another call next)."""
        with self._lock:
            self._watched.discard(watch)
        return watch.fired

    def _run(self) -> None:
        with self._lock:
            busy_at = time.monotonic()
            while True:
                self._wake.wait(_TICK)
                now = time.monotonic()
                if self._watched:
                    busy_at = now
                elif now - busy_at >= _SLEEP_AFTER:
                    self._asleep = True
                    while self._asleep:
                        self._wake.wait()
                    busy_at = time.monotonic()
                for watch in [w for w in self._watched if w.deadline <= now]:
                    self._watched.discard(watch)
                    watch.fired = True
                    cut(watch.fd, watch.socket_id)

    def _after_fork_in_child(self) -> None:
        # The thread is not in the child, and the calls it watched are the parent's.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._watched = set()
        self._thread = None
        self._asleep = False


_watcher = _Watcher()
os.register_at_fork(after_in_child=_watcher._after_fork_in_child)


def watch(fd: int, seconds: float | None) -> Watch | None:
    """Watch a call on socket ``fd`` for ``seconds`` (None: no deadline, nothing watched)."""
    return None if seconds is None else _watcher.watch(fd, seconds)


def done(watch: Watch | None) -> bool:
    """The call ``watch`` watched has ended (or is about to raise): stop; True if its deadline cut it."""
    return False if watch is None else _watcher.done(watch)


@contextlib.contextmanager
def watching(fd: int, seconds: float | None) -> Iterator[Watch | None]:
    """:func:`watch` for the block, :func:`done` at its end (call ``done`` earlier where the socket may close
    inside the block: its number may be another connection's next)."""
    w = watch(fd, seconds)
    try:
        yield w
    finally:
        done(w)


def _socket_id(fd: int) -> tuple[int, int] | None:
    """What tells the socket open as ``fd`` from one opened later under the same number (None: none open)."""
    try:
        stat = os.fstat(fd)
    except (OSError, ValueError):
        return None
    return stat.st_dev, stat.st_ino


def cut(fd: int, socket_id: tuple[int, int] | None) -> None:
    """Shut a socket down both ways, on a duplicate of its descriptor: a thread or an event loop waiting
    on it wakes to an end of file, and its driver fails the call as a lost connection; only if ``fd`` is
    still the socket ``socket_id`` (None: none was open when the call began, nothing to cut)."""
    if socket_id is None:
        return
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return  # closed meanwhile, or not a socket: nothing waits on it
    if _socket_id(sock.fileno()) != socket_id:
        sock.close()
        return  # closed meanwhile, and the number is another connection's now
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def no_answer(engine: str, action: str, seconds: float | None) -> BackendUnavailable:
    """What a call whose connection its deadline cut raises."""
    return BackendUnavailable(
        f"{engine} gave no answer to {action} within {seconds:g}s (statement_deadline): its connection was cut "
        "(a server or network that stopped answering, or a lock another transaction held that long)"
    )


def check_seconds(seconds: float | None) -> float | None:
    """``seconds`` as a deadline: None, or a finite number of seconds of at least 1 (ConfigurationError)."""
    if seconds is None:
        return None
    return _limits.check_seconds(seconds, "statement_deadline", ConfigurationError, minimum=1.0)
