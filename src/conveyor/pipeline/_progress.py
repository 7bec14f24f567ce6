"""Stage progress for long pipeline runs: a silent default and a rich display for the terminal."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Stages(Protocol):
    """Receives the stages of a pipeline job as they start and end."""

    def stage(self, name: str) -> Any:
        """A context manager around one named stage."""
        ...


class NoStages:
    """Reports nothing (the default for library calls)."""

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield


class RichStages:
    """Shows each stage with a spinner, its elapsed time and the running Spark stage's task count.

    Spark's own console progress bar is off (it interleaves badly with other output); a thread
    polls the status tracker instead while a stage runs."""

    def __init__(self, spark: SparkSession | None = None, console: Any = None, poll: float = 0.5) -> None:
        from rich.console import Console

        self.spark = spark
        self.console = console or Console(stderr=True)
        self.poll = poll

    def _tasks(self) -> str:
        if self.spark is None:
            return ""
        try:
            tracker = self.spark.sparkContext.statusTracker()
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
        except Exception:  # the tracker is best-effort display only
            return ""
        return f" [dim]tasks {done}/{total}[/dim]" if total else ""

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        stop = threading.Event()
        with self.console.status(f"{name} ...") as status:

            def refresh() -> None:
                while not stop.wait(self.poll):
                    elapsed = time.monotonic() - start
                    status.update(f"{name} ... {elapsed:.0f}s{self._tasks()}")

            poller = threading.Thread(target=refresh, daemon=True)
            poller.start()
            try:
                yield
            finally:
                stop.set()
                poller.join()
        self.console.print(f"[green]✓[/green] {name} [dim]{time.monotonic() - start:.1f}s[/dim]")
