"""The message pairs of `eo chaos`'s fence scenarios (tools/chaos/fence.py): for each
consuming endpoint, two of the workload's messages M1, M2 that the fault-free run commits on
the same partition of the endpoint (or whose outputs it commits there, for an endpoint
downstream of the boundary), one message of the endpoint each, and nothing dead-lettered,
with the messages before them they depend on. An endpoint the workload gives no such pair is
reported as skipped, with the reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from application.codec import decode
from application.envelope import CAUSATION_ID_HEADER
from application.errors import MalformedMessage, UnknownMessageType
from application.registry import Registration, Registry
from application.strategy import Strategy
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from entrypoints.testing import EmbeddedService
from tools.chaos.fence import FencePair
from tools.chaos.workload import OutsideMessage

#: At most this many candidate pairs are tried per endpoint against the fault-free run.
PAIR_CANDIDATES = 12


def fenced_endpoints(service: Service) -> list[str]:
    """The consuming endpoints whose strategy commits transaction records (token and outbox;
    the state strategy has no TR to fence)."""
    return [n for n in service.registry.consuming()
            if service.strategy(n) is not Strategy.STATE]


def partition_of(registration: Registration, type_name: str, body: Any) -> str | None:
    """The partition of a message of `registration`'s endpoint (`body`: bytes or JSON
    data), or None when the endpoint cannot read it (unknown type, malformed)."""
    endpoint = registration.endpoint
    cls = endpoint.messages.get(type_name)
    if cls is None:
        return None
    raw = body if isinstance(body, bytes | str) else json.dumps(body)
    try:
        return str(endpoint.partition_of(decode(cls, raw)))
    except (MalformedMessage, UnknownMessageType):
        return None


@dataclass(frozen=True)
class Arrivals:
    """What one outside message made an endpoint receive in a fault-free run: the
    partitions of its *first* arrivals there (those no earlier arrival there caused: the
    outside message itself, or what other endpoints sent on its account), how many arrivals
    came after them (follow-ups, messages the endpoint sent itself), and how many of them it
    committed and dead-lettered."""

    first: tuple[str | None, ...] = ()
    later: int = 0
    committed: int = 0
    dead_lettered: int = 0

    @property
    def all_committed(self) -> bool:
        """Every arrival committed, none dead-lettered (nor dropped as a duplicate)."""
        return self.committed == len(self.first) + self.later and not self.dead_lettered


Place = tuple[str, str]  # (endpoint, partition)


@dataclass(frozen=True)
class Step:
    """One outside message's run until quiet: its `Arrivals` per fenced endpoint, and for
    every (endpoint, partition) its messages reached, the places on the way there (that
    one and those of the messages that caused the arrival: what its outcome there depends
    on)."""

    arrivals: Mapping[str, Arrivals]
    paths: Mapping[Place, frozenset[Place]]


async def steps_of(embedded: Settings, service: Service, messages: Sequence[OutsideMessage],
                   seeds: Mapping[str, Mapping[str, Any]], endpoints: Sequence[str]
                   ) -> list[Step]:
    """`messages` one by one through a fault-free embedded service seeded with `seeds`, each
    followed by a run until quiet: a `Step` each, with `Arrivals` for `endpoints` (an
    arrival's cause is its `eo-causation-id`)."""
    registry = service.registry
    consuming = list(registry.consuming())
    found: list[Step] = []
    async with EmbeddedService.start(registry, settings=embedded) as run:
        for endpoint, states in seeds.items():
            run.seed_states(endpoint, states)
        seen, before = 0, {q: (0, 0) for q in consuming}
        for message in messages:
            await run.send_line(message.line())
            report = await run.run_until_quiet(timeout_s=120, quiet_polls=3)
            sent = run.outputs()
            tree = [(message.queue, message.message_id, "", message.type, message.body)]
            tree += [(s.to, str(s.message_id), s.headers.get(CAUSATION_ID_HEADER, ""), s.type,
                      s.body) for s in sent[seen:]]
            seen = len(sent)
            now = {q: (report.settled.get(q, {}).get("processed", 0),
                       len(report.dead_letters.get(q, []))) for q in consuming}
            found.append(Step({e: _arrivals(registry[e], e, tree, now[e][0] - before[e][0],
                                            now[e][1] - before[e][1]) for e in endpoints},
                              _paths(registry, tree, set(now))))
            before = now
    return found


def _paths(registry: Registry, tree: Sequence[tuple[str, str, str, str, Any]],
           consuming: set[str]) -> dict[Place, frozenset[Place]]:
    """Place -> the places on the way to it (see `Step`), over one step's message tree."""
    place = {m: (to, str(partition_of(registry[to], t, b)))
             for to, m, _c, t, b in tree if to in consuming}
    cause = {m: c for _to, m, c, _t, _b in tree}
    paths: dict[Place, set[Place]] = defaultdict(set)
    for m, here in place.items():
        way, hop, seen = {here}, cause.get(m, ""), {m}
        while hop and hop not in seen:
            seen.add(hop)
            if hop in place:
                way.add(place[hop])
            hop = cause.get(hop, "")
        paths[here] |= way
    return {p: frozenset(w) for p, w in paths.items()}


def _arrivals(registration: Registration, endpoint: str,
              tree: Sequence[tuple[str, str, str, str, Any]], committed: int, dead: int
              ) -> Arrivals:
    """The `Arrivals` at `endpoint` of one step's message tree ((to, message ID, cause,
    type, body) of the outside message and what the endpoints sent on its account)."""
    cause = {m: c for _to, m, c, _t, _b in tree}
    at = {m for to, m, _c, _t, _b in tree if to == endpoint}
    first, later = [], 0
    for to, _m, c, t, b in tree:
        if to != endpoint:
            continue
        ancestors, hop = set(), c
        while hop and hop not in ancestors:
            ancestors.add(hop)
            hop = cause.get(hop, "")
        if ancestors & at:
            later += 1
        else:
            first.append(partition_of(registration, t, b))
    return Arrivals(tuple(first), later, committed, dead)


def preamble(steps: Sequence[Step], i: int, j: int, place: Place) -> list[int]:
    """The messages before `j` (other than `i`) that the arrivals of messages `i` and `j`
    at `place` may depend on, in order: each earlier message that reached a place on their
    way there, then (walking back from `j`) each that reached a place on the way of those."""
    needed = set(steps[i].paths.get(place, {place}) | steps[j].paths.get(place, {place}))
    chosen = []
    for k in range(j - 1, -1, -1):
        hits = [p for p in steps[k].paths if p in needed]
        if k != i and hits:
            chosen.append(k)
            for p in hits:
                needed |= steps[k].paths[p]
    return sorted(chosen)


async def find_pairs(settings: Settings, service: Service, messages: Sequence[OutsideMessage],
                     seeds: Mapping[str, Mapping[str, Any]]
                     ) -> tuple[dict[str, FencePair], dict[str, str]]:
    """A `FencePair` per consuming endpoint whose partitions see two messages, whatever
    feeds it (outside producers, other endpoints, follow-ups), and why each other consuming
    endpoint has none.

    `messages` go one by one through a fault-free embedded service (`steps_of`). A candidate
    is two messages of the workload that each make the endpoint receive exactly one first
    message, on the same partition (what the first causes after its commit, a follow-up or
    a message to itself, comes later and does not matter: the scenario's crash is at the
    first commit), with the `preamble` they may depend on. Candidates, the shortest
    preamble first, are then confirmed alone (the preamble, then the two, in order) by a
    fresh embedded run: the same arrivals, each committed by the endpoint (a producer's
    retry of one message is no pair: its second copy is a duplicate)."""
    embedded = embedded_settings(settings)
    fenced = fenced_endpoints(service)
    pairs: dict[str, FencePair] = {}
    skipped = {n: "the state strategy commits no transaction record: there is no fence "
                  "to stage" for n in service.registry.consuming() if n not in fenced}
    steps = await steps_of(embedded, service, messages, seeds, fenced)
    for endpoint in fenced:
        by_partition: dict[str, list[int]] = defaultdict(list)
        received: dict[str, int] = defaultdict(int)
        for i, step in enumerate(steps):
            mine = step.arrivals[endpoint]
            for p in mine.first:
                received[str(p)] += 1
            if len(mine.first) == 1 and mine.first[0] is not None:
                by_partition[str(mine.first[0])].append(i)
        candidates = sorted((len(before), j - i, p, i, j, before)
                            for p, at in by_partition.items()
                            for i, j in itertools.pairwise(at)
                            if messages[i].message_id != messages[j].message_id
                            for before in [preamble(steps, i, j, (endpoint, p))])
        tried = candidates[:PAIR_CANDIDATES]
        for _n, _d, partition, i, j, before in tried:
            pair = FencePair(endpoint, partition, messages[i], messages[j],
                             tuple(messages[k] for k in before))
            commits = await _confirmed(embedded, service, pair, seeds)
            if commits is not None:
                pairs[endpoint] = dataclasses.replace(pair, before_commits=commits)
                break
        else:
            skipped[endpoint] = _why_none(received, by_partition, len(tried))
    return pairs, skipped


def _why_none(received: Mapping[str, int], by_partition: Mapping[str, list[int]], tried: int
              ) -> str:
    """Why an endpoint got no pair, in words for the summary."""
    if not received:
        return "the workload sends it nothing (no message of the workload reaches it)"
    if max(received.values()) < 2:
        return (f"no partition of its {len(received)} receives two messages in the fault-free "
                "run: give the workload two messages of one partition")
    if not any(len(at) >= 2 for at in by_partition.values()):
        return ("the messages that reach one of its partitions twice come from one outside "
                "message (or reach it several times at once): give the workload two "
                "messages, each reaching it once, of one partition")
    if not tried:
        return ("the messages that reach one of its partitions twice are copies of one message "
                "(a producer's retry: the second commits nothing): give the workload two "
                "messages of one partition")
    return (f"the {tried} nearest pairs of messages of one partition did not both commit "
            "there when sent alone after the messages before them they depend on (one "
            "dead-lettered, or depended on another message)")


def embedded_settings(settings: Settings) -> Settings:
    """`settings` for a fault-free embedded run: the embedded profile, no third-party API,
    no callee, no failpoint."""
    return settings.replaced(profile="embedded", apis={}, callees={}, failpoints="")


async def _confirmed(embedded: Settings, service: Service, pair: FencePair,
                     seeds: Mapping[str, Mapping[str, Any]]) -> int | None:
    """Whether `pair`, alone after its preamble, gives its endpoint one first arrival each
    on its partition, and the endpoint commits every message they make it receive: then
    the commits of the preamble (over every consuming endpoint), else None."""
    consuming = list(service.registry.consuming())
    steps = await steps_of(embedded, service, [*pair.before, pair.first, pair.second], seeds,
                           consuming)
    if all(step.arrivals[pair.endpoint].first == (pair.partition,)
           and step.arrivals[pair.endpoint].all_committed for step in steps[-2:]):
        return sum(a.committed for step in steps[:-2] for a in step.arrivals.values())
    return None
