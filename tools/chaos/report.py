"""What a campaign's runs did and found (`eo chaos`, tools/chaos/engine.py): each run's
`EngineRun`, the campaign's `EngineReport` (JSON for `--report`), and the `Budget` that
bounds the campaign's wall time (`--duration`)."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools.chaos.plan import EnginePlan


@dataclass
class EngineRun:
    """What one run did and found."""

    plan: EnginePlan
    messages: int = 0
    seconds: float = 0.0
    deliveries_published: int = 0
    expected_commits: int = 0
    commits: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    consumer_gaps: dict[str, float] = field(default_factory=dict)
    restart_gaps: dict[str, float] = field(default_factory=dict)
    planned_deaths: list[Path] = field(default_factory=list)
    dead_letters: int = 0
    blobs: int = 0
    api_executions: int = 0
    #: whether the workload's domain check ran on this run's final states
    domain_checked: bool = False
    logs: Path | None = None
    #: a scripted run's name (tools/chaos/fence.py); empty for a random run
    scenario: str = ""
    #: what the protocol keeps at rest on purpose (tools/chaos/checks.py `KEPT`)
    kept: dict[str, int] = field(default_factory=dict)
    #: the aspects two fault-free runs disagree on, not compared (tools/chaos/reference.py)
    not_compared: list[str] = field(default_factory=list)
    #: whether the commits per endpoint are compared with the fault-free runs'
    commits_compared: bool = True
    #: production's faults (`--production`), a line each: time, kind, target, undone after
    production: list[str] = field(default_factory=list)
    #: each wait for quiet that ran out of the run's time, with what was still outstanding
    #: then (tools/chaos/quiet.py `outstanding`)
    not_quiet: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """How reports name the run: its scenario, or `run K`."""
        return self.scenario or f"run {self.plan.run}"


class RunTotals:
    """A campaign report's sums over its `runs` (each with `label`, `faults` and
    `violations`)."""

    runs: Sequence[EngineRun]

    @property
    def faults(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for result in self.runs:
            total.update(result.faults)
        return total

    @property
    def violations(self) -> list[str]:
        return [f"{r.label}: {v}" for r in self.runs for v in r.violations]


@dataclass
class EngineReport(RunTotals):
    """Every run's result; faults and violations summed over runs."""

    seed: int
    service: str
    runs: list[EngineRun] = field(default_factory=list)
    seconds: float = 0.0
    #: the endpoints the fence scenarios could not stage, and why
    fence_skipped: dict[str, str] = field(default_factory=dict)
    #: the fence scenarios the duration left no time for
    fence_not_run: list[str] = field(default_factory=list)
    #: wall time by what it went to (seconds): set-up, fence scenarios, random runs, ...
    time: dict[str, float] = field(default_factory=dict)
    #: whether the workload declares its outcome independent of the order (then the whole
    #: outcome is compared with the fault-free runs', else the partitions only)
    order_independent: bool = False

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (plans included, for replay)."""
        return {"seed": self.seed, "service": self.service,
                "seconds": round(self.seconds, 1), "runs": len(self.runs),
                "faults": dict(self.faults), "violations": self.violations,
                "fence_skipped": self.fence_skipped, "fence_not_run": self.fence_not_run,
                "order_independent": self.order_independent,
                "time_s": {k: round(v, 1) for k, v in self.time.items()},
                "per_run": [{**asdict(r.plan), "scenario": r.scenario, "messages": r.messages,
                             "seconds": round(r.seconds, 1), "faults": dict(r.faults),
                             "violations": r.violations,
                             "deliveries_published": r.deliveries_published,
                             "commits": r.commits, "expected_commits": r.expected_commits,
                             "dead_letters": r.dead_letters, "blobs": r.blobs,
                             "api_executions": r.api_executions,
                             "domain_checked": r.domain_checked,
                             "kept": r.kept, "not_compared": r.not_compared,
                             "production": r.production, "not_quiet": r.not_quiet,
                             "consumer_gaps_s": {k: round(v, 2)
                                                 for k, v in r.consumer_gaps.items()}}
                            for r in self.runs]}


class Budget:
    """The campaign's wall time (`--duration`): what each kind of run took so far
    (`spent`: kind -> seconds, `counts`: kind -> runs), and whether another run of a kind
    still fits: the mean of that kind's runs so far (else of any run) must end before the
    duration has passed. `duration_s` None: no bound (a replay of one run)."""

    def __init__(self, started: float, duration_s: float | None) -> None:
        self.started, self.duration_s = started, duration_s
        self.spent: dict[str, float] = {}
        self.counts: Counter[str] = Counter()

    def estimate(self, kind: str) -> float:
        """What a run of `kind` is expected to take: the mean of its runs so far, else of
        every run so far, else 0."""
        if self.counts[kind]:
            return self.spent[kind] / self.counts[kind]
        runs = [k for k, n in self.counts.items() if n]
        total = sum(self.counts[k] for k in runs)
        return sum(self.spent[k] for k in runs) / total if total else 0.0

    def allows(self, kind: str, first_of_all: bool = False) -> bool:
        """Whether a run of `kind` fits in what is left (always the campaign's first run)."""
        if self.duration_s is None or first_of_all:
            return True
        return time.monotonic() - self.started + self.estimate(kind) <= self.duration_s

    @contextlib.contextmanager
    def spending(self, kind: str) -> Iterator[None]:
        """Count the block's wall time as one run of `kind`."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.spent[kind] = self.spent.get(kind, 0.0) + time.monotonic() - began
            self.counts[kind] += 1
