"""A chaos run's processes (tools/chaos/engine.py): the fleet with its queues declared
(`run_processes`), the callees started first, the consumers' graceful stop and the final
sweep, and, once every process has stopped, the run's checks (tools/chaos/verdict.py)."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from adapters.rabbitmq import topology as amqp_topology
from adapters.rabbitmq.connection import RabbitConnection
from application.observability import FAULT_INJECTED
from entrypoints.settings import Settings
from tools.chaos.broker import ConsumerGaps
from tools.chaos.campaign import Campaign, Stage
from tools.chaos.checks import read_logs
from tools.chaos.fleet import Fleet, final_sweep
from tools.chaos.plan import Topology
from tools.chaos.report import EngineRun
from tools.chaos.verdict import Judged, check_run


@contextlib.asynccontextmanager
async def run_processes(campaign: Campaign, stage: Stage, log_dir: Path, result: EngineRun,
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


def _fleet(campaign: Campaign, log_dir: Path) -> Fleet:
    settings = campaign.settings
    return Fleet(settings, log_dir, 0.0, callees=campaign.layout.callees,
                 zygote=campaign.zygote, extra_env={
        "EO_MAX_ATTEMPTS": str(settings.protocol.max_attempts),
        "EO_RETRY_DELAYS_S": json.dumps(list(settings.protocol.retry_delays_s)),
        "EO_STALE_AFTER_S": str(settings.protocol.stale_after_s),
        "EO_CONSUMER_WATCHDOG_S": str(settings.rabbitmq.consumer_watchdog_s),
        "EO_BLOB_STORE": "s3",
        **(campaign.production.process_env(settings, campaign.layout.callees)
           if campaign.production is not None else {})})


async def _declare(settings: Settings, layout: Topology) -> RabbitConnection:
    """A connection of the campaign's own, with every consumed queue's topology declared
    (so messages published before a consumer starts wait in its queue)."""
    rabbit = RabbitConnection(settings.amqp_urls())
    await rabbit.start()
    for endpoint in layout.queues:
        await amqp_topology.declare(rabbit, endpoint, settings.protocol.retry_delays_s,
                                    settings.rabbitmq.delivery_limit)
    return rabbit


async def start_callees(fleet: Fleet, layout: Topology, failpoints: Mapping[str, str]
                        ) -> None:
    """Start every callee's `eo serve` (with its failpoints, `""` when none) and wait until
    each serves."""
    for name in layout.callees:
        fleet.start(name, name, {"EO_FAILPOINTS": failpoints.get(name, "")})
        await fleet.wait_for_callee(name)


async def stop_run(campaign: Campaign, fleet: Fleet, gaps: ConsumerGaps, result: EngineRun
                   ) -> None:
    """The consumers' graceful stop (each must exit 0 on SIGTERM), then the final sweep."""
    gaps.finish()
    result.consumer_gaps, result.restart_gaps = gaps.longest_s, gaps.while_restarting_s
    codes = fleet.stop_all(keep=campaign.layout.callees)
    await final_sweep(fleet.caller_settings(campaign.settings), campaign.service)
    result.violations += [f"{n} exited {c} on SIGTERM" for n, c in codes.items()
                          if c not in (0, -signal.SIGTERM)]


async def _conclude(campaign: Campaign, stage: Stage, log_dir: Path, result: EngineRun,
                    started: float) -> None:
    """The checks of a stopped run, its queues deleted and its injected faults counted."""
    settings = campaign.settings
    await check_run(Judged(settings, campaign.service, campaign.layout.queues, campaign.pool,
                           campaign.providers, campaign.workload, stage.messages,
                           stage.expected), log_dir, result)
    await amqp_topology.delete_queues(settings.amqp_urls(), list(campaign.layout.queues),
                                      settings.protocol.retry_delays_s)
    for record in read_logs(log_dir):
        if record.get("event") == FAULT_INJECTED:
            result.faults[f"failpoint {str(record.get('action', '')).split(':')[0]}"] += 1
    result.seconds = time.monotonic() - started
