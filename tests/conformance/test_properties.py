"""Property-based tests: random operation sequences on the storage seam, run on every engine at once.

A Hypothesis state machine (:class:`SeamMachine`) drives the same steps through the memory, SQLite
and PostgreSQL engines side by side, one database per engine for the whole test (emptied between
examples: a new in-memory database, DELETE on the SQLite file, TRUNCATE on PostgreSQL). After every
step it compares what each engine answered and everything each engine holds, and checks the answers
against a small model of the contract in ``conveyor.backends.base``.

Steps (each with the variants the contract names):

- insert: batches of new jobs (queues, tasks, priorities, ``run_at`` now, past or future, TTLs,
  ordering keys, idempotency keys with or without a dedup window, ``fresh`` True only for ids never
  sent) and resends of ids already sent (live, archived, deduplicated, pruned), alone or in a batch;
  a bulk batch of fresh ids (PostgreSQL's COPY path);
- acquire (two queues, limits 0-4, two workers, several visibility timeouts), start, finish
  (completed, dead, expired, cancelled; ran or not; counted or not, as a worker would say it),
  retry, release, extend: naming current deliveries, stale ones (an earlier delivery of a job that
  was handed out again, or ended) and receipts no engine ever issued;
- rescue of expired leases (bounded and not), the clock advanced by steps from a microsecond to an
  hour or exactly onto (or just past) a lease expiry, a ``run_at``, a key's expiry or a schedule tick;
- dead letters: replay (of dead letters, replayed ones, jobs that are not dead, unknown ids, one
  letter named twice), purge; operator audit rows (``audit_insert``);
- keys: processed-key claims, ``keys_prune``; retention: ``archive_prune`` with default and per-queue
  cutoffs for both kinds of rows;
- schedules (upsert, update, delete, fire on the due tick or another), subscriptions (upsert, list,
  delete);
- reads: ``job_get``, ``jobs_list`` (queue filter, cursor, limit), ``dead_list`` (filters, offset and keyset paging),
  ``archive_read`` (watermarks, limit), ``queue_load``, ``audit_list``; ``queues_stats`` and full
  listings after every step.

What is compared, and what is normalised (see ``_engines``): return values whole (counts, id lists in
their order, deliveries field by field); every job record, live and archived; stats, dead letters,
audit rows, schedules, subscriptions. Receipts are random per engine, so a delivery is named by its
hand-out number; JSON text is compared parsed (jsonb spells it its own way); ``oldest_pending_age``
is rounded to the microsecond; an audit row's ``job_ids`` are compared as a set. Times are compared
exactly: every engine is given the same clock.

Where the contract leaves a choice to the engine, the steps avoid depending on it, and say so at the
step: which of several equally old leases a bounded rescue takes, which expired keys or archived
rows a bounded prune deletes first (the steps prune until nothing is left and compare the counts;
PostgreSQL may drop a whole partition past ``limit``), and the audit ``details`` document (the
engines word it differently: PostgreSQL adds ``requested`` and counts a purge as ``purged``, SQLite
as ``count``). Inputs stay within what the layers above the seam send: no NUL or lone surrogate in
text, a dedup window that ends after now, a call never names one delivery twice (two deliveries of
one job, yes), a scheduler's job has no idempotency key (PostgreSQL inserts it without a claim,
by design; SQLite would claim it).

The memory engine is the SQLite engine on a private in-memory database, so it is the reference the
others are compared with: any difference between it and the SQLite file is a drift as well.

Model invariants checked on every engine after every step: a job is never both live and archived;
no job disappears except by purge or retention; ``deliveries >= attempts``; at most one job per
(queue, ordering key) in flight; an operation changes only the jobs it names (so a stale or unknown
receipt changes nothing) and its count is the number of current deliveries it named; acquire hands
out exactly what the contract's order and per-key FIFO rule pick; an insert answers and inserts
what the dedup and accept-an-id-once rules say; stats and the DLQ listing agree with the records.

Runs are reproducible: the ``ci`` Hypothesis profile (``tests/conftest.py``) is derandomized, with
40 examples of up to 40 steps (about 20 s on an idle two-core machine). ``--hypothesis-profile soak`` runs 1,000
examples from random seeds; a failure prints its steps and a ``@reproduce_failure`` blob. The
examples it found and that were fixed are pinned in ``test_engine_agreement.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar
from uuid import UUID

import pytest
from _engines import (
    ENGINES,
    Engines,
    Snapshot,
    agree,
    audit,
    delivery,
    open_engines,
    parse_json,
    record,
    schedule,
    snapshot,
)
from _factory import T0
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from conveyor.backends.base import (
    ArchivePruneParams,
    ArchiveReadParams,
    AuditInsertParams,
    AuditListParams,
    Backend,
    DeadListParams,
    DeadPurgeParams,
    DeadReplayParams,
    ErrorInfo,
    Finish,
    JobGetParams,
    JobsAcquireParams,
    JobsFinishParams,
    JobsInsertParams,
    JobsListParams,
    JobsReleaseParams,
    JobsRescueParams,
    JobsRetryParams,
    JobsStartParams,
    KeysPruneParams,
    LeaseRef,
    LeasesExtendParams,
    NewJob,
    ProcessedKeyClaimParams,
    QueueLoadParams,
    RetryItem,
    Schedule,
    ScheduleFireParams,
    ScheduleMoveParams,
    SchedulesDeleteParams,
    SchedulesUpdateParams,
    SchedulesUpsertParams,
    Subscription,
    SubscriptionsDeleteParams,
    SubscriptionsListParams,
    SubscriptionsUpsertParams,
    TerminalState,
)

_T = TypeVar("_T")
Rec = dict[str, Any]

QUEUES = ("q1", "q2")
TASKS = ("t.add", "t.mail")
ORDERING_KEYS = (None, None, "k1", "k2")
IDEMPOTENCY_KEYS = (None, None, "i1", "i2", "i3")
WORKERS = ("w1", "w2")
#: Visibility timeouts (seconds); 0.1 is no binary fraction, so a float sum would round.
VISIBILITY_TIMEOUTS = (0.1, 1.0, 2.5, 30.0)
#: Clock steps (seconds).
STEPS = (0.000001, 0.001, 0.1, 1.0, 5.0, 30.0, 61.0, 3600.0)
BOGUS_RECEIPTS = ("not-a-receipt", "00000000-0000-0000-0000-000000000000", "0" * 32)
US = timedelta(microseconds=1)

# Text that passes the checks above the seam: valid Unicode without NUL (see conveyor._limits).
_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)
_JSON = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6
)
_OBJECTS = st.dictionaries(_TEXT, _JSON, max_size=3)


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


@dataclass
class Handed:
    """Delivery #n: its job, each engine's receipt for it, whether its start was counted."""

    job: UUID
    receipts: dict[str, str]
    started: bool = False


