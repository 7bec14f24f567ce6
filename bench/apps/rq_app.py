"""RQ's bench task.

RQ runs one job at a time per worker process and has no thread pool, so "one process × 10 slots"
does not exist for it. We run ``rq worker -w rq.worker.SimpleWorker bench`` (one process, one job
at a time, no fork per job: the default Worker forks a child for every job, which measures fork(),
not the queue). Ten worker processes would be ten times the CPU budget of the others and is not
what we compare. RQ's row is therefore "1 process × 1 slot"; for a no-op handler slots barely
matter (the handler never waits), which is why it is still a fair figure of RQ's overhead."""

from __future__ import annotations

from bench._common import body_sync, record


def noop(sent: float = 0.0, i: int = 0) -> None:
    record(sent)
    body_sync()
