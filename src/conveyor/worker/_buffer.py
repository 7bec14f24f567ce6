"""The prefetch buffer: leased jobs waiting for a slot, and the permits that bound how many run.

The fetch loop puts deliveries in; two kinds of slots take them out: coroutines on the event loop
for ``async def`` handlers (and for jobs whose task is unknown), threads for plain ``def`` handlers.
A ``def`` job's slot is a thread that loops by itself — take, run, hand the outcome to the
completer — so that such a job never waits for the event loop: with the handler in a pool thread
and its slot on the loop, every job crossed threads twice and the loop, contended by ten handler
threads for the GIL, was the bottleneck (a Redis-bound drain ran at a third of the same body in ten
plain threads; see docs/benchmarks.md). Both kinds share ``concurrency`` permits: at most that many
handlers run at once, whatever their kind.

Thread-safe: the fetcher and the coroutine slots use it from the event loop's thread, thread slots
from theirs. A slot gives its permit back and takes its next job in one step, so that a busy slot
goes on with the next job without waking anyone.

**One suspect at a time.** A suspect is a job whose lease once ran out (``rescues``): maybe it killed
its worker. Its start is counted before it runs (poison protection), and every job running in a
process that dies dies with it. The jobs a crash left behind are leased again together; run side by
side with the one that kills its workers, they died with it at each crash and were charged each time,
and innocent jobs ended dead (``max_deliveries_exceeded``). So the buffer hands out one suspect at a
time: while one runs, the others are set aside (still leased, not started, not counted) and the
slots go on with other jobs. The next suspect goes out when the running one ends
(:meth:`Buffer.suspect_done`), or once it has run ``SUSPECT_PATIENCE`` seconds (a hung suspect does
not hold the others for ever)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque

from conveyor.backends.base import Delivery
from conveyor.worker._threads import LoopRef

#: How long one suspect runs before the next may run beside it (seconds).
SUSPECT_PATIENCE = 30.0
#: How often a waiting slot looks again while suspects are set aside (their patience is a time).
_PARKED_POLL = 1.0


class Buffer:
    """Deliveries leased by this worker and not started yet, and ``concurrency`` run permits.

    :attr:`threaded` names the tasks the thread slots run (set by the executor when it starts them;
    empty, everything goes to the coroutine slots). A free permit goes to the oldest buffered
    delivery, whatever its kind, so that neither kind starves the other. After :meth:`close` every
    take returns None (what is still buffered is the worker's to hand back, with :meth:`drain`)."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        #: Tasks whose deliveries go to the thread slots.
        self.threaded: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        # (sequence, delivery): the sequence says which kind's head is older.
        self._for_threads: deque[tuple[int, Delivery]] = deque()
        self._for_loop: deque[tuple[int, Delivery]] = deque()
        self._sequence = 0
        self._thread_ready = threading.Condition(self._lock)
        self._loop_ready = asyncio.Event()
        self._permits = concurrency
        self._closed = False
        #: Set when the buffer falls to the level the fetcher waits for (see :meth:`arm_low`).
        self.low = asyncio.Event()
        self._low_level: int | None = None
        # Whether that level counts running jobs too (``arm_low(held=True)``): set also when a handler ends.
        self._low_held = False
        #: The loop whose coroutines wait on this buffer (thread slots wake them through it).
        self.loop = LoopRef()
        # Suspects set aside while another runs (see the module's docstring), and the one running.
        self._parked: deque[tuple[int, Delivery]] = deque()
        self._suspect: Delivery | None = None
        self._suspect_since = 0.0

    def qsize(self) -> int:
        return len(self._for_threads) + len(self._for_loop) + len(self._parked)

    def empty(self) -> bool:
        return self.qsize() == 0

    @property
    def running(self) -> int:
        """How many permits are taken: handlers running (or about to) in either kind of slot."""
        return self.concurrency - self._permits

    def put(self, delivery: Delivery) -> None:
        """Buffer one leased delivery."""
        threaded = delivery.task in self.threaded
        with self._lock:
            self._sequence += 1
            (self._for_threads if threaded else self._for_loop).append((self._sequence, delivery))
            self._signal()

    def take_blocking(self, release: bool = False) -> Delivery | None:
        """A thread slot's next delivery (blocking); None once closed. ``release``: first give back
        the permit of the job this slot just finished (one step: a busy slot goes on without waking
        anyone)."""
        with self._lock:
            if release:
                self._permits += 1
                self._check_low()
            while not self._closed and self._turn() != "threads":
                if release:
                    release = False
                    self._signal()  # the permit this slot gave back may serve a coroutine slot
                self._thread_ready.wait(_PARKED_POLL if self._parked else None)
            if self._closed:
                return None
            return self._take(self._for_threads)

    async def take(self, release: bool = False) -> Delivery | None:
        """A coroutine slot's next delivery; None once closed. ``release`` as in :meth:`take_blocking`."""
        if release:
            self.release()
        while True:
            with self._lock:
                if self._closed:
                    return None
                if self._turn() == "loop":
                    return self._take(self._for_loop)
                self._loop_ready.clear()
                parked = bool(self._parked)
            if not parked:
                await self._loop_ready.wait()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._loop_ready.wait(), _PARKED_POLL)

    def release(self) -> None:
        """Give back one permit (a handler ended, or its thread was given up)."""
        with self._lock:
            self._permits += 1
            self._check_low()
            self._signal()

    def suspect_done(self, delivery: Delivery) -> None:
        """A delivery a slot took has ended (run or not): if it was the running suspect, the next may go."""
        if not delivery.rescues:
            return
        with self._lock:
            if self._suspect is delivery:
                self._suspect = None
                self._signal()

    def _set_suspects_aside(self) -> None:
        """Keep suspects back while one runs (the lock is held): park those at the heads; with none
        running (or the running one past its patience), put the oldest parked one back in line.
        Called at every turn: with no suspect out and none parked (nearly always) it returns at once."""
        if self._suspect is None and not self._parked:
            return
        if self._suspect is not None and time.monotonic() - self._suspect_since >= SUSPECT_PATIENCE:
            self._suspect = None
        heads = (items for items in (self._for_threads, self._for_loop) if items)
        if self._suspect is None:
            if self._parked and not any(items[0][1].rescues for items in heads):  # none back in line yet
                seq, delivery = self._parked.popleft()
                threaded = delivery.task in self.threaded
                (self._for_threads if threaded else self._for_loop).appendleft((seq, delivery))
            return
        for items in (self._for_threads, self._for_loop):
            while items and items[0][1].rescues:
                self._parked.append(items.popleft())

    def _turn(self) -> str | None:
        """Which kind of slot the next permit goes to (the lock is held): the older head's."""
        if not self._permits:
            return None
        self._set_suspects_aside()
        if self._for_threads and (not self._for_loop or self._for_threads[0][0] < self._for_loop[0][0]):
            return "threads"
        return "loop" if self._for_loop else None

    def _take(self, items: deque[tuple[int, Delivery]]) -> Delivery:
        # The lock is held.
        self._permits -= 1
        _, delivery = items.popleft()
        if delivery.rescues and self._suspect is None:
            self._suspect, self._suspect_since = delivery, time.monotonic()
        self._check_low()
        self._signal()
        return delivery

    def _held(self) -> int:
        """What :meth:`arm_low` compares with its level (the lock is held)."""
        return self.qsize() + (self.running if self._low_held else 0)

    def _check_low(self) -> None:
        """Set :attr:`low` if the armed level is reached (the lock is held)."""
        if self._low_level is not None and self._held() <= self._low_level:
            self._low_level = None
            self.loop.call(self.low.set)

    def _signal(self) -> None:
        """Wake a slot of the kind whose turn it is, if a permit is free (the lock is held)."""
        turn = self._turn()
        if turn == "threads":
            self._thread_ready.notify()
        elif turn == "loop" and not self._loop_ready.is_set():
            # Cleared only by take(), under this lock: set already, the next take sees this change.
            self.loop.call(self._loop_ready.set)

    def arm_low(self, level: int, held: bool = False) -> bool:
        """Have :attr:`low` set once at most ``level`` deliveries are buffered (``held``: buffered or
        running); False (nothing to wait for) if there are no more than that already."""
        with self._lock:
            self._low_held = held
            if self._held() <= level:
                return False
            self._low_level = level
            self.low.clear()
            return True

    def close(self) -> None:
        """Every take from now on returns None."""
        with self._lock:
            self._closed = True
            self._thread_ready.notify_all()
            self.loop.call(self._loop_ready.set)

    def drain(self) -> list[Delivery]:
        """Take every buffered delivery out, oldest first (the worker hands them back; the testing
        kit runs them)."""
        with self._lock:
            taken = sorted([*self._for_loop, *self._for_threads, *self._parked], key=lambda item: item[0])
            self._for_loop.clear()
            self._for_threads.clear()
            self._parked.clear()
        return [delivery for _, delivery in taken]