class SeamMachine(RuleBasedStateMachine):
    """Every rule runs one operation on every engine, then :meth:`settle` compares and checks."""

    engines: ClassVar[Engines]

    def __init__(self) -> None:
        super().__init__()
        self.backends = self.engines.reset()
        self.now = T0
        self.seq = 0
        self.sent: dict[UUID, NewJob] = {}
        self.handed: list[Handed] = []
        self.receipts: dict[str, set[str]] = {name: set() for name in ENGINES}
        # The model's idempotency keys ((queue, key) -> (holder, expires_at)) and processed keys.
        self.keys: dict[tuple[str, str], tuple[UUID, datetime | None]] = {}
        self.processed: dict[str, datetime] = {}
        # Every terminal row ever seen, (id, finished_at) -> (queue, state): the per-queue totals
        # count each ending once, and retention, replay and purge never lower them. (A step is
        # followed by a snapshot, so every archived row is seen before a later step prunes it; an id
        # pruned and sent again ends again, at another finished_at.)
        self.ended: dict[tuple[UUID, datetime], tuple[str, str]] = {}
        self.snap = self._snapshot()

    # ---------------------------------------------------------------------------------- helpers

    def each(self, what: str, call: Callable[[Backend, str], _T]) -> dict[str, _T]:
        """``call`` on every engine; an exception names the engine it came from."""
        answers: dict[str, _T] = {}
        for name, backend in self.backends.items():
            try:
                answers[name] = call(backend, name)
            except Exception as exc:
                exc.add_note(f"raised by the {name} engine during {what}")
                raise
        return answers

    def same(self, what: str, call: Callable[[Backend, str], _T]) -> _T:
        return agree(what, self.each(what, call))

    def _snapshot(self) -> Snapshot:
        return agree("the stored state", self.each("snapshot", lambda b, _: snapshot(b, self.now)))

    def settle(self, changed: set[UUID] | None, removable: frozenset[UUID] = frozenset()) -> Snapshot:
        """Compare every engine's state, check the model's invariants, and check that only the jobs
        in ``changed`` (None: any) changed and only those in ``removable`` disappeared."""
        before, after = self.snap, self._snapshot()
        old, new = before.jobs(), after.jobs()
        assert not {r["id"] for r in after.live} & {r["id"] for r in after.archived}, "a job is live and archived"
        lost = set(old) - set(new) - removable
        assert not lost, f"jobs disappeared: {sorted(lost)}"
        archived_before = {r["id"] for r in before.archived}
        back = archived_before & {r["id"] for r in after.live}
        assert not back, f"archived jobs came back to life: {sorted(back)}"
        if changed is not None:
            moved = [i for i in old if i in new and i not in changed and old[i] != new[i]]
            assert not moved, f"jobs changed that the step did not name: {moved} " + repr(
                [(old[i], new[i]) for i in moved[:2]]
            )
            appeared = set(new) - set(old) - changed
            assert not appeared, f"jobs appeared that the step did not insert: {sorted(appeared)}"
        for r in new.values():
            assert r["deliveries"] >= r["attempts"], f"deliveries < attempts: {r}"
        in_flight = [(r["queue"], r["ordering_key"]) for r in after.live if r["state"] == "processing"]
        keyed = [k for k in in_flight if k[1] is not None]
        assert len(keyed) == len(set(keyed)), f"two jobs of one ordering key in flight: {keyed}"
        for r in after.live:
            assert (r["state"] == "processing") == (r["lease_expires_at"] is not None), r
            assert r["finished_at"] is None and r["reason"] is None and r["replayed_by"] is None, r
        for r in after.archived:
            assert r["finished_at"] is not None and r["lease_expires_at"] is None, r
        self._check_stats(after)
        dead = [r for r in after.archived if r["state"] == "dead" and r["replayed_by"] is None]
        dead.sort(key=lambda r: (r["finished_at"], r["id"]), reverse=True)
        assert after.dead == dead, "dead_list is not the unreplayed dead letters, newest first"
        self.snap = after
        return after

    def _check_stats(self, snap: Snapshot) -> None:
        expected: dict[str, dict[str, Any]] = {}

        def entry(queue: str) -> dict[str, Any]:
            return expected.setdefault(
                queue,
                {
                    "queue": queue,
                    "pending": 0,
                    "scheduled": 0,
                    "processing": 0,
                    "completed": 0,
                    "dead": 0,
                    "expired": 0,
                    "cancelled": 0,
                    "oldest_pending_age": None,
                    "dead_total": 0,
                    "enqueued": 0,
                },
            )

        for r in snap.archived:
            self.ended[(r["id"], r["finished_at"])] = (r["queue"], r["state"])
        for queue, state in self.ended.values():
            e = entry(queue)
            e["dead_total" if state == "dead" else state] += 1
            e["enqueued"] += 1
        for r in snap.live:
            e = entry(r["queue"])
            e["enqueued"] += 1
            if r["state"] == "pending":
                ready = r["run_at"] <= self.now
                e["pending" if ready else "scheduled"] += 1
                if ready:
                    age = round((self.now - r["run_at"]).total_seconds(), 6)
                    e["oldest_pending_age"] = max(e["oldest_pending_age"] or 0.0, age)
            else:
                e["processing"] += 1
        for r in snap.archived:
            if r["state"] == "dead" and r["replayed_by"] is None:
                entry(r["queue"])["dead"] += 1
        assert snap.stats == [expected[q] for q in sorted(expected)], "queues_stats disagrees with the records"

    def new_id(self, data: st.DataObject) -> UUID:
        """A never-used id. Its leading digit is drawn, so that a new id may sort before older ones
        (a job minted earlier but committed later), which per-key FIFO must handle."""
        self.seq += 1
        return UUID(int=(data.draw(st.integers(1, 3), label="id prefix") << 124) | self.seq)

    def new_job(self, data: st.DataObject, queue: str | None = None) -> NewJob:
        key = data.draw(st.sampled_from(IDEMPOTENCY_KEYS), label="idempotency_key")
        return NewJob(
            id=self.new_id(data),
            queue=queue or data.draw(st.sampled_from(QUEUES), label="queue"),
            task=data.draw(st.sampled_from(TASKS), label="task"),
            payload=json.dumps(data.draw(_OBJECTS, label="payload")),
            headers=json.dumps({"schema_version": 1, **data.draw(_OBJECTS, label="headers")}),
            priority=data.draw(st.sampled_from((0, 0, 1, -1, 5)), label="priority"),
            run_at=self.now + _s(data.draw(st.sampled_from((0, 0, 0, -3, 1, 5, 30.5)), label="run_at +s")),
            max_attempts=data.draw(st.integers(1, 5), label="max_attempts"),
            max_deliveries=data.draw(st.integers(1, 10), label="max_deliveries"),
            expires_at=data.draw(st.sampled_from((None, None, self.now + _s(10))), label="expires_at"),
            idempotency_key=key,
            ordering_key=data.draw(st.sampled_from(ORDERING_KEYS), label="ordering_key"),
            # The app gives every key a window after now (a window must be positive), or none.
            dedup_until=self._window(data) if key is not None else None,
            fresh=data.draw(st.booleans(), label="fresh"),
        )

    def _window(self, data: st.DataObject) -> datetime | None:
        return data.draw(
            st.sampled_from((None, self.now + US, self.now + _s(1), self.now + _s(60))), label="dedup_until"
        )

    def expected_inserts(self, jobs: list[NewJob]) -> tuple[list[UUID], set[UUID]]:
        """What the contract answers for ``jobs`` (each stored id) and which ids it inserts; updates
        the model's keys. A key is held until its window has passed (``expires_at <= now`` frees it);
        an id is accepted once (live or archived)."""
        present = set(self.snap.jobs())
        answer: list[UUID] = []
        inserted: set[UUID] = set()
        for job in jobs:
            if job.idempotency_key is not None:
                k = (job.queue, job.idempotency_key)
                holder = self.keys.get(k)
                if holder is not None and (holder[1] is None or holder[1] > self.now):
                    answer.append(holder[0])
                    continue
                self.keys[k] = (job.id, job.dedup_until)
            answer.append(job.id)
            if job.id not in present:
                present.add(job.id)
                inserted.add(job.id)
        return answer, inserted

    def check_new_record(self, job: NewJob, replay_of: UUID | None = None) -> None:
        r = self.snap.jobs()[job.id]
        expected = {
            **record_template(),
            "id": job.id,
            "queue": job.queue,
            "task": job.task,
            "payload": parse_json(job.payload),
            "headers": parse_json(job.headers),
            "state": "pending",
            "priority": job.priority,
            "run_at": job.run_at,
            "enqueued_at": self.now,
            "expires_at": job.expires_at,
            "max_attempts": job.max_attempts,
            "max_deliveries": job.max_deliveries,
            "idempotency_key": job.idempotency_key,
            "ordering_key": job.ordering_key,
            "replay_of": replay_of,
        }
        assert r == expected, (r, expected)

    def current(self, number: int) -> bool:
        """Whether delivery #number still holds its job's lease."""
        handed = self.handed[number]
        latest = max(n for n, h in enumerate(self.handed) if h.job == handed.job)
        job = self.snap.jobs().get(handed.job)
        return latest == number and job is not None and job["state"] == "processing"

    def draw_refs(self, data: st.DataObject, most: int = 3) -> list[tuple[int | None, UUID, dict[str, str]]]:
        """Deliveries to name in one call: (#n or None for a receipt nobody issued, job, receipts).
        A worker never names one delivery twice in a call, so neither do these."""
        numbers = data.draw(
            st.lists(st.integers(0, len(self.handed) - 1), min_size=1, max_size=most, unique=True), label="#n"
        )
        refs: list[tuple[int | None, UUID, dict[str, str]]] = [
            (n, self.handed[n].job, self.handed[n].receipts) for n in numbers
        ]
        if data.draw(st.integers(0, 4), label="bogus receipt") == 0:
            bogus = data.draw(st.sampled_from(BOGUS_RECEIPTS), label="receipt")
            where = data.draw(st.integers(0, len(refs)), label="at")
            refs.insert(where, (None, self.handed[numbers[0]].job, dict.fromkeys(ENGINES, bogus)))
        return refs

    def live(self, job_id: UUID) -> Rec:
        return next(r for r in self.snap.live if r["id"] == job_id)

    # ------------------------------------------------------------------------------- producing

    @initialize()
    def start(self) -> None:
        assert self.snap.live == [] and self.snap.archived == []

    @rule(data=st.data())
    def insert(self, data: st.DataObject) -> None:
        jobs: list[NewJob] = []
        for _ in range(data.draw(st.integers(1, 4), label="batch size")):
            pool = [*self.sent.values(), *jobs]
            if pool and data.draw(st.integers(0, 3), label="resend?") == 0:
                # A producer's resend: the same message, under a new window (the app computes it
                # at each send), and never fresh.
                again = data.draw(st.sampled_from(pool), label="resend of")
                window = self._window(data) if again.idempotency_key is not None else None
                jobs.append(replace(again, fresh=False, dedup_until=window))
            else:
                jobs.append(self.new_job(data))
        self._insert(jobs)

    @rule(data=st.data())
    def insert_again(self, data: st.DataObject) -> None:
        """The same as ``insert``: a second rule doubles its share of the steps."""
        self.insert(data)

    @rule(data=st.data())
    def insert_bulk(self, data: st.DataObject) -> None:
        """A batch big enough for PostgreSQL's COPY path (64 fresh ids, no keys), sometimes with a
        resend of a live id at its end (COPY then fails and the statement path takes the batch)."""
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        jobs = [
            replace(self.new_job(data, queue), idempotency_key=None, dedup_until=None, fresh=True) for _ in range(64)
        ]
        if len(self.snap.live) > 0 and data.draw(st.booleans(), label="resend a live id"):
            jobs.append(replace(self.sent[self.snap.live[0]["id"]], fresh=False))
        self._insert(jobs)

    def _insert(self, jobs: list[NewJob]) -> None:
        expected, inserted = self.expected_inserts(jobs)
        for job in jobs:
            self.sent.setdefault(job.id, job)
        answer = self.same("jobs_insert_many", lambda b, _: b.jobs_insert_many(JobsInsertParams(jobs, self.now)))
        assert answer == expected, f"insert answered {answer}, the contract says {expected}"
        self.settle(changed=inserted)
        for job in {j.id: j for j in reversed(jobs)}.values():
            if job.id in inserted:
                self.check_new_record(self.sent[job.id])

    # ------------------------------------------------------------------------------- consuming

    def expected_acquire(self, queue: str, limit: int) -> list[UUID]:
        live = self.snap.live

        def eligible(r: Rec) -> bool:
            if r["queue"] != queue or r["state"] != "pending" or r["run_at"] > self.now:
                return False
            if r["ordering_key"] is None:
                return True
            same = [x for x in live if x["queue"] == queue and x["ordering_key"] == r["ordering_key"]]
            return all(x["id"] >= r["id"] for x in same) and all(x["state"] == "pending" for x in same)

        ready = sorted(filter(eligible, live), key=lambda r: (-r["priority"], r["run_at"], r["id"]))
        return [r["id"] for r in ready[: max(limit, 0)]]

    @rule(
        queue=st.sampled_from(QUEUES),
        limit=st.integers(0, 4),
        vt=st.sampled_from(VISIBILITY_TIMEOUTS),
        worker=st.sampled_from(WORKERS),
    )
    def acquire(self, queue: str, limit: int, vt: float, worker: str) -> None:
        expected = self.expected_acquire(queue, limit)
        before = {i: self.live(i) for i in expected}
        params = JobsAcquireParams(queue=queue, limit=limit, visibility_timeout=vt, worker_id=worker, now=self.now)
        answers = self.each("jobs_acquire", lambda b, _: b.jobs_acquire(params))
        first = len(self.handed)
        agree(
            "jobs_acquire",
            {name: [delivery(d, first + i) for i, d in enumerate(ds)] for name, ds in answers.items()},
        )
        got = [d.id for d in answers[ENGINES[0]]]
        assert got == expected, f"acquire handed out {got}, the contract picks {expected}"
        for i, job_id in enumerate(got):
            receipts = {name: ds[i].receipt for name, ds in answers.items()}
            for name, receipt in receipts.items():
                assert receipt not in self.receipts[name], f"{name} handed out receipt {receipt} twice"
                self.receipts[name].add(receipt)
            self.handed.append(Handed(job_id, receipts))
            d, r = answers[ENGINES[0]][i], before[job_id]
            assert (d.attempts, d.deliveries, d.rescues) == (r["attempts"], r["deliveries"], r["rescues"])
            assert d.lease_expires_at == self.now + _s(vt), (d.lease_expires_at, self.now + _s(vt))
        after = self.settle(changed=set(got))
        for job_id in got:
            r, old = after.jobs()[job_id], before[job_id]
            assert r == {
                **old,
                "state": "processing",
                "lease_expires_at": self.now + _s(vt),
                "worker_id": worker,
                "started_at": self.now,
                "first_started_at": old["first_started_at"] or self.now,
            }, (r, old)

    @rule(
        queue=st.sampled_from(QUEUES),
        limit=st.integers(1, 4),
        vt=st.sampled_from(VISIBILITY_TIMEOUTS),
        worker=st.sampled_from(WORKERS),
    )
    def acquire_again(self, queue: str, limit: int, vt: float, worker: str) -> None:
        """The same as ``acquire``: a second rule doubles its share of the steps."""
        self.acquire(queue, limit, vt, worker)

    @precondition(lambda self: len(self.handed) > 0)
    @rule(data=st.data())
    def start_many(self, data: st.DataObject) -> None:
        refs = self.draw_refs(data)
        current = [(n, job) for n, job, _ in refs if n is not None and self.current(n)]
        before = {job: self.live(job) for _, job in current}
        answer = self.same(
            "jobs_start_many",
            lambda b, name: b.jobs_start_many(
                JobsStartParams(items=[LeaseRef(job, rs[name]) for _, job, rs in refs], now=self.now)
            ),
        )
        assert answer == [job for _, job in current], (answer, current)
        after = self.settle(changed={job for _, job in current})
        for n, job in current:
            self.handed[n].started = True
            assert after.jobs()[job] == {**before[job], "deliveries": before[job]["deliveries"] + 1}

    @precondition(lambda self: len(self.handed) > 0)
    @rule(data=st.data())
    def finish_many(self, data: st.DataObject) -> None:
        refs = self.draw_refs(data)
        states: tuple[TerminalState, ...] = ("completed", "completed", "dead", "expired", "cancelled")
        items: list[tuple[int | None, UUID, dict[str, str], TerminalState, bool, Any, str | None, ErrorInfo | None]]
        items = []
        for n, job, receipts in refs:
            state = data.draw(st.sampled_from(states), label="state")
            ran = data.draw(st.booleans(), label="ran")
            result = data.draw(_JSON, label="result") if state == "completed" else None
            reason = None if state == "completed" else data.draw(st.sampled_from((None, "max_attempts_exceeded")))
            error = None
            if state != "completed" and data.draw(st.booleans(), label="error?"):
                error = ErrorInfo(data.draw(_TEXT, label="error type"), data.draw(_TEXT), data.draw(_TEXT))
            items.append((n, job, receipts, state, ran, result, reason, error))
        applied = {job: i for i, (n, job, *_) in enumerate(items) if n is not None and self.current(n)}
        before = {job: self.live(job) for job in applied}

        def call(b: Backend, name: str) -> int:
            finishes = [
                Finish(
                    id=job,
                    receipt=receipts[name],
                    state=state,
                    result=None if state != "completed" else json.dumps(result),
                    reason=reason,
                    error=error,
                    ran=ran,
                    counted=n is not None and self.handed[n].started,
                )
                for n, job, receipts, state, ran, result, reason, error in items
            ]
            return b.jobs_finish_many(JobsFinishParams(items=finishes, now=self.now))

        assert self.same("jobs_finish_many", call) == len(applied)
        after = self.settle(changed=set(applied))
        for job, i in applied.items():
            n, _, _, state, ran, result, reason, error = items[i]
            old = before[job]
            counted = n is not None and self.handed[n].started
            expected = {
                **old,
                "state": state,
                "attempts": old["attempts"] + ran,
                "deliveries": old["deliveries"] + (ran and not counted),
                "lease_expires_at": None,
                "finished_at": self.now,
                "result": parse_json(json.dumps(result)) if state == "completed" else None,
                "reason": reason,
            }
            if error is not None:
                expected |= {"error_type": error.type, "error_message": error.message, "traceback": error.traceback}
            assert after.jobs()[job] == expected, (after.jobs()[job], expected)

    @precondition(lambda self: len(self.handed) > 0)
    @rule(data=st.data())
    def retry_many(self, data: st.DataObject) -> None:
        refs = self.draw_refs(data)
        items = [
            (n, job, receipts, self.now + _s(data.draw(st.sampled_from((0, 0, 1, 10, -1)), label="retry in")))
            for n, job, receipts in refs
        ]
        error = ErrorInfo("IOError", data.draw(_TEXT, label="message"), "Traceback ...")
        applied = {job: i for i, (n, job, _, _) in enumerate(items) if n is not None and self.current(n)}
        before = {job: self.live(job) for job in applied}

        def call(b: Backend, name: str) -> int:
            retries = [
                RetryItem(job, receipts[name], run_at, error, counted=n is not None and self.handed[n].started)
                for n, job, receipts, run_at in items
            ]
            return b.jobs_retry_many(JobsRetryParams(items=retries, now=self.now))

        assert self.same("jobs_retry_many", call) == len(applied)
        after = self.settle(changed=set(applied))
        for job, i in applied.items():
            n, _, _, run_at = items[i]
            old = before[job]
            counted = n is not None and self.handed[n].started
            assert after.jobs()[job] == {
                **old,
                "state": "pending",
                "run_at": run_at,
                "attempts": old["attempts"] + 1,
                "deliveries": old["deliveries"] + (not counted),
                "lease_expires_at": None,
                "error_type": error.type,
                "error_message": error.message,
                "traceback": error.traceback,
            }, (after.jobs()[job], old)

    @precondition(lambda self: len(self.handed) > 0)
    @rule(data=st.data())
    def release_many(self, data: st.DataObject) -> None:
        refs = self.draw_refs(data)
        applied = [job for n, job, _ in refs if n is not None and self.current(n)]
        before = {job: self.live(job) for job in applied}
        count = self.same(
            "jobs_release_many",
            lambda b, name: b.jobs_release_many(
                JobsReleaseParams(items=[LeaseRef(job, rs[name]) for _, job, rs in refs], now=self.now)
            ),
        )
        assert count == len(applied)
        after = self.settle(changed=set(applied))
        for job in applied:
            old = before[job]
            never = old["deliveries"] == 0
            assert after.jobs()[job] == {
                **old,
                "state": "pending",
                "lease_expires_at": None,
                "worker_id": None,
                "first_started_at": None if never else old["first_started_at"],
                "started_at": None if never else old["started_at"],
            }, (after.jobs()[job], old)

    @precondition(lambda self: len(self.handed) > 0)
    @rule(data=st.data(), vt=st.sampled_from(VISIBILITY_TIMEOUTS))
    def extend_many(self, data: st.DataObject, vt: float) -> None:
        refs = self.draw_refs(data)
        current = [job for n, job, _ in refs if n is not None and self.current(n)]
        before = {job: self.live(job) for job in current}
        answer = self.same(
            "leases_extend_many",
            lambda b, name: b.leases_extend_many(
                LeasesExtendParams(
                    items=[LeaseRef(job, rs[name]) for _, job, rs in refs], visibility_timeout=vt, now=self.now
                )
            ),
        )
        assert answer == current, (answer, current)
        after = self.settle(changed=set(current))
        for job in current:
            assert after.jobs()[job] == {**before[job], "lease_expires_at": self.now + _s(vt)}

    @rule(limit=st.sampled_from((1, 2, 1000)))
    def rescue_expired(self, limit: int) -> None:
        expired = sorted(
            (r for r in self.snap.live if r["state"] == "processing" and r["lease_expires_at"] < self.now),
            key=lambda r: r["lease_expires_at"],
        )
        # Which of several equally old leases a bounded rescue takes is the engine's choice: when the
        # limit would cut between equal leases, rescue them all (the count is still checked).
        if limit < len(expired) and expired[limit - 1]["lease_expires_at"] == expired[limit]["lease_expires_at"]:
            limit = len(expired)
        chosen = expired[:limit]
        count = self.same("jobs_rescue_expired", lambda b, _: b.jobs_rescue_expired(JobsRescueParams(self.now, limit)))
        assert count == len(chosen)
        after = self.settle(changed={r["id"] for r in chosen})
        for old in chosen:
            assert after.jobs()[old["id"]] == {
                **old,
                "state": "pending",
                "lease_expires_at": None,
                "rescues": old["rescues"] + 1,
            }, (after.jobs()[old["id"]], old)

    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        """Move the clock by a step, or exactly onto (or a microsecond past) a time that matters."""
        marks = sorted(
            {
                *(r["lease_expires_at"] for r in self.snap.live if r["lease_expires_at"] is not None),
                *(r["run_at"] for r in self.snap.live),
                *(expiry for _, expiry in self.keys.values() if expiry is not None),
                *self.processed.values(),
                *(s["next_run_at"] for s in self.snap.schedules),
            }
            - {None}
        )
        marks = [m for m in marks if m > self.now]
        if len(marks) > 0 and data.draw(st.booleans(), label="onto a mark"):
            self.now = data.draw(st.sampled_from(marks), label="mark") + data.draw(st.sampled_from((0 * US, US)))
        else:
            self.now += _s(data.draw(st.sampled_from(STEPS), label="step"))
        self.settle(changed=set())

    # --------------------------------------------------------------------------- dead letters

    def draw_archived_ids(self, data: st.DataObject) -> list[UUID]:
        """Ids for an operator call: dead letters mostly, and jobs that are not (or no longer) dead."""
        pool = [r["id"] for r in self.snap.dead] * 3 + [r["id"] for r in self.snap.archived]
        pool += [r["id"] for r in self.snap.live[:2]] + [UUID(int=7)]
        return data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True), label="ids")

    @rule(data=st.data())
    def dead_replay(self, data: st.DataObject) -> None:
        dead = {r["id"]: r for r in self.snap.dead}
        ids = self.draw_archived_ids(data)
        if data.draw(st.integers(0, 3), label="name one twice") == 0:
            ids.append(ids[0])
        pairs = [(i, self.new_id(data)) for i in ids]
        # A dead letter named twice is replayed once, as its first pair says.
        firsts = {d: n for d, n in reversed(pairs)}
        expected = [(d, n) for d, n in pairs if d in dead and firsts[d] == n]
        answer = self.same(
            "dead_replay_many",
            lambda b, _: b.dead_replay_many(DeadReplayParams(pairs, actor="ops", reason="fixed", now=self.now)),
        )
        assert answer == expected, (answer, expected)
        after = self.settle(changed={i for pair in expected for i in pair})
        for d, n in expected:
            assert after.jobs()[d] == {**dead[d], "replayed_by": n}
            old = dead[d]
            job = NewJob(
                id=n,
                queue=old["queue"],
                task=old["task"],
                # The JSON text as it was sent (every job of the test was sent through it).
                payload=self.sent[d].payload,
                headers=self.sent[d].headers,
                priority=old["priority"],
                run_at=self.now,
                max_attempts=old["max_attempts"],
                max_deliveries=old["max_deliveries"],
                idempotency_key=old["idempotency_key"],
                ordering_key=old["ordering_key"],
            )
            self.sent[n] = job
            self.check_new_record(job, replay_of=d)
        entry = after.audit[0]
        assert (entry["action"], entry["job_ids"]) == ("replay", sorted(d for d, _ in expected)), entry

    @rule(data=st.data())
    def audit_insert(self, data: st.DataObject) -> None:
        """An operator action that changed no job (a schedule paused, a token made)."""
        ids = data.draw(st.lists(st.sampled_from([*self.sent, UUID(int=7)]), max_size=2), label="job ids")
        details = json.dumps(data.draw(_OBJECTS, label="details"))
        params = AuditInsertParams("ops", "schedule.pause", reason="", now=self.now, job_ids=ids, details=details)
        self.same("audit_insert", lambda b, _: b.audit_insert(params))
        after = self.settle(changed=set())
        entry = after.audit[0]
        assert (entry["action"], entry["at"], entry["job_ids"]) == ("schedule.pause", self.now, sorted(ids)), entry

    @rule(data=st.data())
    def dead_purge(self, data: st.DataObject) -> None:
        ids = self.draw_archived_ids(data)
        jobs = self.snap.jobs()
        purged = frozenset(i for i in ids if i in jobs and jobs[i]["state"] == "dead")
        count = self.same(
            "dead_purge_many",
            lambda b, _: b.dead_purge_many(DeadPurgeParams(ids, actor="ops", reason="gdpr", now=self.now)),
        )
        assert count == len(purged)
        after = self.settle(changed=set(purged), removable=purged)
        assert not purged & set(after.jobs())
        assert (after.audit[0]["action"], after.audit[0]["job_ids"]) == ("purge", sorted(purged))

    # ------------------------------------------------------------------------------ retention

    def _prune(self, what: str, call: Callable[[Backend], int]) -> dict[str, list[int]]:
        """Call ``call`` until it deletes nothing; each engine's counts, call by call. Which rows a
        bounded call deletes first is the engine's choice, so only the end state is compared."""
        counts: dict[str, list[int]] = {}
        for name, backend in self.backends.items():
            counts[name] = []
            while not counts[name] or counts[name][-1]:
                counts[name].append(call(backend))
                assert len(counts[name]) < 100, f"{name}: {what} never reaches 0"
        return counts

    @rule(data=st.data())
    def processed_key_claim(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(("p1", "p2")), label="key")
        expires = self.now + _s(data.draw(st.sampled_from((1, 5, 60)), label="ttl"))
        held = self.processed.get(key)
        expected = held is None or held <= self.now
        answer = self.same(
            "processed_keys_claim",
            lambda b, _: b.processed_keys_claim(ProcessedKeyClaimParams(key, expires, self.now)),
        )
        assert answer == expected
        if expected:
            self.processed[key] = expires
        self.settle(changed=set())

    @rule(limit=st.sampled_from((1, 2, 10_000)))
    def keys_prune(self, limit: int) -> None:
        # An expired key is one whose expires_at <= now: claims take it over from then on.
        idem = [k for k, (_, exp) in self.keys.items() if exp is not None and exp <= self.now]
        proc = [k for k, exp in self.processed.items() if exp <= self.now]
        counts = agree(
            "keys_prune", self._prune("keys_prune", lambda b: b.keys_prune(KeysPruneParams(self.now, limit)))
        )
        total = len(idem) + len(proc)
        assert counts == [min(limit, total - done) for done in range(0, total, limit)] + [0], (counts, total)
        for k in idem:
            del self.keys[k]
        for p in proc:
            del self.processed[p]
        self.settle(changed=set())

    @rule(data=st.data(), limit=st.sampled_from((1, 3, 10_000)))
    def archive_prune(self, data: st.DataObject, limit: int) -> None:
        ago = st.sampled_from((0, 1, 30, 3600))
        default = self.now - _s(data.draw(ago, label="default ago"))
        default_dead = self.now - _s(data.draw(ago, label="dead ago"))
        before = {"q1": self.now - _s(data.draw(ago))} if data.draw(st.booleans(), label="q1 cutoff") else {}
        dead_before = {"q2": self.now - _s(data.draw(ago))} if data.draw(st.booleans(), label="q2 dead") else {}

        def cutoff(r: Rec) -> datetime:
            if r["state"] == "dead":
                return dead_before.get(r["queue"], default_dead)
            return before.get(r["queue"], default)

        doomed = frozenset(r["id"] for r in self.snap.archived if r["finished_at"] < cutoff(r))
        params = ArchivePruneParams(self.now, default, default_dead, before, dead_before, limit)
        counts = self._prune("archive_prune", lambda b: b.archive_prune(params))
        # PostgreSQL drops whole daily partitions, whose rows all count (the contract allows more than
        # `limit` then); the other engines delete at most `limit` a call.
        for name, per_call in counts.items():
            assert sum(per_call) == len(doomed), (name, per_call, len(doomed))
            if name != "postgres":
                assert max(per_call) <= limit, (name, per_call)
        after = self.settle(changed=set(doomed), removable=doomed)
        assert not doomed & set(after.jobs())

    # ------------------------------------------------------------------------------ schedules

    @rule(data=st.data(), op=st.sampled_from(("upsert", "update", "delete", "fire", "fire", "move")))
    def schedules(self, data: st.DataObject, op: str) -> None:
        """One schedule operation (one rule for all of them, so that they do not crowd out the job
        lifecycle when Hypothesis picks a rule)."""
        calls = {
            "upsert": self.schedules_upsert,
            "update": self.schedules_update,
            "delete": self.schedules_delete,
            "fire": self.schedule_fire,
            "move": self.schedule_move,
        }
        calls[op](data)

    def schedules_upsert(self, data: st.DataObject) -> None:
        # A name may come twice in one call: the last of them wins.
        names = data.draw(st.lists(st.sampled_from(("s1", "s2")), min_size=1, max_size=3), label="names")
        schedules = [
            Schedule(
                name=name,
                cron=data.draw(st.sampled_from(("* * * * *", "*/5 * * * *")), label="cron"),
                task=data.draw(st.sampled_from(TASKS), label="task"),
                queue=data.draw(st.sampled_from(QUEUES), label="queue"),
                payload=json.dumps(data.draw(_OBJECTS, label="payload")),
                next_run_at=self.now + _s(data.draw(st.sampled_from((0, 60, 300)), label="next in")),
                paused=data.draw(st.booleans(), label="paused"),
                priority=data.draw(st.sampled_from((0, 1)), label="priority"),
                last_run_at=data.draw(st.sampled_from((None, self.now - _s(60))), label="last run"),
            )
            for name in names
        ]
        existing = {s["name"]: s for s in self.snap.schedules}
        self.same("schedules_upsert", lambda b, _: b.schedules_upsert(SchedulesUpsertParams(schedules)))
        after = self.settle(changed=set())
        got = {s["name"]: s for s in after.schedules}
        for s in {s.name: s for s in schedules}.values():
            new = schedule(s)
            if s.name in existing:
                old = existing[s.name]
                new |= {"paused": old["paused"], "last_run_at": old["last_run_at"]}
                if old["cron"] == s.cron:
                    new["next_run_at"] = old["next_run_at"]
            assert got[s.name] == new, (got[s.name], new)

    def schedules_update(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(("s1", "s2", "s3")), label="name")
        paused = data.draw(st.sampled_from((None, True, False)), label="paused")
        change = data.draw(st.booleans(), label="new cron")
        cron, at = ("*/5 * * * *", self.now + _s(300)) if change else (None, None)
        exists = any(s["name"] == name for s in self.snap.schedules)
        answer = self.same(
            "schedules_update",
            lambda b, _: b.schedules_update(SchedulesUpdateParams(name, paused=paused, cron=cron, next_run_at=at)),
        )
        assert answer == exists
        self.settle(changed=set())

    def schedules_delete(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(("s1", "s2", "s3")), label="name")
        exists = any(s["name"] == name for s in self.snap.schedules)
        assert self.same("schedules_delete", lambda b, _: b.schedules_delete(SchedulesDeleteParams(name))) == exists
        self.settle(changed=set())

    def _read(self, data: st.DataObject, name: str, due: datetime) -> tuple[Callable[[Backend], Schedule], bool]:
        """How a scheduler read ``name`` on an engine, with ``due`` as its next tick and maybe a cron
        that is not the stored one (read before an operator changed it), and whether it is stale."""
        stale = data.draw(st.booleans(), label="stale definition")

        def read(backend: Backend) -> Schedule:
            stored = next((x for x in backend.schedules_list() if x.name == name), None)
            if stored is None:
                return Schedule(name, "* * * * *", "t1", "q1", "{}", due)
            return replace(stored, next_run_at=due, cron=f"{stored.cron} " if stale else stored.cron)

        return read, stale

    def schedule_fire(self, data: st.DataObject) -> None:
        """Fire a schedule's tick (due or another one). The scheduler's job has no idempotency key."""
        schedules = {s["name"]: s for s in self.snap.schedules}
        name = data.draw(st.sampled_from(sorted({*schedules, "s3"})), label="schedule")
        s = schedules.get(name)
        due = s["next_run_at"] if s is not None and data.draw(st.booleans(), label="due tick") else self.now
        read, stale = self._read(data, name, due)
        job = replace(self.new_job(data, s["queue"] if s else "q1"), idempotency_key=None, dedup_until=None)
        fires = s is not None and not s["paused"] and s["next_run_at"] == due and not stale
        answer = self.same(
            "schedule_fire",
            lambda b, _: b.schedule_fire(ScheduleFireParams(read(b), due + _s(60), job, self.now)),
        )
        assert answer == fires
        if fires:
            self.sent[job.id] = job
        after = self.settle(changed={job.id} if fires else set())
        if fires:
            self.check_new_record(job)
            fired = next(x for x in after.schedules if x["name"] == name)
            assert (fired["next_run_at"], fired["last_run_at"]) == (due + _s(60), due)

    def schedule_move(self, data: st.DataObject) -> None:
        """Move a schedule's stored tick (or another one) back; nothing is enqueued."""
        schedules = {s["name"]: s for s in self.snap.schedules}
        name = data.draw(st.sampled_from(sorted({*schedules, "s3"})), label="schedule")
        s = schedules.get(name)
        due = s["next_run_at"] if s is not None and data.draw(st.booleans(), label="stored tick") else self.now
        read, stale = self._read(data, name, due)
        moves = s is not None and not s["paused"] and s["next_run_at"] == due and not stale
        to = self.now - _s(60)
        assert self.same("schedule_move", lambda b, _: b.schedule_move(ScheduleMoveParams(read(b), to))) == moves
        after = self.settle(changed=set())
        if moves:
            moved = next(x for x in after.schedules if x["name"] == name)
            assert moved["next_run_at"] == to
            assert moved["last_run_at"] == s["last_run_at"]

    # -------------------------------------------------------------------------- subscriptions

    @rule(data=st.data(), op=st.sampled_from(("upsert", "list", "delete")))
    def subscriptions(self, data: st.DataObject, op: str) -> None:
        calls = {
            "upsert": self.subscriptions_upsert,
            "list": self.subscriptions_list,
            "delete": self.subscriptions_delete,
        }
        calls[op](data)

    def subscriptions_upsert(self, data: st.DataObject) -> None:
        subscriptions = data.draw(
            st.lists(
                st.builds(
                    Subscription,
                    topic=st.sampled_from(("orders", "users")),
                    queue=st.sampled_from(QUEUES),
                    task=st.sampled_from(TASKS),
                    filter=st.sampled_from(("{}", '{"tenant": "a"}', '{"tenant": {"in": ["a", "b"]}}')),
                ),
                min_size=1,
                max_size=3,
            ),
            label="subscriptions",
        )
        self.same("subscriptions_upsert", lambda b, _: b.subscriptions_upsert(SubscriptionsUpsertParams(subscriptions)))
        self.settle(changed=set())

    def subscriptions_list(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from((None, "orders", "users", "none")), label="topic")
        answer = self.same(
            "subscriptions_list",
            lambda b, _: [
                (s.topic, s.queue, s.task, parse_json(s.filter))
                for s in b.subscriptions_list(SubscriptionsListParams(topic))
            ],
        )
        every = [(s["topic"], s["queue"], s["task"], s["filter"]) for s in self.snap.subscriptions]
        assert answer == [s for s in every if topic is None or s[0] == topic]
        self.settle(changed=set())

    def subscriptions_delete(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from(("orders", "users")), label="topic")
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        exists = any((s["topic"], s["queue"]) == (topic, queue) for s in self.snap.subscriptions)
        answer = self.same(
            "subscriptions_delete", lambda b, _: b.subscriptions_delete(SubscriptionsDeleteParams(topic, queue))
        )
        assert answer == exists
        self.settle(changed=set())

    # ---------------------------------------------------------------------------------- reads

    @rule(
        data=st.data(),
        op=st.sampled_from(("job_get", "jobs_list", "dead_list", "archive_read", "queue_load", "audit_list")),
    )
    def read(self, data: st.DataObject, op: str) -> None:
        """One read; every step also reads every table whole (see ``settle``)."""
        calls = {
            "job_get": self.job_get,
            "jobs_list": self.jobs_list,
            "dead_list": self.dead_list,
            "archive_read": self.archive_read,
            "queue_load": self.queue_load,
            "audit_list": self.audit_list,
        }
        calls[op](data)

    def job_get(self, data: st.DataObject) -> None:
        ids = [*self.sent, UUID(int=7)]
        job_id = data.draw(st.sampled_from(ids), label="id")
        answer = self.same(
            "job_get",
            lambda b, _: None if (r := b.job_get(JobGetParams(job_id))) is None else record(r),
        )
        assert answer == self.snap.jobs().get(job_id)
        self.settle(changed=set())

    def jobs_list(self, data: st.DataObject) -> None:
        queue = data.draw(st.sampled_from((None, *QUEUES)), label="queue")
        limit = data.draw(st.sampled_from((1, 2, 1000)), label="limit")
        rows = [r for r in self.snap.live if queue is None or r["queue"] == queue]
        after = data.draw(st.sampled_from([None, *(r["id"] for r in self.snap.live)]), label="after")
        answer = self.same(
            "jobs_list",
            lambda b, _: [record(r) for r in b.jobs_list(JobsListParams(queue=queue, limit=limit, after=after))],
        )
        assert answer == [r for r in rows if after is None or r["id"] > after][:limit]
        self.settle(changed=set())

    def dead_list(self, data: st.DataObject) -> None:
        queue = data.draw(st.sampled_from((None, *QUEUES)), label="queue")
        task = data.draw(st.sampled_from((None, *TASKS)), label="task")
        error_type = data.draw(st.sampled_from((None, "IOError")), label="error_type")
        limit = data.draw(st.sampled_from((1, 100)), label="limit")
        offset = data.draw(st.sampled_from((0, 1)), label="offset")
        cursors = [None, *((r["finished_at"], r["id"]) for r in self.snap.dead)]
        before = data.draw(st.sampled_from(cursors), label="before")
        params = DeadListParams(
            queue=queue, task=task, error_type=error_type, limit=limit, offset=offset, before=before
        )
        answer = self.same("dead_list", lambda b, _: [record(r) for r in b.dead_list(params)])
        rows = [
            r
            for r in self.snap.dead
            if (queue is None or r["queue"] == queue)
            and (task is None or r["task"] == task)
            and (error_type is None or r["error_type"] == error_type)
            and (before is None or (r["finished_at"], r["id"]) < before)
        ]
        assert answer == rows[offset : offset + limit]
        self.settle(changed=set())

    def archive_read(self, data: st.DataObject) -> None:
        limit = data.draw(st.sampled_from((1, 2, 1000)), label="limit")
        rows = self.snap.archived
        marks: list[tuple[datetime, UUID] | None] = [None, *((r["finished_at"], r["id"]) for r in rows)]
        marks += [(r["finished_at"] - US, UUID(int=2**128 - 1)) for r in rows[:1]]
        after = data.draw(st.sampled_from(marks), label="watermark")
        answer = self.same(
            "archive_read", lambda b, _: [record(r) for r in b.archive_read(ArchiveReadParams(after, limit))]
        )
        assert answer == [r for r in rows if after is None or (r["finished_at"], r["id"]) > after][:limit]
        self.settle(changed=set())

    def queue_load(self, data: st.DataObject) -> None:
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        window = data.draw(st.sampled_from((0.1, 1.0, 60.0)), label="window")
        load = self.same("queue_load", lambda b, _: b.queue_load(QueueLoadParams(queue, self.now, window)))
        since = self.now - _s(window)
        drained = [r for r in self.snap.archived if r["queue"] == queue and since <= r["finished_at"] <= self.now]
        assert load.depth == len([r for r in self.snap.live if r["queue"] == queue])
        assert load.drained == len(drained), (load, len(drained))
        self.settle(changed=set())

    def audit_list(self, data: st.DataObject) -> None:
        limit = data.draw(st.sampled_from((1, 100)), label="limit")
        answer = self.same("audit_list", lambda b, _: [audit(e) for e in b.audit_list(AuditListParams(limit))])
        assert answer == self.snap.audit[:limit]
        self.settle(changed=set())


def record_template() -> Rec:
    """Every field of a job record, empty."""
    return {
        "attempts": 0,
        "deliveries": 0,
        "first_started_at": None,
        "started_at": None,
        "lease_expires_at": None,
        "worker_id": None,
        "error_type": None,
        "error_message": None,
        "traceback": None,
        "finished_at": None,
        "result": None,
        "reason": None,
        "replayed_by": None,
        "rescues": 0,
    }


@pytest.fixture(scope="module")
def engines(
    postgres_server_url: str, mysql_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engines]:
    with open_engines(str(tmp_path_factory.mktemp("properties")), postgres_server_url, mysql_server_url) as opened:
        yield opened


def test_every_engine_answers_every_operation_sequence_alike(engines: Engines) -> None:
    SeamMachine.engines = engines
    run_state_machine_as_test(SeamMachine, settings=settings())
