"""A progress line while Spark jobs run (rich), fed by Spark's status tracker."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkProgress:
    """A context manager showing, on `console` (None: nothing shown), the phase set by
    `phase()` and the tasks done of the running stages, polled every `poll_s` seconds from
    Spark's status tracker by a daemon thread. The line is removed when the block ends."""

    def __init__(self, spark: SparkSession, console: Console | None, poll_s: float = 0.25
                 ) -> None:
        self.spark, self.poll_s = spark, poll_s
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("tasks"), TimeElapsedColumn(),
                                 console=console, transient=True, disable=console is None)
        self.task = self.progress.add_task("starting", total=None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def phase(self, description: str) -> None:
        """Show `description` as what runs now."""
        self.progress.update(self.task, description=description)

    def _poll(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(self.poll_s):
            infos = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
            total = sum(i.numTasks for i in infos if i is not None)
            done = sum(i.numCompletedTasks for i in infos if i is not None)
            self.progress.update(self.task, total=total or None, completed=done)

    def __enter__(self) -> SparkProgress:
        self.progress.start()
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.progress.stop()
