"""`eo chaos` for any service: a randomized fault campaign on the registry's endpoints, run as
real processes on PostgreSQL, RabbitMQ and an S3 API, with the protocol's invariants checked
for every endpoint (docs/fault-injection.md, "eo chaos for your service").

Each run draws its messages from the workload (tools/chaos/workload.py: a JSON-lines file in
the outside producers' format, or a generator the service declares), runs them once through
the fault-free embedded service (the test API, entrypoints/testing.py: the *reference*), then
starts the service as processes (`workers` consumers per consuming endpoint, one `eo serve`
per callee, a fake provider per third-party API) on a database and a virtual host of the
campaign's own, publishes the messages (shuffled unless the workload says otherwise) and
injects faults:

- failpoints (protocol 10) drawn among those each endpoint reaches, in its processes'
  `EO_FAILPOINTS`: `crash` (the process exits; the campaign restarts it without the rule),
  `raise`, `sleep:<ms>`, `drop_conn`;
- `kill -9` of a random process at a random point of progress, then a restart;
- the broker closing every connection of the campaign's virtual host at random points;
- duplicates: copies published at once, copies published late, and after quiescence copies
  of processed messages re-published;
- the third-party APIs' providers answering some requests 503 and taking their time.

Then quiescence, a graceful stop, the final sweep, and the checks, for every endpoint:

- I1, I2, I3, I7 and the handler re-runs from the processes' logs (tools/chaos/checks.py):
  each message committed at most once per endpoint, every other attempt aborted visibly;
- each message the endpoints sent received by its destination;
- nothing at rest: no token, unfinished transaction record, side-effect record, deferred
  clean-up, callee request or unrelayed inbox row (I8, I9);
- the same dead letters, queue by queue and reason by reason, as the reference;
- the same partitions in every endpoint's states as the reference;
- no orphaned blob (every object in the bucket named by a state), none missing (every
  artifact key a state names is in the bucket), and as many as the reference wrote;
- each third-party API request executed once by its provider, as many as the reference's;
- the workload's domain check, when it has one.

The plan of a run is a pure function of (seed, run): `--seed N --run K` replays its faults
(the processes' timing is not replayed); it is printed with each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import random
import re
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
from pydantic import SecretStr

from adapters.postgres.pool import create_pool
from adapters.rabbitmq import topology as amqp_topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.s3.blob_store import S3BlobStore
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import SystemClock
from application.codec import to_jsonable
from application.failpoints import NAMES
from application.observability import (
    FAULT_INJECTED,
    MESSAGE_DEAD_LETTERED,
    MESSAGE_RECEIVED,
    SIDE_EFFECT_PUBLISHED,
    TOKEN_CONSUMED,
    TRANSACTION_COMMITTED,
)
from application.registry import Role
from application.strategy import Strategy
from domain.context import ARTIFACT_KEY_IN_TEXT
from entrypoints.faults import CRASH_EXIT
from entrypoints.local import postgres_stores
from entrypoints.operations import migrate_all
from entrypoints.settings import ApiSettings, Service, Settings
from tools.chaos.broker import ConsumerGaps, close_all_connections
from tools.chaos.checks import (
    at_rest,
    audit_logs,
    crashed_by_failpoint,
    dead_letters,
    kept_at_rest,
    queue_depth,
    read_logs,
    rerun_violations,
)
from tools.chaos.fence import (
    HALVES,
    FencePair,
    Script,
    StepMissed,
    find_pairs,
    process_names,
    stage_fence,
)
from tools.chaos.fleet import Fleet, bucket_client, business_states, empty_bucket, final_sweep
from tools.chaos.reference import Expected, observed, reference_run
from tools.chaos.workload import FileWorkload, OutsideMessage, RunOutcome, Workload
from tools.fake_provider import FakeProvider, fake_provider
from tools.scratch import own_database, own_vhost
from tools.zygote import Zygote

#: The campaign's database is `<this>_<pid>_<hex>` on EO_DATABASE_DSN's server.
ENGINE_DATABASE = "eo_chaos"
#: Its virtual host (on a broker this host administers) is `<this>-<pid>-<hex>`.
ENGINE_VHOST = "eo-chaos"
#: The state strategy's failpoints (application/state_path.py).
STATE_POINTS = frozenset({"after_state_load", "before_append", "after_append"})
CALLEE_POINTS: tuple[str, ...] = ("callee.after_commit", "callee.before_reply")
HTTP_CALLER_POINTS = frozenset({"after_put", "after_post", "before_delete", "after_delete"})
TABLES = ("eo_token", "eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
          "eo_processed_message", "eo_stored_reply", "eo_http_request", "eo_http_tombstone",
          "eo_state_entry", "eo_inbox", "eo_dead_letter")
#: Where a run with a violation keeps its process logs when no log directory was given.
KEPT_LOGS = Path("var/chaos")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: An object key `Context.artifact_key` makes, `<prefix>/<uuid5>`, where a state names it.
_ARTIFACT_KEY = re.compile(ARTIFACT_KEY_IN_TEXT)


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
                           and n != "after_api_call")
    for r in registry:
        if r.role is Role.CALLEE:
            points[r.name] = CALLEE_POINTS
            continue
        # the campaign's tokens share the endpoints' database: the commit creates the
        # outgoing tokens, so `after_register:message` / `after_create:message` never fire
        found = [*consumer_base, "after_publish:1", "after_publish:2"]
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
             broker_closes: bool = True) -> EnginePlan:
    """The plan of run `run` of campaign `seed` on `layout`: up to `max_faults` failpoint
    rules and kills, in half the runs a finisher stalled while its endpoint's other
    consumers go on, zero to two broker-side closes (with `broker_closes`), the duplicates'
    rate and the providers' faults. Deterministic."""
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
    apis = plan_rng(seed, run, "apis")
    return EnginePlan(seed=seed, run=run, size=size,
                      workload_seed=plan_rng(seed, run, "workload").getrandbits(32),
                      shuffle_seed=rng.getrandbits(32), failpoints=failpoints,
                      kills=tuple(sorted(kills)), broker_closes=closes,
                      duplicate_rate=rng.choice([0.1, 0.2, 0.3]),
                      republish=rng.randint(0, 5), api_failures=apis.choice([0, 0, 1, 3]),
                      api_latency_s=apis.choice([0.0, 0.0, 0.3, 1.0]))


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

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (plans included, for replay)."""
        return {"seed": self.seed, "service": self.service,
                "seconds": round(self.seconds, 1), "runs": len(self.runs),
                "faults": dict(self.faults), "violations": self.violations,
                "fence_skipped": self.fence_skipped, "fence_not_run": self.fence_not_run,
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
                             "consumer_gaps_s": {k: round(v, 2)
                                                 for k, v in r.consumer_gaps.items()}}
                            for r in self.runs]}


def engine_settings(base: Settings, blob_dir: Path) -> Settings:
    """`base` with enough attempts that a bounded number of faults never dead-letters, a
    sweeper that finishes an interrupted transaction within seconds, and a consumer
    watchdog shorter than a run's quiet period."""
    return base.model_copy(update={
        "profile": "local", "token_dsn": None, "blob_dir": blob_dir, "max_attempts": 12,
        "retry_delays_s": (0.1, 0.5, 1.0, 2.0, 5.0), "stale_after_s": 2.0,
        "consumer_watchdog_s": 5.0, "blob_store": "s3"})


