"""What every run of an `eo chaos` campaign (tools/chaos/engine.py) shares: the campaign's
fixed parts (`Campaign`), a run's staging (its two fault-free runs, tools/chaos/reference.py,
then the stores, the bucket and the providers made ready: `stage_run`), and where a run's
process logs stay (`keep_logs`)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from adapters.system.clock import SystemClock
from entrypoints.local import postgres_stores
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from tools.chaos.fleet import empty_bucket
from tools.chaos.plan import Topology
from tools.chaos.production import ProductionServers
from tools.chaos.reference import Expected, reference_run
from tools.chaos.report import EngineRun
from tools.chaos.workload import OutsideMessage, Workload
from tools.fake_provider import FakeProvider
from tools.zygote import Zygote

TABLES = ("eo_token", "eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
          "eo_processed_message", "eo_stored_reply", "eo_http_request", "eo_http_tombstone",
          "eo_state_entry", "eo_inbox", "eo_dead_letter")
#: Where a run with a violation keeps its process logs when no log directory was given.
KEPT_LOGS = Path("var/chaos")


@dataclass
class Campaign:
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
    #: production's servers and faults (`eo chaos --production`), else None
    production: ProductionServers | None = None


async def keep_logs(result: EngineRun, logs: Path, temporary: bool, name: str) -> None:
    """Where the run's process logs stay: `logs` when the campaign was given a log
    directory; else, for a run with a violation or a wait for quiet that ran out of time, a
    copy in `KEPT_LOGS`/`name`."""
    result.logs = None if temporary else logs
    if (result.violations or result.not_quiet) and temporary:
        kept = KEPT_LOGS / name
        await asyncio.to_thread(shutil.copytree, logs, kept, dirs_exist_ok=True)
        result.logs = kept


async def _seed(campaign: Campaign, seeds: Mapping[str, Mapping[str, Any]]) -> None:
    stores = postgres_stores(campaign.pool, SystemClock(), campaign.service.registry)
    for endpoint, states in seeds.items():
        await stores[endpoint].seed_states(dict(states))


@dataclass(frozen=True)
class Stage:
    """A run's messages, the seeds written before them, and their two fault-free runs
    (tools/chaos/reference.py)."""

    messages: Sequence[OutsideMessage]
    seeds: Mapping[str, Mapping[str, Any]]
    expected: Expected


async def stage_run(campaign: Campaign, messages: Sequence[OutsideMessage], result: EngineRun,
                    log_dir: Path, api_failures: int = 0, api_latency_s: float = 0.0,
                    second: Sequence[OutsideMessage] | None = None) -> Stage:
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
    return Stage(messages, seeds, expected)
