"""The worker's configuration: one frozen, validated value that prefork hands to every process."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from conveyor._errors import ConfigurationError
from conveyor._limits import check_int, check_key, check_name, check_seconds, check_worker_options
from conveyor._task import DEFAULT_VISIBILITY_TIMEOUT
from conveyor.worker import _cpu

#: Handler slots per worker process.
DEFAULT_CONCURRENCY = 10
#: Seconds running handlers get to finish on SIGTERM.
DEFAULT_GRACEFUL_TIMEOUT = 30.0
#: The shortest interval a loop may wait between two rounds. Shorter ones, down to 1e-9 s, were taken, and each
#: loop then queried the database without pause: 90 % of a core idle (10 ms: 6 %).
MIN_INTERVAL = 0.01
#: The largest weight of a lane (the smallest is 1).
MAX_WEIGHT = 1_000_000


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process runs. Raises ConfigurationError for a value out of range.

    ``queues`` None: every queue a registered task declares (an empty list is refused; a queue named twice
    counts once). ``weights`` shares slots between lanes, a weight for every queue drained (else lanes are
    drained in strict order). ``prefetch`` None: adaptive, 4 to 16 per slot (see the fetcher); a given number
    is fixed; 0: none, a job is leased only for a slot that is free (the prefork supervisor's default
    under autoscaling). ``poll_interval`` None: 1 s with notifications, else 0.25 s.
    ``heartbeat_interval`` None: a third of the shortest lease held; given, shorter than ``visibility_timeout``.
    Every interval but ``flush_interval`` (0: flush at once) is at least ``MIN_INTERVAL`` (10 ms). ``burst``:
    stop once the queues hold no live job. ``worker_id`` None: ``host:pid``."""

    queues: tuple[str, ...] | None = None
    weights: Mapping[str, int] | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    prefetch: int | None = None
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT
    poll_interval: float | None = None
    flush_interval: float = 0.005
    heartbeat_interval: float | None = None
    rescue_interval: float = 5.0
    schedule_interval: float = 1.0
    prune_interval: float = 60.0
    #: How often the worker writes its row in the worker registry (``app.admin.workers()``).
    presence_interval: float = 10.0
    graceful_timeout: float = DEFAULT_GRACEFUL_TIMEOUT
    burst: bool = False
    worker_id: str | None = field(default=None)
    #: Serve this process's Prometheus metrics on this port (needs the ``metrics`` extra); None: off.
    #: Under prefork child *i* serves ``metrics_port + i``.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: Trace handlers with OpenTelemetry: None (default) when ``opentelemetry`` is importable.
    tracing: bool | None = None
    #: Run this process on this one CPU (Linux): ``def`` handlers' GIL hand-offs then stay on one core
    #: (see ``conveyor/worker/_cpu.py``). None (default): wherever the OS schedules it. ``conveyor
    #: worker --pin`` gives each process its own.
    cpu: int | None = None

    def __post_init__(self) -> None:
        error = ConfigurationError
        check_worker_options(
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            visibility_timeout=self.visibility_timeout,
            graceful_timeout=self.graceful_timeout,
        )
        if isinstance(self.queues, (str, bytes)):
            # A string is a sequence of its letters: "emails" would drain queues e, m, a, i, l, s.
            raise error(f"queues must be a list of queue names, not one string: give [{self.queues!r}]")
        if self.queues is not None:
            # A queue named twice is drained once, in its first place (a token's queues are kept so too).
            queues = tuple(dict.fromkeys(check_name(q, "queue", error) for q in self.queues))
            if not queues:
                # An empty list drained every queue: a filter that kept none took the whole database's work.
                raise error(
                    "queues is empty: name at least one queue, or give None for every queue the app's tasks declare"
                )
            object.__setattr__(self, "queues", queues)
        if self.worker_id:
            # Stored on every lease the worker holds and keying the worker registry: an index entry, as a
            # key is. Past the limit, MySQL refused the first acquire (a 700-character column) and the
            # worker stopped; a NUL was refused by PostgreSQL.
            object.__setattr__(self, "worker_id", check_key(self.worker_id, "worker_id", error))
        if self.weights is not None:
            weights = {
                check_name(q, "queue", error): check_int(w, f"weight of {q}", 1, MAX_WEIGHT, error)
                for q, w in self.weights.items()
            }
            object.__setattr__(self, "weights", weights or None)
        for name in ("poll_interval", "heartbeat_interval"):
            value = getattr(self, name)
            if value is not None:
                check_seconds(value, name, error, minimum=MIN_INTERVAL)
        for name in ("rescue_interval", "schedule_interval", "prune_interval", "presence_interval"):
            check_seconds(getattr(self, name), name, error, minimum=MIN_INTERVAL)
        if self.heartbeat_interval is not None and self.heartbeat_interval >= self.visibility_timeout:
            # Leases would run out between two heartbeats, and every job running longer than one be
            # rescued and run again meanwhile. (A task's own shorter lease is the task's choice.)
            raise error(
                f"heartbeat_interval ({self.heartbeat_interval:g} s) must be shorter than visibility_timeout "
                f"({self.visibility_timeout:g} s), or leases run out between heartbeats and their jobs run twice"
            )
        check_seconds(self.flush_interval, "flush_interval", error)
        if self.metrics_port is not None:
            check_int(self.metrics_port, "metrics_port", 0, 65535, error)
        if self.cpu is not None:
            object.__setattr__(self, "cpu", _cpu.check(self.cpu))

    @property
    def identity(self) -> str:
        """This worker's id in the database (``worker_id`` on its leases)."""
        return self.worker_id or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def capacity(self) -> int:
        """Leased-but-unstarted jobs held at first (the prefetch buffer's size)."""
        return self.prefetch if self.prefetch is not None else max(4 * self.concurrency, 20)

    @property
    def max_capacity(self) -> int | None:
        """The most the adaptive buffer grows to (None: fixed at ``capacity``)."""
        return None if self.prefetch is not None else max(16 * self.concurrency, self.capacity)
