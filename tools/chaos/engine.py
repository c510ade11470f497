"""`eo chaos` for any service: a randomized fault campaign on the registry's endpoints, run as
real processes on PostgreSQL, RabbitMQ and an S3 API, with the protocol's invariants checked
for every endpoint (docs/fault-injection.md, "eo chaos for your service"). The campaign is
four parts: the *plan* of each run, a pure function of (seed, run) (tools/chaos/plan.py:
`--seed N --run K` replays its faults, not the processes' timing); the *run*, this module
(with a run's staging, tools/chaos/campaign.py, its processes, tools/chaos/processes.py, and
its quiescence, tools/chaos/quiet.py); the *verdict* on a stopped run
(tools/chaos/verdict.py, against the fault-free runs of tools/chaos/reference.py); the
*report* (tools/chaos/report.py).

The campaign first stages the fence scenarios of every endpoint (tools/chaos/fence.py, run by
tools/chaos/fence_runs.py), then random runs, as long as `--duration` allows (`Budget`).
Each random run draws its messages from the workload (tools/chaos/workload.py: a JSON-lines
file in the outside producers' format, or a generator the service declares), runs them
through the fault-free embedded service twice (the test API, in two orders: the
*reference*), then starts the service as processes (`workers` consumers per consuming
endpoint, one `eo serve` per callee, a fake provider per third-party API), forked from a
zygote (tools/zygote.py), on a database and a virtual host of the campaign's own, publishes
the messages (shuffled unless the workload says otherwise) and injects faults:

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
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from adapters.postgres.pool import create_pool
from adapters.s3.moto_server import MotoServer
from entrypoints.named_settings import ApiSettings
from entrypoints.operations import migrate_all
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from tools.chaos.broker import ConsumerGaps, publish_messages
from tools.chaos.campaign import Campaign, keep_logs, stage_run
from tools.chaos.checks import read_logs
from tools.chaos.fence_runs import fence_runs
from tools.chaos.plan import EnginePlan, plan_run, topology_of
from tools.chaos.processes import run_processes, start_callees, stop_run
from tools.chaos.production import ProductionServers
from tools.chaos.quiet import Marks, inject_at_marks, quiesce
from tools.chaos.reactions import describe
from tools.chaos.report import Budget, EngineReport, EngineRun
from tools.chaos.verdict import CommitCounter
from tools.chaos.workload import Workload
from tools.fake_provider import fake_provider
from tools.scratch import RunBroker, own_database, own_vhost
from tools.zygote import Zygote

#: The campaign's database is `<this>_<pid>_<hex>` on EO_DATABASE_DSN's server.
ENGINE_DATABASE = "eo_chaos"
#: Its virtual host (on a broker this host administers) is `<this>-<pid>-<hex>`.
ENGINE_VHOST = "eo-chaos"


def engine_settings(base: Settings, blob_dir: Path) -> Settings:
    """`base` with enough attempts that a bounded number of faults never dead-letters, a
    sweeper that finishes an interrupted transaction within seconds, and a consumer
    watchdog shorter than a run's quiet period."""
    return base.replaced(
        profile="local", token_dsn=None, blob_dir=blob_dir, max_attempts=12,
        retry_delays_s=(0.1, 0.5, 1.0, 2.0, 5.0), stale_after_s=2.0,
        consumer_watchdog_s=5.0, blob_store="s3")


