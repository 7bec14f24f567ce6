"""The fetch loop: leases batches of ready jobs into a bounded buffer."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from conveyor._catalogue import Catalogue
from conveyor.backends.base import Delivery, JobsAcquireParams, Listener
from conveyor.worker._buffer import Buffer
from conveyor.worker._calls import BackendCalls
from conveyor.worker._config import WorkerConfig
from conveyor.worker._observe import NO_OBSERVER, Observer
from conveyor.worker._service import Service
from conveyor.worker._state import Counters, Registry

log = logging.getLogger("conveyor.worker")

# An adaptive buffer holds about this many seconds of work at the rate handlers are starting jobs.
_BUFFER_SECONDS = 0.05
# ... re-measured this often.
_ADAPT_EVERY = 0.25
# A worker that goes idle having leased at least Fetcher.vacuum_after jobs since its last vacuum has
# the jobs table vacuumed, at most this often (see Fetcher._vacuum).
_VACUUM_EVERY = 60.0
# An idle fetcher's waits are cut into steps of at most this long, so that a stop, and a job scheduled
# meanwhile (a retry's backoff, a delayed job this process sent), are noticed.
_IDLE_STEP = 0.25
# The shortest idle wait for a scheduled job that is already due (its acquire promotes it): never a busy loop.
_DUE_MIN = 0.005


class Fetcher(Service):
    """Keeps the buffer topped up from the worker's queues (lanes), in strict lane order.

    It refills when the buffer falls to half its capacity, in one acquire per lane, so that
    acquires are batched. When nothing is ready it sleeps until a notification (PostgreSQL
    LISTEN/NOTIFY), the poll interval or the time the next scheduled job it knows of comes due
    (``Backend.jobs_next_due``), whichever comes first: with notifications, pickup latency does not
    depend on the poll interval, which then only catches jobs another process scheduled since."""

    name = "fetcher"
    observer: Observer = NO_OBSERVER
    #: Leased jobs after which going idle has the jobs table vacuumed (None: never; see _vacuum).
    vacuum_after: int | None = 1_000
    #: Outcomes waiting to be written past which no more jobs are leased (see ``unwritten``).
    max_unwritten: int = 10_000

    def __init__(
        self,
        catalogue: Catalogue,
        calls: BackendCalls,
        registry: Registry,
        counters: Counters,
        buffer: Buffer,
        config: WorkerConfig,
        queues: Sequence[str],
        clock: Callable[[], datetime],
    ) -> None:
        super().__init__()
        self.catalogue = catalogue
        self.calls = calls
        self.registry = registry
        self.counters = counters
        self.buffer = buffer
        self.queues = list(queues)
        self.capacity = config.capacity
        # With max_capacity the buffer adapts between capacity and max_capacity (see _adapt).
        self.base_capacity = config.capacity
        self.max_capacity = config.max_capacity
        #: ``prefetch=0``: lease only for free slots, never ahead of them (see ``_space``).
        self.on_demand = config.prefetch == 0
        self._rate_at = time.monotonic()
        self._rate_started = 0
        self.worker_id = config.identity
        self.visibility_timeout = config.visibility_timeout
        self.clock = clock
        backend = calls.backend
        self.poll_interval = (
            config.poll_interval if config.poll_interval is not None else (1.0 if backend.notifies else 0.25)
        )
        self._listener: Listener | None = None
        self._listen_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conveyor-listen")
        self.idle = False
        self.weights = dict(config.weights) if config.weights else None
        #: Weighted lanes: each lane's credit for the slots a round's proportional shares leave over (see _shares).
        self._credit = dict.fromkeys(self.queues, 0)
        self._acquired_at_vacuum = 0  # counters.acquired when this worker last had the table vacuumed
        self._vacuum_next = 0.0
        self._vacuuming: asyncio.Task[None] | None = None
        #: How many outcomes wait to be written (the completer's backlog). Past ``max_unwritten`` the
        #: fetcher leases nothing more: a database that takes leases but refuses outcomes (a grant on
        #: the archive revoked) would otherwise have this worker run the whole queue and hold every
        #: result in memory.
        self.unwritten: Callable[[], int] = lambda: 0
        self._held_back = False

    def _vt_for(self, queue: str) -> float:
        """The lease taken at acquire: the longest visibility timeout of the queue's tasks (the
        task is only known per row after acquire), else the worker's default."""
        return self.catalogue.lease_for(queue, self.visibility_timeout)

    def _space(self) -> int:
        """How many more jobs to lease now: up to the buffer's capacity; on demand (``prefetch=0``), one
        per slot that neither runs a job nor has one waiting for it."""
        if self.on_demand:
            return self.buffer.concurrency - self.buffer.running - self.buffer.qsize()
        return self.capacity - self.buffer.qsize()

    def _adapt(self) -> None:
        """Size the buffer to hold about ``_BUFFER_SECONDS`` of work at the current start rate.

        Short jobs at a high rate get big buffers, hence big acquires whose per-statement cost is
        shared by many jobs (a drain of no-op jobs: ~12,000 jobs/s at 40, ~17,000 at 120); slow
        jobs keep the base size, so a worker never hoards much more work than it can start within
        that time while other workers could have run it. Without ``max_capacity`` it stays fixed."""
        if self.max_capacity is None:
            return
        now = time.monotonic()
        elapsed = now - self._rate_at
        if elapsed < _ADAPT_EVERY:
            return
        rate = (self.counters.started - self._rate_started) / elapsed
        self._rate_at, self._rate_started = now, self.counters.started
        self.capacity = max(self.base_capacity, min(self.max_capacity, int(rate * _BUFFER_SECONDS)))

    async def run_once(self) -> int:
        """Acquire up to the free buffer space; return how many jobs were leased.

        Strict lanes: each queue in order takes what space is left. Weighted lanes: the space is
        first shared in proportion to the weights (:meth:`_shares`: a busy high lane cannot starve a
        low one), then what a lane left unused goes to the others in order."""
        got = 0
        if self.weights:
            spare = 0
            for queue, share in self._shares(max(0, self._space())).items():
                taken = await self._acquire(queue, share)
                got += taken
                spare += share - taken
            # Only the share a lane could not use goes to the others: space freed by handlers while
            # these acquires ran is left for the next round, or it would go to whichever lane is last.
            for queue in self.queues:
                if spare <= 0:
                    break
                taken = await self._acquire(queue, spare)
                got += taken
                spare -= taken
        else:
            for queue in self.queues:
                got += await self._acquire(queue, self._space())
        return got

    def _shares(self, free: int) -> dict[str, int]:
        """``free`` slots shared among the weighted lanes: each its whole proportional part, and the few slots
        the rounding leaves over by smooth weighted round-robin (nginx's), whose credits carry over from round
        to round. So the lanes get their weights' proportions also when a round has fewer slots than lanes:
        a worker leasing one job at a time (``prefetch=0``, with every slot busy but one) gave each slot to the
        first lane, and a low lane starved for as long as the high one had jobs."""
        assert self.weights is not None  # Worker refuses weights that leave out a queue it drains
        weight = {q: self.weights[q] for q in self.queues}
        total = sum(weight.values())
        shares = {q: free * w // total for q, w in weight.items()}
        for _ in range(free - sum(shares.values())):
            for q, w in weight.items():
                self._credit[q] += w
            pick = max(self.queues, key=self._credit.__getitem__)
            self._credit[pick] -= total
            shares[pick] += 1
        return shares

    async def _acquire(self, queue: str, limit: int) -> int:
        if limit <= 0:
            return 0
        vt = self._vt_for(queue)
        deliveries, _ = await self.calls.call_limited(
            self.calls.backend.jobs_acquire,
            limit,
            lambda n: JobsAcquireParams(queue, n, vt, self.worker_id, self.clock()),
            give_up=(lambda: self.stopping),
            what="acquire",
        )
        self.observer.fetched(queue, len(deliveries))
        return self._take(deliveries)

    def _take(self, deliveries: Sequence[Delivery]) -> int:
        """Hold leased deliveries, buffer them for the executor and count them."""
        self.counters.acquired += len(deliveries)
        for delivery in deliveries:
            options = self.catalogue.task_options(delivery.task)
            vt = options.visibility_timeout if options else self.visibility_timeout
            self.registry.add(delivery, vt)
            self.buffer.put(delivery)
        return len(deliveries)

    async def run(self) -> None:
        """Fetch until stopped."""
        backend = self.calls.backend
        if backend.notifies:
            self._listener = backend.listen(self.queues)
        idle_wait = 0.01
        try:
            while not self.stopping:
                self._adapt()
                if self._holding_back():
                    await self._wait_for(self._stopped, _IDLE_STEP)
                    continue
                if (
                    self.buffer.arm_low(self.buffer.concurrency - 1, held=True)
                    if self.on_demand
                    else self.buffer.arm_low(self.capacity // 2)
                ):
                    await self._wait_for(self.buffer.low, None)
                    continue
                try:
                    got = await self.run_once()
                except Exception:
                    if self.stopping:
                        break
                    raise
                self.idle = got == 0 and self.buffer.qsize() == 0
                if self.idle:
                    self._vacuum_when_due()
                if got:
                    idle_wait = 0.01
                    continue
                if self._listener is not None:
                    await self._wait_notification(self.poll_interval)
                else:
                    # No notifications: poll adaptively, fast after work, slower when idle.
                    await self._sleep(idle_wait)
                    idle_wait = min(idle_wait * 2, self.poll_interval)
        finally:
            if self._vacuuming is not None:
                self._vacuuming.cancel()  # its statement ends on its database thread
            if self._listener is not None:
                self._listener.close()
            self._listen_pool.shutdown(wait=False)

    def _holding_back(self) -> bool:
        """Whether more than ``max_unwritten`` outcomes wait to be written (said once each way)."""
        unwritten = self.unwritten()
        if unwritten > self.max_unwritten:
            if not self._held_back:
                self._held_back = True
                log.warning(
                    "%d outcomes are not written yet (the database refuses or delays them): leasing no more jobs "
                    "until they are",
                    unwritten,
                )
            return True
        if self._held_back:
            self._held_back = False
            log.info("outcomes written: leasing jobs again")
        return False

    def _vacuum_when_due(self) -> None:
        """Going idle: have the jobs table vacuumed if this worker leased ``vacuum_after`` jobs since
        it last did, and not within the last minute.

        Each job a worker finishes leaves a dead row version whose entry in the ready index every
        acquire steps over until a vacuum removes it, and autovacuum looks at a database once a
        minute at most: after a 20,000-job drain an acquire read 146 index pages for one job
        (0.45 ms) instead of 4 (0.06 ms), the first pickups of a burst paying for the one before.
        Done when idle, in the background on a database thread (the fetcher goes on listening),
        rarely (a vacuum reads every page not known to be clean) and skipped where another
        vacuum of the table is running (see :meth:`Backend.jobs_vacuum`)."""
        now = time.monotonic()
        if (
            self.vacuum_after is None
            or self.counters.acquired - self._acquired_at_vacuum < self.vacuum_after
            or self._vacuuming is not None
            or now < self._vacuum_next
        ):
            return
        self._acquired_at_vacuum = self.counters.acquired
        self._vacuum_next = now + _VACUUM_EVERY
        self._vacuuming = asyncio.get_running_loop().create_task(self._vacuum(), name="vacuum")

    async def _vacuum(self) -> None:
        backend = self.calls.backend
        try:
            await self.calls.once(lambda _: backend.jobs_vacuum(), None)
        except Exception as exc:
            # Too big to vacuum within its bound, or refused: leave it to autovacuum from now on.
            self._vacuum_next = math.inf
            log.warning("vacuum of the jobs table failed (%s); this worker leaves it to autovacuum", exc)
        finally:
            self._vacuuming = None

    def _until_due(self) -> float:
        """Seconds until the next scheduled job of this worker's queues that its backend knows of comes
        due (infinity: none known); at least _DUE_MIN."""
        due = self.calls.backend.jobs_next_due(self.queues)
        if due is None:
            return math.inf
        return max((due - self.clock()).total_seconds(), _DUE_MIN)

    async def _sleep(self, timeout: float) -> None:
        """Sleep until ``timeout`` is out, the next known scheduled job is due, or a stop."""
        deadline = time.monotonic() + timeout
        while not self.stopping:
            due = self._until_due()
            left = min(deadline - time.monotonic(), due)
            if left <= 0:
                return
            await self._wait_for(self._stopped, min(left, _IDLE_STEP))
            if due <= _IDLE_STEP:
                return  # the job is due: the fetch loop's acquire promotes it

    async def _wait_notification(self, timeout: float) -> None:
        """Sleep until a notification (or ``timeout``, or the next known scheduled job is due, or a stop).

        With one queue, the thread that receives the notification acquires at once, before handing
        back to the event loop: a woken fetcher would otherwise go listener thread -> event loop ->
        database thread before the acquire even starts, and pickup latency is what this path is
        for. With several lanes the event loop acquires, in lane order. A failed acquire here is
        dropped: the loop acquires again, with its retries."""
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        listener = self._listener
        backend = self.calls.backend
        queue = self.queues[0] if len(self.queues) == 1 else None
        vt = self._vt_for(queue) if queue is not None else 0.0

        def wait_then_acquire() -> list[Delivery]:
            # The listener blocks this thread: wait in steps of at most _IDLE_STEP, so that a stop
            # and a newly known scheduled job are noticed, until ``timeout`` is out (the poll: jobs
            # whose run_at came due send no notification) or the next known scheduled job is due:
            # then the event loop acquires, promoting it. A step that ends early without a
            # notification (a closed listener) hands back to the event loop at once; a lost server
            # makes the listener sleep out its step instead.
            deadline = time.monotonic() + timeout
            while True:
                began = time.monotonic()
                due = self._until_due()
                step = min(deadline - began, due, _IDLE_STEP)
                if step <= 0:
                    return []
                if listener.wait(step):
                    break
                now = time.monotonic()
                if self.stopping or now >= deadline or now - began >= due or now - began < step / 2:
                    return []
            if queue is None or self.stopping:
                return []
            limit = self._space()
            if limit <= 0:
                return []
            try:
                # promote=False: the fetch loop's acquire, right after this one, promotes due scheduled jobs.
                params = JobsAcquireParams(queue, limit, vt, self.worker_id, self.clock(), promote=False)
                return backend.jobs_acquire(params)
            except Exception as exc:  # the event loop acquires next, with its retries and error handling
                log.debug("acquire on notification failed (%s); the fetch loop retries", exc)
                return []

        # Even when stopping, wait for the thread (at most one bounded wait and one acquire): the
        # leases it may have taken must reach the buffer, which shutdown hands back to pending.
        got = await loop.run_in_executor(self._listen_pool, wait_then_acquire)
        if got:
            self.observer.fetched(got[0].queue, len(got))
            self._take(got)
            # Let the slots woken by these jobs start them before this loop's next acquire goes to a
            # database thread (which would compete with them for the GIL): this is the pickup path.
            await asyncio.sleep(0)

    async def _wait_for(self, event: asyncio.Event, timeout: float | None) -> None:
        waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stopped.wait())}
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