@dataclass
class _Campaign:
    """One campaign's fixed parts."""

    settings: Settings
    service: Service
    workload: Workload
    layout: Topology
    root: Path
    providers: dict[str, FakeProvider]
    pool: asyncpg.Pool
    size: int
    run_timeout_s: float
    #: the processes' fork server (tools/zygote.py), for the campaign's length
    zygote: Zygote | None = None


async def run_engine(settings: Settings, service: Service, workload: Workload, seed: int,
                     duration_s: float, only_run: int | None = None, size: int = 20,
                     workers: int = 2, log_root: Path | None = None,
                     on_run: Callable[[EngineRun], None] = lambda _r: None,
                     run_timeout_s: float = 240.0, database: str = ENGINE_DATABASE,
                     fence: Literal["first", "only", "off"] = "first",
                     max_runs: int | None = None) -> EngineReport:
    """Runs while `duration_s` allows (fence scenarios included: `Budget`; at least one run)
    and at most `max_runs` random runs, or only run `only_run`.
    `fence`: the fence scenarios (tools/chaos/fence.py) first (not with `only_run`), only
    them (no random run), or none.

    `settings` from `engine_settings`: their database and broker URL name the server and
    the broker only; the campaign creates a database `<database>_<pid>_<hex>` and, where
    this host administers the broker, a virtual host of its own (else it uses the URL's,
    when that holds none of the service's queues), and removes them at the end. Raises
    `SettingsError` naming `EO_AMQP_URL` when the URL's virtual host holds the service's
    queues, and what the services raise when they are unreachable; violations are
    reported, not raised."""
    started = time.monotonic()
    layout = topology_of(service, workers)
    report = EngineReport(seed=seed, service=service.registry.service)
    async with own_vhost(settings.amqp(), ENGINE_VHOST, layout.queues,
                         len(settings.retry_delays_s), "eo chaos") as broker, \
            own_database(settings.database(), database) as dsn:
        settings = settings.model_copy(update={"amqp_url": SecretStr(broker.url),
                                               "database_dsn": SecretStr(dsn)})
        temp = None if log_root is not None else Path(tempfile.mkdtemp(prefix="eo-chaos-"))
        root = log_root or temp
        assert root is not None
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
        moto = MotoServer()
        with contextlib.ExitStack() as stack:
            providers = {api: stack.enter_context(fake_provider(root / f"{api}.log"))
                         for api in layout.apis}
            settings = settings.model_copy(update={
                "s3_endpoint_url": moto.start(), "s3_access_key": SecretStr("local"),
                "s3_secret_key": SecretStr("local"),
                "apis": {**settings.apis, **{
                    api: ApiSettings.model_validate({"url": p.url})
                    for api, p in providers.items()}}})
            zygote = stack.enter_context(contextlib.closing(Zygote()))
            try:
                await migrate_all(settings)
                pool = await create_pool(settings.database(), max_size=2)
                try:
                    campaign = _Campaign(settings, service, workload, layout, root,
                                         providers, pool, size, run_timeout_s, zygote)
                    # a replay of one run, or the fence scenarios alone: what was asked for
                    budget = Budget(started, duration_s if only_run is None
                                    and fence != "only" else None)
                    report.time = budget.spent
                    if fence == "only" or (fence == "first" and only_run is None):
                        await _fence_runs(campaign, seed, report, on_run, temp is not None,
                                          budget)
                    k = 0
                    while fence != "only":
                        index = only_run if only_run is not None else k
                        if not budget.allows("random runs", first_of_all=not report.runs) or (
                                max_runs is not None and k >= max_runs):
                            break
                        plan = plan_run(seed, index, layout, size,
                                        broker_closes=broker.vhost is not None)
                        with budget.spending("random runs"):
                            result = await _one_run(campaign, plan, root / f"run-{index}")
                            await _keep(result, root / f"run-{index}", temp is not None,
                                        f"seed-{seed}-run-{index}")
                        report.runs.append(result)
                        on_run(result)
                        k += 1
                        if only_run is not None:
                            break
                finally:
                    await pool.close()
            finally:
                moto.stop()
                if temp is not None:
                    shutil.rmtree(temp, ignore_errors=True)
    report.seconds = time.monotonic() - started
    report.time["set-up and clean-up"] = max(0.0, report.seconds - sum(
        v for k, v in report.time.items() if k != "set-up and clean-up"))
    return report


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


