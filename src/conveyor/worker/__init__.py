"""The worker runtime: independent loops (fetch, execute, heartbeat, flush, rescue) around one Worker."""

from conveyor.worker._worker import Worker

__all__ = ["Worker"]
