"""The plan of a campaign's run (`eo chaos`, tools/chaos/engine.py): the processes a
service runs as (`topology_of`), and the faults of run K of campaign N, a pure function of
(seed, run) (`plan_run`): `--seed N --run K` replays them."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from application.failpoints import NAMES
from application.registry import Role
from application.strategy import Strategy
from entrypoints.service_spec import Service

#: The state strategy's failpoints (application/state_path.py).
STATE_POINTS = frozenset({"after_state_load", "before_append", "after_append"})
CALLEE_POINTS: tuple[str, ...] = ("callee.after_commit", "callee.before_reply")
HTTP_CALLER_POINTS = frozenset({"after_put", "after_post", "before_delete", "after_delete"})

@dataclass(frozen=True)
class Topology:
    """What a run starts: process name -> endpoint (consumers, then callees), the queues
    consumed, the callees, the third-party APIs, and the failpoints each endpoint reaches."""

    processes: dict[str, str]
    queues: tuple[str, ...]
    callees: tuple[str, ...]
    apis: tuple[str, ...]
    points: dict[str, tuple[str, ...]]


def topology_of(service: Service, workers: int = 2) -> Topology:
    """The processes of `service` (`workers` consumers per consuming endpoint, one process
    per callee) and the failpoints of protocol 10 each endpoint's path reaches with the
    campaign's co-located tokens, from its registration: blob and HTTP-request kinds only
    where it writes blobs or calls callees, the state strategy's points only on that
    strategy, the API call only with an API."""
    registry, processes, points = service.registry, {}, {}
    consumer_base = sorted(n for n in NAMES if not n.startswith("callee.")
                           and n not in STATE_POINTS and n not in HTTP_CALLER_POINTS
                           and n not in ("after_api_call", "after_processed_check"))
    for r in registry:
        if r.role is Role.CALLEE:
            points[r.name] = CALLEE_POINTS
            continue
        # the campaign's tokens share the endpoints' database: the commit creates the
        # outgoing tokens, so `after_register:message` / `after_create:message` never fire
        found = [*consumer_base, "after_publish:1", "after_publish:2"]
        if service.strategy(r.name) is Strategy.OUTBOX:  # it checks a processed row, no token
            found[found.index("after_token_check")] = "after_processed_check"
        if service.strategy(r.name) is Strategy.STATE:
            found += sorted(STATE_POINTS)
        if r.blobs:
            found += ["after_register:blob", "after_create:blob"]
        if r.callees:
            found += [*sorted(HTTP_CALLER_POINTS), "after_register:http_request",
                      "after_create:http_request"]
        if r.apis:
            found.append("after_api_call")
        points[r.name] = tuple(found)
    queues = tuple(registry.consuming())
    for name in queues:
        for worker in range(workers):
            processes[f"{name}-{worker}"] = name
    callees = tuple(registry.names(Role.CALLEE))
    for name in callees:
        processes[name] = name
    return Topology(processes, queues, callees, tuple(a.name for a in registry.apis), points)


@dataclass(frozen=True)
class EnginePlan:
    """The faults of one run, drawn from (seed, run) alone.

    - `size`: the workload's draw size; `workload_seed`: its draw; `shuffle_seed`: the
      publication order;
    - `failpoints`: process name -> `EO_FAILPOINTS` of its first start;
    - `kills`: (share of the expected commits reached, process) for a SIGKILL;
    - `broker_closes`: shares of progress at which the broker closes every connection;
    - `duplicate_rate`: share of messages published twice (half at once, half late);
    - `republish`: messages re-published after quiescence;
    - `api_failures`, `api_latency_s`: each third-party API's provider answers that many
      requests 503 first, and takes that long per execution."""

    seed: int
    run: int
    size: int
    workload_seed: int
    shuffle_seed: int
    failpoints: dict[str, str]
    kills: tuple[tuple[float, str], ...]
    broker_closes: tuple[float, ...]
    duplicate_rate: float
    republish: int
    api_failures: int = 0
    api_latency_s: float = 0.0
    #: (share of the expected commits reached, kind) of production's faults
    #: (tools/chaos/production.py `KINDS`; `--production` only)
    production: tuple[tuple[float, str], ...] = ()


def plan_rng(seed: int, run: int, stream: str = "") -> random.Random:
    """A random stream of (seed, run, stream), stable across processes and Python versions
    (hashlib, never `hash()`)."""
    label = f"eo-chaos/{seed}/{run}" + (f"/{stream}" if stream else "")
    digest = hashlib.sha256(label.encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def failpoint_rule(rng: random.Random, points: Sequence[str], broker: bool) -> str:
    """One `EO_FAILPOINTS` rule at a point of `points`: `crash` and `drop_conn` once (no
    `drop_conn` without a broker connection), `raise` and `sleep` on one hit or the first
    two."""
    name = rng.choice(list(points))
    actions, weights = ["crash", "raise", "sleep", "drop_conn"], [4, 2, 2, 2]
    if not broker:
        actions, weights = actions[:3], weights[:3]
    action = rng.choices(actions, weights=weights)[0]
    if action == "sleep":
        action = f"sleep:{rng.choice([50, 200, 800])}"
    hit = rng.randint(1, 8)
    mode = "@" if action in ("crash", "drop_conn") or rng.random() < 0.5 else "*"
    return f"{name}={action}{mode}{hit if mode == '@' else min(hit, 2)}"


def plan_run(seed: int, run: int, layout: Topology, size: int, max_faults: int = 5,
             broker_closes: bool = True, production: Sequence[str] = ()) -> EnginePlan:
    """The plan of run `run` of campaign `seed` on `layout`: up to `max_faults` failpoint
    rules and kills, in half the runs a finisher stalled while its endpoint's other
    consumers go on, zero to two broker-side closes (with `broker_closes`), one or two of
    production's faults of the kinds `production` names (tools/chaos/production.py), the
    duplicates' rate and the providers' faults. Deterministic."""
    rng = plan_rng(seed, run)
    failpoints = dict.fromkeys(layout.processes, "")
    kills: list[tuple[float, str]] = []
    for _ in range(rng.randint(min(2, max_faults), max_faults)):
        process = rng.choice(list(layout.processes))
        if rng.random() < 0.3:
            kills.append((round(rng.random(), 3), process))
            continue
        endpoint = layout.processes[process]
        rule = failpoint_rule(rng, layout.points[endpoint], endpoint not in layout.callees)
        if rule.split("=")[0] not in failpoints[process]:
            failpoints[process] = ";".join(filter(None, [failpoints[process], rule]))
    stall = plan_rng(seed, run, "stall")
    contended = [p for p, e in layout.processes.items()
                 if e not in layout.callees and sum(x == e for x in layout.processes.values()) > 1]
    if contended and stall.random() < 0.5:
        # a finisher stalls between its publications and its clear (a GC pause, a slow
        # network) while another consumer of the endpoint takes the partition over: the
        # fence (protocol 3.1) must keep the late clear from touching the next commit
        process = stall.choice(contended)
        rule = f"after_publish_all=sleep:1500@{stall.randint(1, 4)}"
        if "after_publish_all=" not in failpoints[process]:
            failpoints[process] = ";".join(filter(None, [failpoints[process], rule]))
    closes: tuple[float, ...] = ()
    if broker_closes:
        other = plan_rng(seed, run, "broker-closes")
        count = other.choices([0, 1, 2], weights=[2, 2, 1])[0]
        closes = tuple(sorted(round(other.random(), 3) for _ in range(count)))
    servers = plan_rng(seed, run, "production")
    faults = tuple(sorted((round(servers.uniform(0.1, 0.7), 3), servers.choice(production))
                          for _ in range(servers.randint(1, 2)))) if production else ()
    apis = plan_rng(seed, run, "apis")
    return EnginePlan(seed=seed, run=run, size=size,
                      workload_seed=plan_rng(seed, run, "workload").getrandbits(32),
                      shuffle_seed=rng.getrandbits(32), failpoints=failpoints,
                      kills=tuple(sorted(kills)), broker_closes=closes,
                      duplicate_rate=rng.choice([0.1, 0.2, 0.3]),
                      republish=rng.randint(0, 5), api_failures=apis.choice([0, 0, 1, 3]),
                      api_latency_s=apis.choice([0.0, 0.0, 0.3, 1.0]), production=faults)
