"""Alerts: rules over what the operator API reads, evaluated by ``conveyor serve``, and webhooks.

Rules (each per queue unless said otherwise; a threshold is the value the measure must pass to fire):

- ``dlq_depth``: unreplayed dead letters above the threshold (default 0: any dead letter fires; it
  resolves once they are replayed or purged);
- ``oldest_pending_age``: the oldest ready job older than the queue's SLA (``app.queue(q, sla=)``, or
  a threshold given for the queue or for all queues); off for a queue with neither;
- ``depth``: live jobs (pending, scheduled, processing) above the queue's high-water mark
  (``max_depth``, or a threshold given); off for a queue with neither;
- ``no_worker``: ready jobs and no live worker (one that reported within the staleness window)
  draining the queue; the threshold is the number of ready jobs it tolerates (default 0);
- ``long_transaction`` (database-wide): the oldest open transaction older than the threshold
  (default 300 s); it holds back vacuum on the jobs table (PostgreSQL; SQLite has none).

Evaluation is a pure function (:func:`evaluate`); the state is stored (``Admin.evaluate_alerts``) with
a compare-and-set per change, so that several ``conveyor serve`` processes notify each change once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from numbers import Real
from urllib.parse import urlsplit

from conveyor._errors import ConfigurationError
from conveyor._limits import check_name
from conveyor._queue import QueueOptions
from conveyor.backends.base import AlertState, DatabaseHealth, QueueStats, WorkerInfo

RULES = ("dlq_depth", "oldest_pending_age", "depth", "no_worker", "long_transaction")
#: Rules that apply to one queue (the others are database-wide).
QUEUE_RULES = ("dlq_depth", "oldest_pending_age", "depth", "no_worker")
DEFAULTS: Mapping[str, float] = {"dlq_depth": 0.0, "no_worker": 0.0, "long_transaction": 300.0}
#: The largest threshold accepted (a century in seconds, or that many jobs).
MAX_THRESHOLD = 100 * 365 * 86400.0


def _threshold(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigurationError(f"alert threshold {name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= MAX_THRESHOLD:
        raise ConfigurationError(
            f"alert threshold {name} must be a finite number from 0 to {MAX_THRESHOLD:g}, got {value!r}"
        )
    return number


@dataclass(frozen=True, slots=True)
class AlertRules:
    """Thresholds: ``thresholds`` maps a rule (``dlq_depth``) or a rule on one queue
    (``dlq_depth:emails``) to a number; a queue's own SLA and max_depth come from ``queues`` (the
    App's declarations) unless a threshold names them. ``disabled`` rules are not evaluated.
    Raises ConfigurationError for an unknown rule or a threshold that is not a finite number >= 0
    (NaN would never compare, and an alert on it would never fire)."""

    thresholds: Mapping[str, float] = field(default_factory=dict)
    queues: Mapping[str, QueueOptions] = field(default_factory=dict)
    disabled: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        checked: dict[str, float] = {}
        for key, value in dict(self.thresholds).items():
            rule, colon, queue = str(key).partition(":")
            if rule not in RULES:
                raise ConfigurationError(f"unknown alert rule {rule!r} (rules: {', '.join(RULES)})")
            if colon and rule not in QUEUE_RULES:
                raise ConfigurationError(f"alert rule {rule} is database-wide; it takes no queue")
            if colon:
                # An empty one too ("dlq_depth:=5" was kept as a threshold on no queue, applied nowhere).
                # A name no queue can have (a lone surrogate from a non-UTF-8 argument, too long) would
                # silently never match; say so at start instead.
                check_name(queue, f"the queue of alert rule {rule}", ConfigurationError)
            checked[key] = _threshold(key, value)
        object.__setattr__(self, "thresholds", checked)
        for rule in self.disabled:
            if rule not in RULES:
                raise ConfigurationError(f"unknown alert rule {rule!r} (rules: {', '.join(RULES)})")

    @classmethod
    def parse(cls, items: Iterable[str], queues: Mapping[str, QueueOptions] | None = None) -> AlertRules:
        """Rules from ``RULE[:QUEUE]=NUMBER`` or ``RULE=off`` strings (the CLI's ``--alert``)."""
        thresholds: dict[str, float] = {}
        disabled: set[str] = set()
        for item in items:
            key, sep, text = item.partition("=")
            if not sep:
                raise ConfigurationError(f"--alert wants RULE[:QUEUE]=NUMBER or RULE=off, got {item!r}")
            if text.strip().lower() == "off":
                disabled.add(key)
                continue
            try:
                thresholds[key] = float(text)
            except ValueError:
                raise ConfigurationError(f"alert threshold {key} must be a number, got {text!r}") from None
        return cls(thresholds, dict(queues or {}), frozenset(disabled))

    def threshold(self, rule: str, queue: str | None) -> float | None:
        """The threshold of ``rule`` on ``queue`` (None: the rule is off there)."""
        if rule in self.disabled:
            return None
        if queue is not None and f"{rule}:{queue}" in self.thresholds:
            return self.thresholds[f"{rule}:{queue}"]
        declared = self.queues.get(queue) if queue is not None else None
        if rule == "oldest_pending_age" and declared is not None and declared.sla is not None:
            return declared.sla.total_seconds()
        if rule == "depth" and declared is not None and declared.max_depth is not None:
            return float(declared.max_depth)
        if rule in self.thresholds:
            return self.thresholds[rule]
        return DEFAULTS.get(rule)


def evaluate(
    rules: AlertRules,
    stats: Sequence[QueueStats],
    workers: Sequence[WorkerInfo],
    health: DatabaseHealth,
    now: datetime,
) -> list[AlertState]:
    """Every alert that applies, firing or resolved, measured now (pure: no I/O)."""
    out: list[AlertState] = []

    def check(rule: str, queue: str | None, value: float | None, what: str) -> None:
        threshold = rules.threshold(rule, queue)
        if threshold is None or value is None:
            return
        firing = value > threshold
        where = f"queue {queue}" if queue is not None else "the database"
        message = f"{where}: {what} is {value:g} ({'above' if firing else 'within'} {threshold:g})"
        out.append(AlertState(rule, queue, "firing" if firing else "resolved", now, value, threshold, message))

    drained: dict[str, int] = {}
    for w in workers:
        if w.alive:
            for name in w.queues:
                drained[name] = drained.get(name, 0) + 1
    for q in stats:
        check("dlq_depth", q.queue, float(q.dead), "the DLQ depth")
        check("oldest_pending_age", q.queue, q.oldest_pending_age or 0.0, "the oldest ready job's age (s)")
        check("depth", q.queue, float(q.pending + q.scheduled + q.processing), "the live depth")
        ready_unserved = float(q.pending) if drained.get(q.queue, 0) == 0 else 0.0
        check("no_worker", q.queue, ready_unserved, "ready jobs with no live worker")
    check("long_transaction", None, health.oldest_transaction_age, "the oldest open transaction's age (s)")
    return out


def check_webhook(url: str) -> str:
    """A webhook URL as given, or ConfigurationError: http or https, a host, no credentials in it
    (they would be logged; put a token in the path or query instead), at most 2,000 characters."""
    if not isinstance(url, str) or not url or len(url) > 2000 or any(c.isspace() or ord(c) < 32 for c in url):
        raise ConfigurationError(f"a webhook must be an http(s) URL of at most 2000 characters, got {url[:80]!r}")
    if not url.isascii():
        # http.client sends the request line as ASCII: such a URL would fail every delivery, unseen.
        raise ConfigurationError(
            f"a webhook must be an http(s) URL in ASCII (percent-encode the rest), got {url[:80]!r}"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"not a webhook URL: {url[:80]!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"a webhook must be an http(s) URL with a host, got {url[:80]!r}")
    if parts.username or parts.password:
        raise ConfigurationError("a webhook URL must not carry a user or password (it would be logged)")
    del port
    return url
