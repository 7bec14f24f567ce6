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

from conveyor._errors import ConfigurationError

log = logging.getLogger("conveyor.worker")


def allowed() -> list[int]:
    """The CPUs this process may run on, in order. Raises ConfigurationError where the platform
    cannot pin (no ``os.sched_setaffinity``: macOS, Windows)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is None or not hasattr(os, "sched_setaffinity"):
        raise ConfigurationError("pinning to a CPU needs Linux (os.sched_setaffinity); run without --pin")
    return sorted(getaffinity(0))


def check(cpu: object) -> int:
    """``cpu`` as a CPU this process may run on, else ConfigurationError."""
    cpus = allowed()
    if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu not in cpus:
        raise ConfigurationError(f"cpu must be one of the CPUs this process may use ({_ranges(cpus)}), got {cpu!r}")
    return cpu


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


def pin(cpu: int) -> None:
    """Run every thread of this process on ``cpu`` (threads started later inherit it). A refusal
    (the CPU went offline, a container's cpuset changed) is logged and the process runs unpinned:
    a hint about speed is never a reason to stop working."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]  # no /proc: the calling thread, which starts the worker's threads
    try:
        for tid in tids:
            try:
                os.sched_setaffinity(tid, {cpu})
            except ProcessLookupError:
                continue  # the thread ended meanwhile
    except OSError as exc:
        log.warning("cannot pin this worker to CPU %d (%s); running unpinned", cpu, exc.strerror or exc)
        return
    log.info("worker pinned to CPU %d", cpu)


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