async def _keep(result: EngineRun, logs: Path, temporary: bool, name: str) -> None:
    """Where the run's process logs stay: `logs` when the campaign was given a log
    directory; else, for a run with a violation, a copy in `KEPT_LOGS`/`name`."""
    result.logs = None if temporary else logs
    if result.violations and temporary:
        kept = KEPT_LOGS / name
        await asyncio.to_thread(shutil.copytree, logs, kept, dirs_exist_ok=True)
        result.logs = kept


async def _fence_runs(campaign: _Campaign, seed: int, report: EngineReport,
                      on_run: Callable[[EngineRun], None], temporary: bool, budget: Budget
                      ) -> None:
    """The fence scenarios (tools/chaos/fence.py), both halves, on every endpoint the
    workload's draw for run 0 gives a pair of messages (the others, and why, in
    `report.fence_skipped`), as long as `budget` allows (those it did not allow in
    `report.fence_not_run`)."""
    with budget.spending("finding the fence scenarios' messages"):
        messages = campaign.workload.draw(
            random.Random(plan_rng(seed, 0, "workload").getrandbits(32)), campaign.size)
        seed_states = getattr(campaign.workload, "seed_states", None)
        pairs, report.fence_skipped = await find_pairs(
            campaign.settings, campaign.service, messages,
            seed_states(messages) if seed_states else {})
    budget.counts["finding the fence scenarios' messages"] = 0  # no run: not an estimate
    for endpoint, pair in pairs.items():
        for half in HALVES:
            scenario = f"fence ({half}) on {endpoint}"
            if not budget.allows("fence scenarios", first_of_all=not report.runs):
                report.fence_not_run.append(scenario)
                continue
            name = f"fence-{endpoint}-{half.replace(' ', '-')}"
            with budget.spending("fence scenarios"):
                result = await _fence_run(campaign, seed, pair, half, campaign.root / name)
                await _keep(result, campaign.root / name, temporary, f"seed-{seed}-{name}")
            report.runs.append(result)
            on_run(result)


