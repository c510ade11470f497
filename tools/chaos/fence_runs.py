"""The fence scenarios' runs of an `eo chaos` campaign (tools/chaos/engine.py): each
endpoint's pair of messages found (tools/chaos/fence_pairs.py), then both halves of the
scenario (tools/chaos/fence.py) staged on real processes and checked as a random run is."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from entrypoints.faults import CRASH_EXIT
from tools.chaos.broker import ConsumerGaps, publish_messages
from tools.chaos.campaign import Campaign, keep_logs, stage_run
from tools.chaos.checks import read_logs
from tools.chaos.fence import HALVES, FencePair, Script, StepMissed, process_names, stage_fence
from tools.chaos.fence_pairs import find_pairs
from tools.chaos.plan import EnginePlan, plan_rng, topology_of
from tools.chaos.processes import run_processes, start_callees, stop_run
from tools.chaos.quiet import Marks, quiesce, settle
from tools.chaos.report import Budget, EngineReport, EngineRun
from tools.chaos.verdict import CommitCounter
from tools.chaos.workload import OutsideMessage


async def fence_runs(campaign: Campaign, seed: int, report: EngineReport,
                     on_run: Callable[[EngineRun], None], temporary: bool, budget: Budget,
                     fail_fast: bool = False) -> None:
    """The fence scenarios (tools/chaos/fence.py), both halves, on every endpoint the
    workload's draw for run 0 gives a pair of messages (the others, and why, in
    `report.fence_skipped`), as long as `budget` allows (those it did not allow in
    `report.fence_not_run`); with `fail_fast`, none after the first that finds a
    violation."""
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
                await keep_logs(result, campaign.root / name, temporary, f"seed-{seed}-{name}")
            report.runs.append(result)
            on_run(result)
            if fail_fast and result.violations:
                return


async def _fence_run(campaign: Campaign, seed: int, pair: FencePair, half: str,
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
    stage = await stage_run(campaign, [*pair.before, pair.first, pair.second], result,
                            log_dir, second=[*reversed(pair.before), pair.first, pair.second])
    gates = log_dir / "gates"
    await asyncio.to_thread(gates.mkdir, exist_ok=True)
    rng = random.Random(seed)

    async def publish(messages: Sequence[OutsideMessage]) -> None:
        await publish_messages(settings.amqp_urls(), messages, 0.0, rng)
        result.deliveries_published += len(messages)

    async with run_processes(campaign, stage, log_dir, result, started) as (fleet, rabbit):
        def log(name: str) -> list[dict[str, Any]]:
            return read_logs(log_dir, f"{name}.{fleet.starts[name]}.jsonl")

        script = Script(start=lambda name, env: fleet.start(name, pair.endpoint, env),
                        exit_code=lambda name: fleet.procs[name].poll(), log=log,
                        publish=publish, gates=gates)
        await start_callees(fleet, layout, {})
        for endpoint in layout.queues:
            if endpoint != pair.endpoint:
                fleet.start(f"{endpoint}-0", endpoint)
        progress = CommitCounter(log_dir, layout.queues)
        if pair.before:  # what the two depend on, processed first without a fault
            fleet.start(x, pair.endpoint)
            await publish(pair.before)
            await settle(campaign, progress, pair.before_commits)
            fleet.stop(x)
        try:
            await stage_fence(script, pair, half, CRASH_EXIT, asyncio.sleep)
        except StepMissed as exc:
            result.violations.append(f"fence: {exc}")
        if fleet.starts[y] > 1:  # its crash at step 1 was by plan (step 3's: quiesce's)
            result.planned_deaths.append(log_dir / f"{y}.1.jsonl")
            result.faults["process exit (crash failpoint)"] += 1
        gaps = ConsumerGaps()
        await quiesce(campaign, fleet, rabbit, progress, result, Marks([], []), gaps,
                      time.monotonic())
        await stop_run(campaign, fleet, gaps, result)
    return result
