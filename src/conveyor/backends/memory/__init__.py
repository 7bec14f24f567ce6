"""The in-process backend: the whole storage contract in Python dicts behind one lock, for tests.

See :class:`MemoryBackend`. ``open_backend("memory://")`` returns a new, empty one; nothing is
shared between two instances and nothing survives the process."""

from __future__ import annotations

from conveyor.backends.memory._backend import MemoryBackend

__all__ = ["MemoryBackend"]
