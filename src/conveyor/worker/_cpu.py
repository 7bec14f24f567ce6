"""Pinning a worker process to one CPU (``conveyor worker --pin``).

A worker's handler threads take turns at the GIL. On a multi-core host each hand-off of the GIL
wakes the next thread on whichever core is free, where it often finds the GIL taken again and goes
back to sleep: with ten ``def`` handlers waiting on the network, most of a worker's CPU went to
those wake-ups (docs/benchmarks.md, session 33). On one core the hand-off is a plain switch to the
next runnable thread. Python code of one process runs on one core at a time anyway; what pinning
costs is the parallelism of code that releases the GIL (compression, numpy, hashing of large
buffers), hence opt-in."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from conveyor._errors import ConfigurationError
from conveyor._limits import check_int

#: The highest CPU number Linux knows of (CONFIG_NR_CPUS tops out at 8,192).
_MOST_CPUS = 8191

log = logging.getLogger("conveyor.worker")


# Pinning is process-wide: the CPU this process's workers are pinned to, and how many of them run.
_lock = threading.Lock()
_pinned: list[int] = []  # [cpu, workers], empty when unpinned
# While pinned: each thread's CPUs before, and the pinning thread's (for threads started meanwhile).
_saved: list[tuple[dict[int, set[int]], set[int]]] = []


def allowed() -> list[int]:
    """The CPUs this process may run on, in order. Raises ConfigurationError where the platform
    cannot pin (no ``os.sched_setaffinity``: macOS, Windows)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is None or not hasattr(os, "sched_setaffinity"):
        raise ConfigurationError("pinning to a CPU needs Linux (os.sched_setaffinity); run without --pin")
    with _lock:
        if _saved:  # a worker of this process pinned it: the CPUs it had before
            return sorted(_saved[0][1])
    return sorted(getaffinity(0))


def check(cpu: object) -> int:
    """``cpu`` as a CPU this process may run on, else ConfigurationError."""
    cpus = allowed()
    number = check_int(cpu, "cpu", 0, _MOST_CPUS, ConfigurationError)
    if number not in cpus:
        raise ConfigurationError(f"cpu {number} is not one of the CPUs this process may use ({_ranges(cpus)})")
    return number


def current() -> int:
    """The CPU the calling thread runs on now (the first allowed one where that cannot be read)."""
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            # Field 39, counted after the command name's closing parenthesis (the name may hold spaces).
            cpu = int(f.read().rsplit(b")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return allowed()[0]
    cpus = allowed()
    return cpu if cpu in cpus else cpus[0]


def pin(cpu: int) -> Callable[[], None]:
    """Run every thread of this process on ``cpu`` (threads started later inherit it) until the
    returned function is called: it gives every thread the CPUs it had (a thread started meanwhile,
    those of the thread that pinned). Workers of one process share it, so a second worker asking for
    another CPU is a ConfigurationError. A refusal (the CPU went offline, a container's cpuset
    changed) is logged and undone, and the process runs unpinned: a hint about speed is never a
    reason to stop working."""
    with _lock:
        if _pinned:
            if _pinned[0] != cpu:
                raise ConfigurationError(
                    f"this process already runs a worker pinned to CPU {_pinned[0]}; workers of one process share "
                    f"its CPUs: pin them to the same one, or run them as processes of their own (not CPU {cpu})"
                )
            _pinned[1] += 1
            return _release
        default = os.sched_getaffinity(0)
        before: dict[int, set[int]] = {}
        try:
            for tid in _threads():
                try:
                    before[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, {cpu})
                except ProcessLookupError:
                    continue  # the thread ended meanwhile
        except OSError as exc:
            _set(before, None)
            log.warning("cannot pin this worker to CPU %d (%s); running unpinned", cpu, exc.strerror or exc)
            return _nothing
        _pinned[:] = [cpu, 1]
        _saved[:] = [(before, default)]
    log.info("worker pinned to CPU %d", cpu)
    return _release


def _release() -> None:
    with _lock:
        if not _pinned:
            return
        _pinned[1] -= 1
        if _pinned[1] > 0:
            return
        _pinned.clear()
        before, default = _saved.pop()
    _set(before, default)


def _nothing() -> None:
    return None


def _set(masks: dict[int, set[int]], default: set[int] | None) -> None:
    """Give every thread its mask from ``masks``; one not in it ``default`` (None: left as it is)."""
    for tid in _threads():
        mask = masks.get(tid, default)
        if mask is None:
            continue
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            continue  # ended meanwhile, or that mask is no longer possible: leave it


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no /proc: the calling thread, which starts the worker's threads


def spread(processes: int) -> list[int]:
    """One CPU per worker process: child *i* on the *i*-th allowed CPU (round robin); a lone
    process on the CPU it runs on now (the scheduler put it where there was room)."""
    if processes <= 1:
        return [current()]
    cpus = allowed()
    return [cpus[i % len(cpus)] for i in range(processes)]


def _ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (as taskset and /proc print CPU lists)."""
    parts: list[str] = []
    start = prev = None
    for cpu in cpus:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)