async def publish_messages(amqp_url: str, messages: Sequence[OutsideMessage], rate: float,
                           rng: random.Random) -> int:
    """Publish `messages` as an outside producer does (the URL's user as `user_id`,
    publisher confirms, persistent); a share `rate` twice: half at once (concurrent copies),
    half at the end (a late re-send). Returns the copies."""
    user = unquote(urlsplit(amqp_url).username or "") or "guest"
    connection = await aio_pika.connect(amqp_url)
    late: list[OutsideMessage] = []
    copies = 0
    try:
        channel = await connection.channel(publisher_confirms=True)

        async def publish(message: OutsideMessage) -> None:
            await channel.default_exchange.publish(
                aio_pika.Message(message.body, message_id=message.message_id,
                                 type=message.type, user_id=user, headers=dict(message.headers),
                                 content_type="application/json",
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=message.queue)

        for start in range(0, len(messages), 200):
            batch: list[OutsideMessage] = []
            for message in messages[start:start + 200]:
                batch.append(message)
                draw = rng.random()
                if draw < rate / 2:
                    batch.append(message)
                    copies += 1
                elif draw < rate:
                    late.append(message)
            await asyncio.gather(*(publish(m) for m in batch))
        await asyncio.gather(*(publish(m) for m in late))
    finally:
        await connection.close()
    return copies + len(late)


#: The events that show a message's transaction committed: its own commit, and what only a
#: committed attempt's finish does (whoever finishes it: a process killed after its commit
#: logged none of its own), publish the attempt's side effects and consume its token.
COMMIT_EVIDENCE = frozenset({TRANSACTION_COMMITTED, SIDE_EFFECT_PUBLISHED, TOKEN_CONSUMED})
_EVIDENCE = tuple(f'"{event}"'.encode() for event in COMMIT_EVIDENCE)


class CommitCounter:
    """The distinct (endpoint, message ID) whose transaction the processes of a run are
    known to have committed (`COMMIT_EVIDENCE` in their logs), read from the logs as they
    grow: the run's progress, and at the end what is compared with the reference's."""

    def __init__(self, log_dir: Path, endpoints: Iterable[str]) -> None:
        self.log_dir, self.endpoints = log_dir, frozenset(endpoints)
        self._offsets: dict[Path, int] = {}
        self._seen: set[tuple[str, str]] = set()

    def count(self) -> int:
        for path in sorted(self.log_dir.glob("*.jsonl")):
            with path.open("rb") as log:
                log.seek(self._offsets.get(path, 0))
                data = log.read()
            end = data.rfind(b"\n") + 1  # a line being written waits for the next look
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                if not line.startswith(b"{") or not any(e in line for e in _EVIDENCE):
                    continue
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("event") in COMMIT_EVIDENCE and record.get(
                            "endpoint") in self.endpoints:
                        self._seen.add((record["endpoint"], str(record.get("message_id"))))
        return len(self._seen)

    @property
    def seen(self) -> set[tuple[str, str]]:
        """(endpoint, message ID) known committed so far (as of the last `count`)."""
        return set(self._seen)


async def _seed(campaign: _Campaign, seeds: Mapping[str, Mapping[str, Any]]) -> None:
    stores = postgres_stores(campaign.pool, SystemClock(), campaign.service.registry)
    for endpoint, states in seeds.items():
        await stores[endpoint].seed_states(dict(states))


async def _one_run(campaign: _Campaign, plan: EnginePlan, log_dir: Path) -> EngineRun:
    started = time.monotonic()
    settings, layout = campaign.settings, campaign.layout
    result = EngineRun(plan=plan)
    messages = campaign.workload.draw(random.Random(plan.workload_seed), plan.size)
    if getattr(campaign.workload, "shuffle", True):
        random.Random(plan.shuffle_seed).shuffle(messages)
    stage = await _stage(campaign, messages, result, log_dir, plan.api_failures,
                         plan.api_latency_s)
    faults = result.faults
    async with _processes(campaign, stage, log_dir, result, started) as (fleet, rabbit):
        await _start_callees(fleet, layout, plan.failpoints)
        for name, endpoint in layout.processes.items():
            if endpoint not in layout.callees:
                fleet.start(name, endpoint, {"EO_FAILPOINTS": plan.failpoints[name]})
        rng = random.Random(plan.shuffle_seed)
        copies = await publish_messages(settings.amqp(), messages, plan.duplicate_rate, rng)
        result.deliveries_published = len(messages) + copies
        faults["duplicate (published twice)"] += copies
        gaps = ConsumerGaps()
        progress = CommitCounter(log_dir, layout.queues)
        marks = _Marks([(share * result.expected_commits, p) for share, p in plan.kills],
                       [share * result.expected_commits for share in plan.broker_closes])
        await _quiesce(campaign, fleet, rabbit, progress, result, marks, gaps, started)
        if plan.republish and result.commits >= result.expected_commits:
            late = rng.sample(messages, min(plan.republish, len(messages)))
            await publish_messages(settings.amqp(), late, 0.0, rng)
            faults["duplicate (re-published after processing)"] += len(late)
            result.deliveries_published += len(late)
            await _quiesce(campaign, fleet, rabbit, progress, result, _Marks([], []), gaps,
                           time.monotonic())
        await _stop(campaign, fleet, gaps, result)
    return result


@dataclass(frozen=True)
class _Stage:
    """A run's messages, the seeds written before them, and their two fault-free runs
    (tools/chaos/reference.py)."""

    messages: Sequence[OutsideMessage]
    seeds: Mapping[str, Mapping[str, Any]]
    expected: Expected


async def _stage(campaign: _Campaign, messages: Sequence[OutsideMessage], result: EngineRun,
                 log_dir: Path, api_failures: int = 0, api_latency_s: float = 0.0,
                 second: Sequence[OutsideMessage] | None = None) -> _Stage:
    """The two fault-free runs of `messages` (with the workload's seeds): in this order and
    in the reverse order (or in the order `second`: a scripted run's), then the stores, the
    bucket and the providers made ready for the processes' run of them."""
    result.messages = len(messages)
    seed_states = getattr(campaign.workload, "seed_states", None)
    seeds: Mapping[str, Mapping[str, Any]] = seed_states(messages) if seed_states else {}
    first = await reference_run(campaign.settings, campaign.service, messages, seeds)
    other = await reference_run(campaign.settings, campaign.service,
                                list(reversed(messages)) if second is None else second, seeds)
    expected = Expected(first, other)
    result.expected_commits = expected.commits
    result.not_compared = expected.varying
    await campaign.pool.execute("TRUNCATE " + ", ".join(TABLES))
    await _seed(campaign, seeds)
    await empty_bucket(campaign.settings)
    for provider in campaign.providers.values():
        await asyncio.to_thread(provider.reset)
        await asyncio.to_thread(provider.faults, api_failures, api_latency_s)
    if campaign.providers:
        result.faults["API provider 503 (injected)"] += api_failures * len(campaign.providers)
    await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
    return _Stage(messages, seeds, expected)


@contextlib.asynccontextmanager
async def _processes(campaign: _Campaign, stage: _Stage, log_dir: Path, result: EngineRun,
                     started: float) -> AsyncIterator[tuple[Fleet, RabbitConnection]]:
    """A run's fleet (no process started yet) and the campaign's broker connection, its
    queues declared; on leaving, every process stopped and the connection closed, then,
    unless the block raised, the run checked (`_conclude`)."""
    fleet = _fleet(campaign, log_dir)
    rabbit = await _declare(campaign.settings, campaign.layout)
    try:
        yield fleet, rabbit
    finally:
        fleet.stop_all()
        await rabbit.close()
    await _conclude(campaign, stage, log_dir, result, started)


def _fleet(campaign: _Campaign, log_dir: Path) -> Fleet:
    settings = campaign.settings
    return Fleet(settings, log_dir, 0.0, callees=campaign.layout.callees,
                 zygote=campaign.zygote, extra_env={
        "EO_MAX_ATTEMPTS": str(settings.max_attempts),
        "EO_RETRY_DELAYS_S": json.dumps(list(settings.retry_delays_s)),
        "EO_STALE_AFTER_S": str(settings.stale_after_s),
        "EO_CONSUMER_WATCHDOG_S": str(settings.consumer_watchdog_s),
        "EO_BLOB_STORE": "s3"})


async def _declare(settings: Settings, layout: Topology) -> RabbitConnection:
    """A connection of the campaign's own, with every consumed queue's topology declared
    (so messages published before a consumer starts wait in its queue)."""
    rabbit = RabbitConnection(settings.amqp())
    await rabbit.start()
    for endpoint in layout.queues:
        await amqp_topology.declare(rabbit, endpoint, settings.retry_delays_s,
                                    settings.delivery_limit)
    return rabbit


async def _start_callees(fleet: Fleet, layout: Topology, failpoints: Mapping[str, str]
                         ) -> None:
    for name in layout.callees:
        fleet.start(name, name, {"EO_FAILPOINTS": failpoints.get(name, "")})
        await fleet.wait_for_callee(name)


async def _stop(campaign: _Campaign, fleet: Fleet, gaps: ConsumerGaps, result: EngineRun
                ) -> None:
    """The consumers' graceful stop (each must exit 0 on SIGTERM), then the final sweep."""
    gaps.finish()
    result.consumer_gaps, result.restart_gaps = gaps.longest_s, gaps.while_restarting_s
    codes = fleet.stop_all(keep=campaign.layout.callees)
    await final_sweep(fleet.caller_settings(campaign.settings), campaign.service)
    result.violations += [f"{n} exited {c} on SIGTERM" for n, c in codes.items()
                          if c not in (0, -signal.SIGTERM)]


async def _conclude(campaign: _Campaign, stage: _Stage, log_dir: Path, result: EngineRun,
                    started: float) -> None:
    """The checks of a stopped run, its queues deleted and its injected faults counted."""
    settings = campaign.settings
    await _check(campaign, stage, log_dir, result)
    await amqp_topology.delete_queues(settings.amqp(), list(campaign.layout.queues),
                                      len(settings.retry_delays_s))
    for record in read_logs(log_dir):
        if record.get("event") == FAULT_INJECTED:
            result.faults[f"failpoint {str(record.get('action', '')).split(':')[0]}"] += 1
    result.seconds = time.monotonic() - started


async def _fence_run(campaign: _Campaign, seed: int, pair: FencePair, half: str,
                     log_dir: Path) -> EngineRun:
    """The fence scenario `half` (tools/chaos/fence.py) on `pair`, checked as a run is."""
    started = time.monotonic()
    campaign = dataclasses.replace(campaign, layout=topology_of(campaign.service, 2))
    settings, layout = campaign.settings, campaign.layout
    x, y = process_names(pair.endpoint)
    plan = EnginePlan(seed=seed, run=-1, size=2, workload_seed=0, shuffle_seed=0,
                      failpoints={x: f"{HALVES[half]}=wait:x@1",
                                  y: "after_commit=crash@1 (twice)"},
                      kills=(), broker_closes=(), duplicate_rate=0.0, republish=0)
    result = EngineRun(plan=plan, scenario=f"fence ({half}) on {pair.endpoint}")
    # the two in their order, after the preamble in any order (the processes take it so)
    stage = await _stage(campaign, [*pair.before, pair.first, pair.second], result, log_dir,
                         second=[*reversed(pair.before), pair.first, pair.second])
    gates = log_dir / "gates"
    await asyncio.to_thread(gates.mkdir, exist_ok=True)
    rng = random.Random(seed)

    async def publish(messages: Sequence[OutsideMessage]) -> None:
        await publish_messages(settings.amqp(), messages, 0.0, rng)
        result.deliveries_published += len(messages)

    async with _processes(campaign, stage, log_dir, result, started) as (fleet, rabbit):
        def log(name: str) -> list[dict[str, Any]]:
            return read_logs(log_dir, f"{name}.{fleet.starts[name]}.jsonl")

        script = Script(start=lambda name, env: fleet.start(name, pair.endpoint, env),
                        exit_code=lambda name: fleet.procs[name].poll(), log=log,
                        publish=publish, gates=gates)
        await _start_callees(fleet, layout, {})
        for endpoint in layout.queues:
            if endpoint != pair.endpoint:
                fleet.start(f"{endpoint}-0", endpoint)
        progress = CommitCounter(log_dir, layout.queues)
        if pair.before:  # what the two depend on, processed first without a fault
            fleet.start(x, pair.endpoint)
            await publish(pair.before)
            await _settle(campaign, rabbit, progress, pair.before_commits)
            fleet.stop(x)
        try:
            await stage_fence(script, pair, half, CRASH_EXIT, asyncio.sleep)
        except StepMissed as exc:
            result.violations.append(f"fence: {exc}")
        if fleet.starts[y] > 1:  # its crash at step 1 was by plan (step 3's: _quiesce's)
            result.planned_deaths.append(log_dir / f"{y}.1.jsonl")
            result.faults["process exit (crash failpoint)"] += 1
        gaps = ConsumerGaps()
        await _quiesce(campaign, fleet, rabbit, progress, result, _Marks([], []), gaps,
                       time.monotonic())
        await _stop(campaign, fleet, gaps, result)
    return result


async def _settle(campaign: _Campaign, rabbit: RabbitConnection, progress: CommitCounter,
                  commits: int, timeout_s: float = 120.0) -> None:
    """Until `commits` messages are known committed and nothing waits in a queue, a
    committed transaction or an inbox (a fence scenario's preamble); TimeoutError after
    `timeout_s` (the run's checks then say what is missing)."""
    settings, layout = campaign.settings, campaign.layout
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        if progress.count() < commits:
            continue
        busy = await queue_depth(settings.amqp(), list(layout.queues),
                                 len(settings.retry_delays_s))
        busy += int(await campaign.pool.fetchval(
            "SELECT (SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL)"
            " + (SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL)"))
        if not busy:
            return


@dataclass
class _Marks:
    """Progress marks still to come: kills (commits reached, process) and broker-side
    closes (commits reached)."""

    kills: list[tuple[float, str]]
    closes: list[float]


async def _quiesce(campaign: _Campaign, fleet: Fleet, rabbit: RabbitConnection,
                   progress: CommitCounter, result: EngineRun, marks: _Marks,
                   gaps: ConsumerGaps, started: float) -> None:
    """Until the service is quiet: the work and retry queues empty, no committed
    transaction unfinished, no inbox row waiting, and no new commit for 1 s once the
    reference's count is reached (15 s before: the checks then say what is missing), or
    the run's timeout. Restarts crashed processes without their failpoints, kills and has
    the broker close connections at the plan's marks."""
    settings, layout = campaign.settings, campaign.layout
    idle, last = 0, -1
    while time.monotonic() - started < campaign.run_timeout_s:
        await asyncio.sleep(0.5)
        await gaps.observe(rabbit, layout.queues, {
            layout.processes[n] for n, p in fleet.procs.items() if p.poll() is not None})
        for name, proc in fleet.procs.items():
            if proc.poll() is None:
                continue
            log = fleet.log_dir / f"{name}.{fleet.starts[name]}.jsonl"
            if proc.returncode == CRASH_EXIT and crashed_by_failpoint(log):
                result.faults["process exit (crash failpoint)"] += 1
                result.planned_deaths.append(log)
            else:
                result.violations.append(f"{name} exited with {proc.returncode} during the run")
            fleet.start(name, layout.processes[name], {"EO_FAILPOINTS": ""})
            if name in layout.callees:
                await fleet.wait_for_callee(name)
        result.commits = commits = progress.count()
        while marks.kills and marks.kills[0][0] <= commits:
            _, name = marks.kills.pop(0)
            result.planned_deaths.append(fleet.log_dir / f"{name}.{fleet.starts[name]}.jsonl")
            fleet.kill(name)
            result.faults["kill -9"] += 1
            fleet.start(name, layout.processes[name], {"EO_FAILPOINTS": ""})
            if name in layout.callees:
                await fleet.wait_for_callee(name)
        while marks.closes and marks.closes[0] <= commits:
            marks.closes.pop(0)
            await asyncio.to_thread(close_all_connections, settings.amqp())
            result.faults["broker closed every connection"] += 1
        busy = await queue_depth(settings.amqp(), list(layout.queues),
                                 len(settings.retry_delays_s))
        busy += int(await campaign.pool.fetchval(
            "SELECT (SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL)"
            " + (SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL)"))
        idle = idle + 1 if busy == 0 and commits == last else 0
        last = commits
        # short of the fault-free runs' commits, wait 15 s for the rest (the checks then
        # say what is missing), or 3 s when which messages commit depends on the order
        if idle >= (2 if commits >= result.expected_commits else
                    6 if any(a.startswith("commits on ") for a in result.not_compared) else 30):
            break


def blob_findings(blobs: Sequence[str], named: str, reference_count: int | None
                  ) -> list[str]:
    """The bucket's keys `blobs` against the states' JSON text `named`: objects no state
    names (orphans), artifact keys a state names that are not in the bucket (missing), and a
    count other than the fault-free run's (`reference_count`; None: not compared, the
    campaign compares it with the other aspects); at most 10 lines of each kind."""
    found = [f"orphan: object {k} is named by no state" for k in blobs if k not in named]
    present = set(blobs)
    missing = sorted({k for k in _ARTIFACT_KEY.findall(named) if k not in present})
    found = found[:10] + [f"missing: a state names object {k}, which is not in the bucket"
                          for k in missing[:10]]
    if reference_count is not None and len(blobs) != reference_count:
        found.append(f"blobs: {len(blobs)} objects, the fault-free run wrote "
                     f"{reference_count}")
    return found


def _mentions(states: Mapping[str, Mapping[str, Any]]) -> str:
    """Every state as JSON text, for finding the blob keys they name."""
    return json.dumps({e: {p: to_jsonable(s) for p, s in by.items()}
                       for e, by in states.items()}, default=str)


async def _check(campaign: _Campaign, stage: _Stage, log_dir: Path, result: EngineRun
                 ) -> None:
    settings, service, layout = campaign.settings, campaign.service, campaign.layout
    violations = result.violations
    records = read_logs(log_dir)
    violations += audit_logs(records).violations
    deaths = [read_logs(path.parent, path.name) for path in result.planned_deaths]
    violations += [f"re-run: {v}" for v in rerun_violations(records, deaths)]
    received = {str(r.get("message_id")) for r in records if r.get("event") == MESSAGE_RECEIVED}
    sent = {str(r.get("key")) for r in records
            if r.get("event") == SIDE_EFFECT_PUBLISHED and r.get("kind") == "message"}
    violations += [f"delivery: message {m} was sent and never received"
                   for m in sorted(sent - received)][:10]
    left = await at_rest(campaign.pool)
    violations += [f"I8/I9: {n} {name} left at rest" for name, n in left.items() if n]
    result.kept = await kept_at_rest(campaign.pool)
    dead = await dead_letters(settings.amqp(), list(layout.queues),
                              database_dsn=settings.database())
    result.dead_letters = dead.total
    committed = CommitCounter(log_dir, layout.queues)
    committed.count()
    violations += await unaccounted(campaign.pool, records, committed.seen, layout.queues,
                                    stage.messages)
    states = await business_states(service, campaign.pool)
    async with bucket_client(settings) as client:
        blobs = await S3BlobStore(client, settings.bucket()).keys()
    result.blobs = len(blobs)
    violations += blob_findings(blobs, _mentions(states), None)
    executions: dict[str, dict[str, int]] = {}
    for api, provider in campaign.providers.items():
        stats = await asyncio.to_thread(provider.stats)
        executions[api] = {str(k): int(v) for k, v in stats["executions"].items()}
        result.api_executions += sum(executions[api].values())
        violations += [f"API {api}: key {k} executed {n} times"
                       for k, n in executions[api].items() if n > 1][:10]
    found = observed(layout.queues, Counter(e for e, _ in committed.seen), dead.reasons,
                     states, len(blobs), executions)
    violations += stage.expected.differences(found)
    check = getattr(campaign.workload, "check", None)
    if isinstance(campaign.workload, FileWorkload) and campaign.workload.domain_check is None:
        check = None  # a file without --check
    if check is not None and not result.scenario:  # a fence's two messages are no draw
        outcome = RunOutcome(states, blobs, executions, stage.messages)
        violations += [f"domain: {v}" for v in check(outcome)]
        result.domain_checked = True


async def unaccounted(pool: asyncpg.Pool, records: Sequence[Mapping[str, Any]],
                      committed: set[tuple[str, str]], endpoints: Iterable[str],
                      published: Iterable[OutsideMessage] = ()) -> list[str]:
    """Messages a consuming endpoint of `endpoints` received (`message.received` in the logs
    `records`; a callee's requests have their own checks), or that were `published` to it
    from outside, that it
    neither committed (`committed`: (endpoint, message ID) with commit evidence in the logs,
    or a processed-message row) nor dead-lettered (a `message.dead_lettered` event, or an
    entry in the dead-letter store): lost, whatever the order of the run. At most 10."""
    consuming = set(endpoints)
    received = {(str(r.get("endpoint")), str(r.get("message_id"))) for r in records
                if r.get("event") == MESSAGE_RECEIVED and r.get("endpoint") in consuming}
    received |= {(m.queue, m.message_id) for m in published}
    ended = set(committed) | {(str(r.get("endpoint")), str(r.get("message_id")))
                              for r in records if r.get("event") == MESSAGE_DEAD_LETTERED}
    rows = await pool.fetch(
        "SELECT endpoint, message_id::text AS m FROM eo_processed_message UNION "
        "SELECT endpoint, coalesce(message_id::text, raw_message_id) FROM eo_dead_letter")
    ended |= {(str(r["endpoint"]), str(r["m"])) for r in rows}
    lost = sorted(received - ended)
    return [f"lost: message {m} reached {e} and was neither committed nor dead-lettered there"
            for e, m in lost[:10]] + ([f"lost: ... {len(lost) - 10} more"]
                                      if len(lost) > 10 else [])