async def run_engine(settings: Settings, service: Service, workload: Workload, seed: int,
                     duration_s: float, only_run: int | None = None, size: int = 20,
                     workers: int = 2, log_root: Path | None = None,
                     on_run: Callable[[EngineRun], None] = lambda _r: None,
                     run_timeout_s: float = 240.0, database: str = ENGINE_DATABASE,
                     fence: Literal["first", "only", "off"] = "first",
                     max_runs: int | None = None,
                     production: ProductionServers | None = None,
                     fail_fast: bool = False) -> EngineReport:
    """Runs while `duration_s` allows (fence scenarios included: `Budget`; at least one run)
    and at most `max_runs` random runs, or only run `only_run`; with `fail_fast`, none after
    the first run that finds a violation (its logs kept, its replay printed).
    `fence`: the fence scenarios (tools/chaos/fence.py) first (not with `only_run`), only
    them (no random run), or none.

    `settings` from `engine_settings`: their database and broker URL name the server and
    the broker only; the campaign creates a database `<database>_<pid>_<hex>` and, where
    this host administers the broker, a virtual host of its own (else it uses the URL's,
    when that holds none of the service's queues), and removes them at the end. Raises
    `SettingsError` naming `EO_AMQP_URL` when the URL's virtual host holds the service's
    queues, and what the services raise when they are unreachable; violations are
    reported, not raised. With `production` (started, and `settings` pointing at it:
    `ProductionServers.settings`), the campaign's broker is that cluster (its default
    virtual host is the campaign's own) and each random run injects production's faults."""
    started = time.monotonic()
    layout = topology_of(service, workers)
    report = EngineReport(seed=seed, service=service.registry.service,
                          order_independent=bool(getattr(workload, "order_independent", False)))
    vhost = (_cluster_vhost(settings) if production is not None else
             own_vhost(settings.amqp(), ENGINE_VHOST, layout.queues,
                       settings.protocol.retry_delays_s, "eo chaos"))
    async with vhost as broker, own_database(settings.database(), database) as dsn:
        settings = settings.replaced(amqp_url=SecretStr(broker.url),
                                     database_dsn=SecretStr(dsn))
        temp = None if log_root is not None else Path(tempfile.mkdtemp(prefix="eo-chaos-"))
        root = log_root or temp
        assert root is not None
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
        # with production's network, the services reach these from their namespace
        host = production.serving_host if production is not None else "127.0.0.1"
        moto = MotoServer(host=host)
        with contextlib.ExitStack() as stack:
            providers = {api: stack.enter_context(fake_provider(root / f"{api}.log",
                                                                host=host))
                         for api in layout.apis}
            settings = settings.replaced(
                s3_endpoint_url=moto.start(), s3_access_key=SecretStr("local"),
                s3_secret_key=SecretStr("local"),
                apis={**settings.http.apis, **{
                    api: ApiSettings.model_validate({"url": p.url})
                    for api, p in providers.items()}})
            zygote = stack.enter_context(contextlib.closing(Zygote(
                production.zygote_wrapper() if production is not None else ())))
            try:
                await migrate_all(settings)
                pool = await create_pool(settings.database(), max_size=2)
                try:
                    campaign = Campaign(settings, service, workload, layout, root,
                                        providers, pool, size, run_timeout_s, zygote,
                                        production)
                    # a replay of one run, or the fence scenarios alone: what was asked for
                    budget = Budget(started, duration_s if only_run is None
                                    and fence != "only" else None)
                    report.time = budget.spent
                    if fence == "only" or (fence == "first" and only_run is None):
                        await fence_runs(campaign, seed, report, on_run, temp is not None,
                                         budget, fail_fast)
                    k = 0
                    while fence != "only" and not (fail_fast and report.violations):
                        index = only_run if only_run is not None else k
                        if not budget.allows("random runs", first_of_all=not report.runs) or (
                                max_runs is not None and k >= max_runs):
                            break
                        plan = plan_run(seed, index, layout, size,
                                        broker_closes=broker.vhost is not None
                                        or production is not None,
                                        production=production.kinds if production else ())
                        with budget.spending("random runs"):
                            result = await _one_run(campaign, plan, root / f"run-{index}")
                            await keep_logs(result, root / f"run-{index}",
                                            temp is not None, f"seed-{seed}-run-{index}")
                            if production is not None and result.logs and (
                                    result.violations or result.not_quiet):
                                await asyncio.to_thread(production.keep_server_logs,
                                                        result.logs / "servers")
                        report.runs.append(result)
                        on_run(result)
                        k += 1
                        if only_run is not None or (fail_fast and result.violations):
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


@contextlib.asynccontextmanager
async def _cluster_vhost(settings: Settings) -> AsyncIterator[RunBroker]:
    """The campaign's own cluster: its default virtual host is the campaign's (the run's
    queues are deleted after each run, the cluster with the campaign)."""
    yield RunBroker(settings.amqp(), None)


async def _one_run(campaign: Campaign, plan: EnginePlan, log_dir: Path) -> EngineRun:
    """Random run `plan`: staged, its processes started with the plan's failpoints, its
    messages published with the plan's copies, quiet (with the plan's kills and broker-side
    closes), the plan's late copies re-published, stopped and checked."""
    started = time.monotonic()
    settings, layout = campaign.settings, campaign.layout
    result = EngineRun(plan=plan)
    messages = campaign.workload.draw(random.Random(plan.workload_seed), plan.size)
    if getattr(campaign.workload, "shuffle", True):
        random.Random(plan.shuffle_seed).shuffle(messages)
    stage = await stage_run(campaign, messages, result, log_dir, plan.api_failures,
                            plan.api_latency_s)
    faults = result.faults
    if campaign.production is not None:
        campaign.production.begin_run()
    async with run_processes(campaign, stage, log_dir, result, started) as (fleet, rabbit):
        await start_callees(fleet, layout, plan.failpoints)
        for name, endpoint in layout.processes.items():
            if endpoint not in layout.callees:
                fleet.start(name, endpoint, {"EO_FAILPOINTS": plan.failpoints[name]})
        rng = random.Random(plan.shuffle_seed)
        progress = CommitCounter(log_dir, layout.queues)
        marks = Marks([(share * result.expected_commits, p) for share, p in plan.kills],
                      [share * result.expected_commits for share in plan.broker_closes],
                      [(share * result.expected_commits, k) for share, k in plan.production])
        if campaign.production is not None and marks.production:
            marks.injector = asyncio.create_task(
                inject_at_marks(campaign, progress, result, marks))
        copies = await publish_messages(settings.amqp_urls(), messages, plan.duplicate_rate,
                                        rng)
        result.deliveries_published = len(messages) + copies
        faults["duplicate (published twice)"] += copies
        gaps = ConsumerGaps()
        await quiesce(campaign, fleet, rabbit, progress, result, marks, gaps, started)
        if campaign.production is not None:  # the cluster and the pair whole again
            await campaign.production.restore()
        if plan.republish and result.commits >= result.expected_commits:
            late = rng.sample(messages, min(plan.republish, len(messages)))
            await publish_messages(settings.amqp_urls(), late, 0.0, rng)
            faults["duplicate (re-published after processing)"] += len(late)
            result.deliveries_published += len(late)
            await quiesce(campaign, fleet, rabbit, progress, result, Marks([], []), gaps,
                          time.monotonic())
        await stop_run(campaign, fleet, gaps, result)
    if campaign.production is not None:  # what the services did, from their whole logs
        describe(campaign.production.records, read_logs(log_dir))
        result.production = [r.line() for r in campaign.production.records]
    return result
