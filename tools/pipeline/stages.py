"""The timed stages of `eo pipeline audit` (tools/pipeline/audit.py): what each took, in wall
clock seconds and rows, for its summary and report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One timed step: `rows` it went through (0: not counted) in `seconds` (wall clock)."""

    name: str
    seconds: float
    rows: int = 0

    @property
    def rows_per_s(self) -> float:
        """Throughput; 0 when no rows were counted or no time passed."""
        return self.rows / self.seconds if self.rows and self.seconds > 0 else 0.0


class StageTimer:
    """Runs the audit's stages, timing each (`stages`) and telling `progress` its name."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.stages: list[Stage] = []

    def run(self, name: str, action: Callable[[], int], rows: Callable[[int], int] | None = None
            ) -> int:
        """Run `action` as stage `name` and return its result (a count); the stage's rows
        are `rows(result)`, else the result itself."""
        self.progress(name)
        started = time.perf_counter()
        result = action()
        self.stages.append(Stage(name, time.perf_counter() - started,
                                 rows(result) if rows else result))
        return result
