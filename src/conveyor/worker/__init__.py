"""The worker runtime: independent loops (fetch, execute, heartbeat, complete, rescue, schedule, prune)
around one Worker, configured by one WorkerConfig."""

from conveyor.worker._config import WorkerConfig
from conveyor.worker._observe import Observer, Observers
from conveyor.worker._worker import Worker

__all__ = ["Observer", "Observers", "Worker", "WorkerConfig"]
