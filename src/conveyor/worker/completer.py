"""The flush loop: writes handler outcomes to the database in batches.

Acks are batched because one statement per flush instead of one per job is the single largest
throughput lever of a SQL queue (River's batch completer took it from ~10k to ~46k jobs/s).

An outcome also counts its job's start as a delivery, unless that start was counted already. The
heartbeat has the starts of jobs running long counted early (so that a worker dying under them leaves
them counted); those marks go through this loop too, written before the outcomes of the same flush and
dropped when the job's outcome is in that flush, so a start is never counted twice. An outcome the
database refuses to store, even as a dead letter, is dropped (the job runs again once its lease
expires), but its start is still counted on its own."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import cast
from uuid import UUID

from conveyor._errors import DATABASE_WIDE, BackendError, StatementCancelled, UnstorableText
from conveyor._outcomes import OUTCOME_REFUSED, Outcome, storable, type_name
from conveyor.backends.base import (
    ErrorInfo,
    Finish,
    JobsFinishParams,
    JobsRetryParams,
    JobsStartParams,
    LeaseRef,
    RetryItem,
)
from conveyor.worker._calls import BackendCalls
from conveyor.worker._observe import NO_OBSERVER, Observer
from conveyor.worker._service import Service
from conveyor.worker._state import Counters, Registry
from conveyor.worker._threads import LoopRef

log = logging.getLogger("conveyor.worker")


class Completer(Service):
    """Buffers outcomes and flushes them every ``flush_interval`` seconds (0: flush at once).

    :meth:`add` may be called from any thread (the executor's thread slots add from theirs); the
    rest runs on the event loop. An outcome is only dropped from memory after the database accepted
    it: while the database is away the batch is kept and retried, so a restart loses no ack. (A
    lease may expire meanwhile; the late ack is then stale and counted, and the job runs again:
    at-least-once.)"""

    name = "completer"
    observer: Observer = NO_OBSERVER

    def __init__(
        self,
        calls: BackendCalls,
        registry: Registry,
        counters: Counters,
        clock: Callable[[], datetime],
        flush_interval: float = 0.005,
        max_batch: int = 1000,
        final_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        self.calls = calls
        self.registry = registry
        self.counters = counters
        self.clock = clock
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self._pending: list[Outcome] = []
        # Guards _pending, which thread slots append to; _woken says a wake-up is on its way to the
        # loop already, so that a burst of outcomes from threads costs one hand-off, not one each.
        self._lock = threading.Lock()
        self._woken = False
        self._loop = LoopRef()
        self._starts: dict[UUID, LeaseRef] = {}
        self._wake = asyncio.Event()
        self._give_up_at: float | None = None
        self.final_timeout = final_timeout
        #: False when the last flush gave up with outcomes left unwritten.
        self.flushed_all = True

    def add(self, outcome: Outcome) -> None:
        """Queue one outcome for the next flush (from any thread)."""
        held = self.registry.get(outcome.id, outcome.receipt)
        if held is not None:
            held.state = "finishing"
        with self._lock:
            self._pending.append(outcome)
            if self._woken:
                return
            self._woken = True
        self._loop.call(self._wake.set)

    def count_start(self, ref: LeaseRef) -> None:
        """Have the start of a running delivery counted at the next flush (unless its outcome is in it)."""
        self._starts[ref.id] = ref
        self._wake.set()

    @property
    def backlog(self) -> int:
        return len(self._pending)

    def _next_batch(self, most: int) -> list[Outcome]:
        size = min(most, self.max_batch)
        with self._lock:
            batch, self._pending = self._pending[:size], self._pending[size:]
        return batch

    async def run_once(self) -> int:
        """Flush everything queued now; return how many outcomes were written (applied or stale).

        Outcomes queued while these statements run wait for the next flush: flushing them at once
        too, in a chain of statements each carrying what arrived during the one before, made a
        drain's batches a third as big as the ticker's (~10 jobs per statement at 5,000 jobs/s)."""
        written = 0
        if self._starts:
            await self._count_starts()
        with self._lock:
            left = len(self._pending)
        while left > 0 and (batch := self._next_batch(left)):
            left -= len(batch)
            try:
                await self._flush(batch)
            except BaseException:
                # Keep the batch for the next try: an outcome leaves memory only once it is stored.
                with self._lock:
                    self._pending[:0] = batch
                raise
            written += len(batch)
        return written

    async def _count_starts(self) -> None:
        starts, self._starts = self._starts, {}
        with self._lock:
            finishing = {o.id for o in self._pending}
        marks = [
            ref
            for ref in starts.values()
            if ref.id not in finishing
            and (held := self.registry.get(ref.id, ref.receipt)) is not None
            and not held.counted
        ]
        if not marks:
            return
        try:
            counted = await self.calls.call_batch(
                self.calls.backend.jobs_start_many,
                marks,
                partial(JobsStartParams, now=self.clock(), wait=False),
                give_up=self._should_give_up,
                what="count starts",
            )
        except BaseException:
            self._starts = {**starts, **self._starts}
            raise
        receipts = {ref.id: ref.receipt for ref in marks}
        for job_id in counted:
            if (held := self.registry.get(job_id, receipts[job_id])) is not None:
                held.counted = True

    async def _flush(self, batch: list[Outcome]) -> None:
        batch = [self._with_count(o) for o in batch]
        finishes = [o for o in batch if isinstance(o, Finish)]
        retries = [o for o in batch if isinstance(o, RetryItem)]
        stale = 0
        errors = self.counters.backend_errors
        if finishes:
            stale += len(finishes) - await self._write(finishes)
        if retries:
            stale += len(retries) - await self._write(retries)
        if stale:
            # Acks carry the receipt so that a worker whose lease expired cannot overwrite the
            # outcome of the newer delivery; such acks change nothing and are counted here.
            self.counters.stale_acks += stale
            if self.counters.backend_errors == errors:
                log.warning("%d stale ack(s): their leases had expired and the jobs were redelivered", stale)
            else:
                # A try whose connection was lost may have committed before it was (a server killed or cut
                # off after the commit): its retry then finds its own outcomes written. Said as a fact
                # before, a redelivery nobody made (MySQL, KILL during a drain: 2 in ~3,000 jobs).
                log.warning(
                    "%d stale ack(s) after the database was away: a try that lost its connection had written "
                    "them already, or their leases had expired and the jobs were redelivered",
                    stale,
                )
        for outcome in batch:
            self.registry.drop(outcome.id, outcome.receipt)

    def _with_count(self, outcome: Outcome) -> Outcome:
        held = self.registry.get(outcome.id, outcome.receipt)
        if held is not None and held.counted and not outcome.counted:
            return dataclasses.replace(outcome, counted=True)
        return outcome

    async def _write(self, items: Sequence[Outcome]) -> int:
        """Write outcomes of one kind in one statement; return how many applied (the rest were stale).

        One outcome the database refuses (a value it cannot store, a constraint) must not take its
        batch down with it: a refused statement is split in halves until the refused outcomes are
        found, and each of those alone ends its job dead (reason ``outcome_refused``). A database that is
        away or damaged refuses every outcome alike: that is raised, no job is dead-lettered for it.

        A batch whose statement the database cancelled (one that runs past its ``statement_timeout``)
        is split in halves too, each written on its own; one outcome alone so cancelled is retried
        like an unavailable database, never dead-lettered."""
        try:
            applied = await self._statement(items, splits=len(items) > 1)
        except StatementCancelled as exc:  # a batch may split; one outcome alone is raised once given up
            if len(items) <= 1:
                raise
            middle = len(items) // 2
            log.warning("splitting a batch of %d outcomes the database cancelled (%s)", len(items), exc)
            return await self._write(items[:middle]) + await self._write(items[middle:])
        except DATABASE_WIDE:  # the worker retries it, or stops on damage
            raise
        except BackendError as exc:
            if len(items) > 1:
                middle = len(items) // 2
                return await self._write(items[:middle]) + await self._write(items[middle:])
            return await self._refused(items[0], exc)
        self._count(items)
        self._observe(items, applied)
        return applied

    def _observe(self, items: Sequence[Outcome], applied: int) -> None:
        if self.observer is NO_OBSERVER:
            return
        held = self.registry.held
        names = [
            (h.delivery.queue, h.delivery.task) if (h := held.get(item.id)) is not None else ("", "") for item in items
        ]
        self.observer.flushed("finish" if isinstance(items[0], Finish) else "retry", items, applied, names)

    async def _statement(self, items: Sequence[Outcome], splits: bool = False) -> int:
        """Write ``items`` in one statement, retried while the database is away (``splits``: see
        :meth:`BackendCalls.call`)."""
        now, backend, give_up = self.clock(), self.calls.backend, self._should_give_up
        if isinstance(items[0], Finish):
            finishes = JobsFinishParams(cast(Sequence[Finish], items), now)
            return await self.calls.call(
                backend.jobs_finish_many, finishes, give_up=give_up, what="finish", splits=splits, refused=True
            )
        retries = JobsRetryParams(cast(Sequence[RetryItem], items), now)
        return await self.calls.call(
            backend.jobs_retry_many, retries, give_up=give_up, what="retry", splits=splits, refused=True
        )

    async def _refused(self, outcome: Outcome, exc: BackendError) -> int:
        what = outcome.state if isinstance(outcome, Finish) else "retry"
        if isinstance(exc, UnstorableText) and outcome.error is not None:
            # What the handler raised holds text the database's encoding cannot store ('€' in a
            # LATIN1 database): the same outcome (a retry stays a retry), that text escaped.
            escaped = dataclasses.replace(outcome, error=_escaped(outcome.error, exc.encoding))
            try:
                applied = await self._statement([escaped])
            except DATABASE_WIDE:  # the worker retries it, or stops on damage
                raise
            except BackendError as again:  # something else of it is refused too (its result)
                exc = again
            else:
                self._count([escaped])
                self._observe([escaped], applied)
                return applied
        log.error("the database refused the %s outcome of job %s (%s); dead-lettering it", what, outcome.id, exc)
        dead = Finish(
            outcome.id,
            outcome.receipt,
            "dead",
            reason=OUTCOME_REFUSED,
            error=ErrorInfo("OutcomeRefused", storable(f"the database refused this job's {what} outcome: {exc}")),
            ran=outcome.ran if isinstance(outcome, Finish) else True,
            counted=outcome.counted,
        )
        try:
            applied = await self._statement([dead])
        except DATABASE_WIDE:  # the worker retries it, or stops on damage
            raise
        except BackendError as again:
            # Nothing more can be written for this job: its lease will expire and it runs again.
            log.error("could not dead-letter job %s either (%s); its lease will expire", outcome.id, again)
            await self._count_dropped_start(dead)
            return 1
        self._count([dead])
        self._observe([dead], applied)
        return applied

    async def _count_dropped_start(self, dropped: Finish) -> None:
        """Count the start of a run whose outcome could not be written at all: it was to be counted with
        that outcome, and without it the archive would show one delivery fewer than the job's runs
        (``deliveries > attempts`` is how a lost outcome shows)."""
        if dropped.counted or not dropped.ran:
            return
        start = JobsStartParams([LeaseRef(dropped.id, dropped.receipt)], self.clock())
        try:
            backend, give_up = self.calls.backend, self._should_give_up
            await self.calls.call(backend.jobs_start_many, start, give_up=give_up, what="count starts", refused=True)
        except DATABASE_WIDE:  # the worker retries it, or stops on damage
            raise
        except BackendError as exc:
            log.error("could not count the start of job %s either (%s)", dropped.id, exc)

    def _count(self, items: Sequence[Outcome]) -> None:
        for item in items:
            if isinstance(item, RetryItem):
                self.counters.retried += 1
            elif item.state == "completed":
                self.counters.completed += 1
            elif item.state == "dead":
                self.counters.dead += 1
            elif item.state == "expired":
                self.counters.expired += 1

    def _should_give_up(self) -> bool:
        return self._give_up_at is not None and time.monotonic() >= self._give_up_at

    async def run(self) -> None:
        """Flush on a short ticker until stopped, then flush what is left (see :meth:`stop`)."""
        self._loop.bind()
        while not self.stopping:
            await self._wake.wait()
            self._wake.clear()
            with self._lock:
                self._woken = False
            if self.flush_interval > 0 and not self.stopping:
                # Wait a moment so that outcomes finishing together share one statement.
                await asyncio.sleep(self.flush_interval)
            await self.run_once()
        self._give_up_at = time.monotonic() + self.final_timeout
        try:
            while self._pending or self._starts:
                await self.run_once()
        except Exception as exc:  # the database stayed away past the timeout, or a bug
            log.error(
                "could not flush %d outcome(s) before exit: %s; their leases will expire and the jobs will run again",
                len(self._pending),
                exc,
            )
            self.flushed_all = False

    def stop(self) -> None:
        """End the loop after a last flush of everything queued, retrying for up to
        ``final_timeout`` seconds while the database is away; ``flushed_all`` then says whether
        every outcome was written."""
        super().stop()
        self._wake.set()


def _escaped(error: ErrorInfo, encoding: str) -> ErrorInfo:
    """``error`` with each character ``encoding`` cannot hold as its backslash escape (``\\u20ac``), its type
    still at most as long as a filter (escapes lengthen it)."""
    type_, message, traceback = (
        text.encode(encoding, "backslashreplace").decode(encoding) for text in dataclasses.astuple(error)
    )
    return ErrorInfo(type_name(type_), message, traceback)
