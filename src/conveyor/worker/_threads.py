"""Hand-offs from the worker's threads (the thread slots of ``def`` handlers) to its event loop, and
the guard against a process a handler forked returning into the worker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable


class LoopRef:
    """The worker's event loop, as seen from any thread. Unbound (a loop driven round by round, as
    the testing kit does), callbacks run at once in the caller."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def bind(self) -> None:
        """Bind to the running loop (call from a coroutine on it)."""
        self.loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def call(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop: at once on the loop's own thread, else at its next turn."""
        if self.loop is None or threading.get_ident() == self._thread:
            callback()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(callback)


# This process's id, kept by an at-fork hook, so that the check after every handler costs no system
# call (os.getpid() is one).
_pid = os.getpid()

#: The signals a worker's event loop handles in this process now (set by Worker.run_sync), each with
#: its handler there (the loop's), to put back when a handler changed it.
_dispositions: dict[signal.Signals, object] = {}

#: A signal's handler as the C module keeps it. ``signal.getsignal`` wraps it in an enum conversion that
#: costs ~3 us for a Python handler (a ValueError raised and caught); the check after every ``async def``
#: handler reads three signals, which made it 7-10 % of a worker's CPU per job (issue 13, session 46).
_handler_of: Callable[[int], object] = getattr(sys.modules.get("_signal"), "getsignal", signal.getsignal)


def keep_worker_signals(signals: tuple[signal.Signals, ...]) -> None:
    """Note the worker's signals and their handlers now (call once the loop handles them), or none (``()``)."""
    _dispositions.clear()
    for sig in signals:
        _dispositions[sig] = _handler_of(sig)


def restore_worker_signals() -> list[str]:
    """Put back the worker's handler of each of its signals that code on the loop's thread changed (an
    ``async def`` handler's ``signal.signal(SIGTERM, SIG_IGN)``); the names of those it put back.

    A SIGTERM ignored that way left the worker unable to stop but by SIGKILL; SIG_DFL made the next
    SIGTERM kill it with its jobs in flight instead of stopping it gracefully.

    SIGALRM (the worker's when nothing else had it: see ``Worker.run_sync``) is put back quietly when no
    alarm is armed: a handler that set its own for a timeout and cancelled the alarm did no harm. An alarm
    still armed is cancelled, and SIGALRM named: it would have gone off in the worker's code, with that handler's
    exception raised wherever the loop was."""
    changed = []
    for sig, handler in _dispositions.items():
        if _handler_of(sig) is not handler:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)  # type: ignore[arg-type]
            if sig.name == "SIGALRM":
                if signal.getitimer(signal.ITIMER_REAL)[0] == 0:
                    continue
                signal.setitimer(signal.ITIMER_REAL, 0)
            changed.append(sig.name)
    return changed


#: The recursion limit when the worker started (0: no worker runs in this process). A handler that
#: lowered it (``sys.setrecursionlimit`` is the whole process's) has it put back by the executor, read
#: as this attribute with no call of its own: a limit just above the handler's depth leaves no room for
#: a frame more. The worker's code runs deeper than a handler's first frame: a limit of 30 made its loops
#: raise RecursionError, so that it wedged with every task cancelled (an ``async def`` handler), or
#: exited with a traceback and its jobs left to their leases (a ``def`` one). A raised limit is left:
#: a handler that recurses deep harms no one by it.
recursion_limit = 0


def keep_recursion_limit(keep: bool) -> None:
    """Note the recursion limit now, as the worker's (``keep``), or forget it (the worker is done)."""
    global recursion_limit
    recursion_limit = sys.getrecursionlimit() if keep else 0


#: The worker's signals the forking thread blocked for a fork (see _before_fork), to unblock after it.
_blocked_for_fork: tuple[signal.Signals, ...] = ()


def _before_fork() -> None:
    global _blocked_for_fork
    # The worker's signals are blocked in the forking thread until the child has its own dispositions
    # (the mask is inherited): a SIGTERM sent to a child in between (multiprocessing's Pool.__exit__
    # terminates its workers as soon as they are started) ran the loop's no-op handler, so the child
    # lived on and the handler's join waited for it forever, wedging the worker. Blocked, it stays
    # pending and kills the child once its default disposition is back.
    _blocked_for_fork = tuple(_dispositions)
    if _blocked_for_fork:
        signal.pthread_sigmask(signal.SIG_BLOCK, _blocked_for_fork)


def _after_fork_in_parent() -> None:
    if _blocked_for_fork:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _blocked_for_fork)


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()
    if _dispositions:
        # A process a handler forked shares its parent loop's signal wake-up socket: a signal sent to
        # it (the parent's handler ending it with SIGTERM) was read by the parent's loop as its own,
        # and stopped the worker, while the child, with the loop's no-op handler, went on. It gets
        # the dispositions of a plain Python process instead.
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for sig in _dispositions:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        _dispositions.clear()
    if _blocked_for_fork:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _blocked_for_fork)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def process_id() -> int:
    """This process's id (read without a system call)."""
    return _pid


def leave_forked_child(what: str, code: int) -> None:
    """End a process a handler forked that came back into the worker's code (its handler returned or
    raised in the child, or awaited and let the worker's loops run there): at once, with ``os._exit``.

    Run on, the child was a second worker on the parent's leases and state: it acked, fetched and ran
    jobs of its own, so that jobs ran three and four times. ``os._exit`` runs none of the parent's
    atexit handlers and flushes nothing of the worker's; only what the child itself printed is
    flushed (the standard streams), as ``multiprocessing`` does for its own children."""
    with contextlib.suppress(BaseException):
        os.write(2, f"conveyor: process {_pid}, forked by {what}, came back into the worker: exiting\n".encode())
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            if stream is not None:
                stream.flush()
    os._exit(code)


def exit_code_of(exc: BaseException | None) -> int:
    """The exit code of a forked child whose handler returned (None: 0) or raised ``exc``: a
    ``SystemExit``'s own code, as the child would have exited on its own, else 1."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code & 0xFF if isinstance(code, int) else 1
    return 1
