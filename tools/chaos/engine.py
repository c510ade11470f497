"""`eo chaos` for any service: a randomized fault campaign on the registry's endpoints, run as
real processes on PostgreSQL, RabbitMQ and an S3 API, with the protocol's invariants checked
for every endpoint (docs/fault-injection.md, "eo chaos for your service"). The campaign is
four parts: the *plan* of each run, a pure function of (seed, run) (tools/chaos/plan.py:
`--seed N --run K` replays its faults, not the processes' timing); the *run*, this module;
the *verdict* on a stopped run (tools/chaos/verdict.py, against the fault-free runs of
tools/chaos/reference.py); the *report* (tools/chaos/report.py).

The campaign first stages the fence scenarios of every endpoint (tools/chaos/fence.py), then
random runs, as long as `--duration` allows (`Budget`). Each random run draws its messages
from the workload (tools/chaos/workload.py: a JSON-lines file in the outside producers'
format, or a generator the service declares), runs them through the fault-free embedded
service twice (the test API, in two orders: the *reference*), then starts the service as
processes (`workers` consumers per consuming endpoint, one `eo serve` per callee, a fake
provider per third-party API), forked from a zygote (tools/zygote.py), on a database and a
virtual host of the campaign's own, publishes the messages (shuffled unless the workload
says otherwise) and injects faults:

- failpoints (protocol 10) drawn among those each endpoint reaches, in its processes'
  `EO_FAILPOINTS`: `crash` (the process exits; the campaign restarts it without the rule),
  `raise`, `sleep:<ms>`, `drop_conn`;
- `kill -9` of a random process at a random point of progress, then a restart;
- the broker closing every connection of the campaign's virtual host at random points;
- duplicates: copies published at once, copies published late, and after quiescence copies
  of processed messages re-published;
- the third-party APIs' providers answering some requests 503 and taking their time.

Then quiescence, a graceful stop, the final sweep (and the dead-letter queues moved into the
store), and the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
from pydantic import SecretStr

from adapters.postgres.pool import create_pool
from adapters.rabbitmq import topology as amqp_topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import SystemClock
from application.observability import (
    FAULT_INJECTED,
)
from entrypoints.faults import CRASH_EXIT
from entrypoints.local import postgres_stores
from entrypoints.operations import migrate_all
from entrypoints.settings import ApiSettings, Service, Settings
from tools.chaos.at_rest import queue_depth
from tools.chaos.broker import ConsumerGaps, close_all_connections
from tools.chaos.checks import crashed_by_failpoint, read_logs
from tools.chaos.fence import (
    HALVES,
    FencePair,
    Script,
    StepMissed,
    process_names,
    stage_fence,
)
from tools.chaos.fence_pairs import find_pairs
from tools.chaos.fleet import Fleet, empty_bucket, final_sweep
from tools.chaos.plan import EnginePlan, Topology, plan_rng, plan_run, topology_of
from tools.chaos.reference import Expected, reference_run
from tools.chaos.report import Budget, EngineReport, EngineRun
from tools.chaos.verdict import CommitCounter, Judged, check_run
from tools.chaos.workload import OutsideMessage, Workload
from tools.fake_provider import FakeProvider, fake_provider
from tools.scratch import own_database, own_vhost
from tools.zygote import Zygote

#: The campaign's database is `<this>_<pid>_<hex>` on EO_DATABASE_DSN's server.
ENGINE_DATABASE = "eo_chaos"
#: Its virtual host (on a broker this host administers) is `<this>-<pid>-<hex>`.
ENGINE_VHOST = "eo-chaos"
TABLES = ("eo_token", "eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
          "eo_processed_message", "eo_stored_reply", "eo_http_request", "eo_http_tombstone",
          "eo_state_entry", "eo_inbox", "eo_dead_letter")
#: Where a run with a violation keeps its process logs when no log directory was given.
KEPT_LOGS = Path("var/chaos")


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
    report = EngineReport(seed=seed, service=service.registry.service,
                          order_independent=bool(getattr(workload, "order_independent", False)))
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
    expected = Expected(first, other, order_independent=bool(
        getattr(campaign.workload, "order_independent", False)))
    result.expected_commits = expected.commits
    result.not_compared = expected.not_compared
    result.commits_compared = all(expected.compared(f"commits on {q}")
                                  for q in campaign.layout.queues)
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
    await check_run(Judged(settings, campaign.service, campaign.layout.queues, campaign.pool,
                           campaign.providers, campaign.workload, stage.messages,
                           stage.expected), log_dir, result)
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
            await _settle(campaign, progress, pair.before_commits)
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


async def _busy(campaign: _Campaign) -> int:
    """What the service still has to do: messages in the work and retry queues, committed
    transactions not finished, inbox rows not relayed (0: one condition of quiet)."""
    settings = campaign.settings
    waiting = await queue_depth(settings.amqp(), list(campaign.layout.queues),
                                len(settings.retry_delays_s))
    return waiting + int(await campaign.pool.fetchval(
        "SELECT (SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL)"
        " + (SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL)"))


async def _settle(campaign: _Campaign, progress: CommitCounter, commits: int,
                  timeout_s: float = 120.0) -> None:
    """Until `commits` messages are known committed and nothing waits in a queue, a
    committed transaction or an inbox (a fence scenario's preamble), or `timeout_s` has
    passed (the run's checks then say what is missing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        if progress.count() < commits:
            continue
        if not await _busy(campaign):
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
        busy = await _busy(campaign)
        idle = idle + 1 if busy == 0 and commits == last else 0
        last = commits
        # short of the fault-free runs' commits, wait 15 s for the rest (the checks then
        # say what is missing), or 3 s when the commits are not compared (they may depend
        # on the order)
        if idle >= (2 if commits >= result.expected_commits else
                    30 if result.commits_compared else 6):
            break


