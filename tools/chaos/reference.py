"""What a campaign's run is compared with: the fault-free runs of its messages.

A run's messages go through the fault-free embedded service (the test API,
entrypoints/testing.py) twice: in the order the campaign publishes them, then in the reverse
order (a fence scenario, whose order is fixed, runs them twice in its order). Each run's
outcome is cut into *aspects*, values the processes' run must reproduce: the commits of each
consuming endpoint, its dead letters (one per message, reasons with the run's message IDs
masked), the partitions and the states of each endpoint (artifact keys and timestamps
masked: they name an attempt and its time, which no two runs share), the blobs written, and
the executions of each third-party API.

An aspect on which the two fault-free runs disagree depends on the order of the messages
(stock that runs out, the first of two payments that wins), or on what no two runs share (a
time, an attempt ID, an ID a provider makes): the campaign's processes, which take messages
in any order, may come to a different value as correctly, so the campaign does not compare
it and says so (`EngineRun.not_compared`). What holds in every order is still checked for
every message: committed once or dead-lettered, each effect once, nothing left at rest, and
the workload's own domain check.

Two orders that agree do not prove that every order does: an order whose confirmation needs
all its commands completes at its last one, and the reverse order often completes two
orders of one customer in the same order as the forward one, while the processes complete
them in a third (a 600 s campaign on the sample reported such runs as a state, a commit and
an API execution that differed). So the outcome is compared with the fault-free runs' only
when the workload declares it independent of the order (`order_independent`,
tools/chaos/workload.py); otherwise only the partitions are, and the domain check judges the
rest.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from application.codec import to_jsonable
from domain.context import UUID5_TEXT
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from entrypoints.testing import EmbeddedReport, EmbeddedService
from tools.chaos.workload import OutsideMessage

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: What no two runs share inside a state: artifact keys' attempt-made UUIDs, ISO timestamps.
_PER_RUN = re.compile(UUID5_TEXT + r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")


def masked_reasons(reasons: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """Dead letters' reasons with UUIDs (message IDs a run drew anew) masked, counted, as a
    sorted tuple."""
    return tuple(sorted(Counter(_UUID.sub("<id>", r) for r in reasons).items()))


def masked_state(state: Any) -> str:
    """A state (a domain object or JSON-ready data) as compact JSON text with what no two
    runs share masked (artifact keys' UUIDs, timestamps)."""
    text = json.dumps(to_jsonable(state), sort_keys=True, separators=(",", ":"), default=str)
    return _PER_RUN.sub("<run>", text)


@dataclass(frozen=True)
class Observed:
    """A run's outcome, by aspect: commits per consuming endpoint, dead letters' masked
    reasons per consuming endpoint (one per message), partitions and masked states per
    endpoint (partition -> text), blobs written, executions per third-party API."""

    commits: Mapping[str, int]
    dead_letters: Mapping[str, tuple[tuple[str, int], ...]]
    states: Mapping[str, Mapping[str, str]]
    blobs: int
    executions: Mapping[str, int]

    def aspects(self) -> dict[str, Any]:
        """Aspect name -> comparable value (the names the summary prints)."""
        found: dict[str, Any] = {}
        for name, n in self.commits.items():
            found[f"commits on {name}"] = n
        for name, reasons in self.dead_letters.items():
            found[f"dead letters of {name}"] = reasons
        for name, states in self.states.items():
            found[f"partitions of {name}"] = tuple(sorted(states))
            found[f"states of {name}"] = tuple(sorted(states.items()))
        found["blobs"] = self.blobs
        for api, n in self.executions.items():
            found[f"executions on {api}"] = n
        return found


def observed(queues: Sequence[str], commits: Mapping[str, int],
             dead_letters: Mapping[str, Sequence[str]],
             states: Mapping[str, Mapping[str, Any]], blobs: int,
             executions: Mapping[str, Mapping[str, int]]) -> Observed:
    """An `Observed` of a run's raw findings: commits and dead letters' reasons of the
    consuming endpoints `queues`, states per endpoint and partition (domain objects), the
    blob count, and per API the executions per idempotency key."""
    return Observed(
        {q: int(commits.get(q, 0)) for q in queues},
        {q: masked_reasons(list(dead_letters.get(q, ()))) for q in queues},
        {name: {str(p): masked_state(s) for p, s in by.items()} for name, by in states.items()},
        blobs, {api: sum(keys.values()) for api, keys in executions.items()})


@dataclass(frozen=True)
class Reference:
    """One fault-free run: its report, its states (the domain's objects), its third-party
    API executions per idempotency key, and its outcome by aspect."""

    report: EmbeddedReport
    states: dict[str, dict[str, Any]]
    apis: dict[str, dict[str, int]]
    outcome: Observed


async def reference_run(settings: Settings, service: Service, messages: Sequence[OutsideMessage],
                        seeds: Mapping[str, Mapping[str, Any]]) -> Reference:
    """`messages`, in this order, through the fault-free embedded service (the test API)
    with `seeds` written first."""
    embedded = settings.replaced(profile="embedded", apis={}, callees={}, failpoints="")
    async with EmbeddedService.start(service.registry, settings=embedded) as reference:
        for endpoint, states in seeds.items():
            reference.seed_states(endpoint, states)
        for message in messages:
            await reference.send_line(message.line())
        report = await reference.run_until_quiet(timeout_s=120)
        states = {name: reference.states(name) for name in service.registry.names()}
        apis = reference.api_executions()
    queues = list(service.registry.consuming())
    outcome = observed(queues, {q: report.settled.get(q, {}).get("processed", 0)
                                for q in queues},
                       {q: [d["reason"] for d in report.dead_letters.get(q, [])]
                        for q in queues}, states, len(report.blobs), apis)
    return Reference(report, states, apis, outcome)


#: The aspects that say which messages ended how (committed or dead-lettered).
_FLOW = ("commits on ", "dead letters of ")


@dataclass(frozen=True)
class Expected:
    """The two fault-free runs of a run's messages (`first` in the campaign's order,
    `second` in the reverse order, or the preamble reversed for a scripted scenario), and
    whether the workload declares its outcome independent of the order (`order_independent`:
    every aspect is compared; else the partitions only)."""

    first: Reference
    second: Reference
    order_independent: bool = False

    def compared(self, name: str) -> bool:
        """Whether aspect `name` is compared: both fault-free runs agree on it, and the
        workload declares its outcome independent of the order or it is a partition set."""
        return name not in self.varying and (self.order_independent
                                             or name.startswith("partitions of "))

    @property
    def not_compared(self) -> list[str]:
        """The aspects that would be compared but for the two runs' disagreement."""
        return [a for a in self.varying
                if self.order_independent or a.startswith("partitions of ")]

    @property
    def varying(self) -> list[str]:
        """The aspects on which the two fault-free runs disagree: not compared. Which
        messages an endpoint commits and which it dead-letters go together, and decide
        what reaches the endpoints after it: when the two runs disagree on one endpoint's
        commits or dead letters, every endpoint's are not compared (two orders may commit
        as many messages, not the same ones: a third order, the processes', may not); when
        they disagree on those or on a state, neither are the blobs written nor the
        executions of the APIs (what is checked of them whatever the order: no orphan, none
        missing, each key executed once)."""
        one, two = self.first.outcome.aspects(), self.second.outcome.aspects()
        names = one.keys() | two.keys()
        differ = {k for k in names if one.get(k) != two.get(k)}
        flow = {k for k in names if k.startswith(_FLOW)}
        if differ & flow:
            differ |= flow
        if any(k.startswith((*_FLOW, "states of ")) for k in differ):
            # the blobs written and the API calls made follow from which messages commit
            # and the states they find: as many in two orders, not so in a third
            differ |= {k for k in names if k == "blobs" or k.startswith("executions on ")}
        return sorted(differ)

    @property
    def commits(self) -> int:
        """Commits the processes' run reaches at least (the fewer of the two runs')."""
        return min(sum(r.outcome.commits.values()) for r in (self.first, self.second))

    def differences(self, found: Observed, limit: int = 3) -> list[str]:
        """Each aspect compared (`compared`) on which `found` differs from the fault-free
        runs, in words (at most `limit` partitions named per endpoint's states)."""
        want, have = self.first.outcome.aspects(), found.aspects()
        problems = []
        for name in sorted(want.keys() | have.keys()):
            if not self.compared(name) or want.get(name) == have.get(name):
                continue
            problem = _difference(name, have.get(name), want.get(name), limit)
            if problem is not None:
                problems.append(problem)
        return problems


def _difference(name: str, have: Any, want: Any, limit: int) -> str | None:
    if name.startswith("commits on "):
        return (f"I10: {name[len('commits on '):]}: {have} messages known committed (their "
                f"commit, publications or token consumed in the logs), the fault-free run "
                f"committed {want}")
    if name.startswith("dead letters of "):
        more, fewer = Counter(dict(have or ())), Counter(dict(want or ()))
        return (f"I10: {name[len('dead letters of '):]} dead-lettered {dict(more - fewer)} "
                f"more and {dict(fewer - more)} fewer than the fault-free run (one per "
                "message)")
    if name.startswith("partitions of "):
        extra = sorted(set(have or ()) - set(want or ()))
        missing = sorted(set(want or ()) - set(have or ()))
        return (f"states: {name[len('partitions of '):]} has partitions {extra[:5]} the "
                f"fault-free run has not, and lacks {missing[:5]}")
    if name.startswith("states of "):
        mine, theirs = dict(have or ()), dict(want or ())
        wrong = [p for p in sorted(mine.keys() & theirs.keys()) if mine[p] != theirs[p]]
        if not wrong:
            return None  # partitions only: their own aspect says which
        shown = "; ".join(f"{p}: {mine[p][:200]} (fault-free: {theirs[p][:200]})"
                          for p in wrong[:limit])
        return (f"states: {name[len('states of '):]}: {len(wrong)} partitions differ from "
                f"the fault-free run's: {shown}")
    if name == "blobs":
        return f"blobs: {have} objects, the fault-free run wrote {want}"
    if name.startswith("executions on "):
        return (f"API {name[len('executions on '):]}: {have} executions, the fault-free run "
                f"made {want}")
    return f"{name}: {have}, the fault-free run's {want}"  # pragma: no cover - every kind above
