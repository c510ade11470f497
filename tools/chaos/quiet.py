"""When a chaos run's service is quiet (tools/chaos/engine.py): `quiesce` waits for it while
restarting crashed processes and injecting the plan's kills and broker-side closes; `settle`
waits for a fence scenario's preamble; both ask `busy` what is left to do;
`inject_at_marks` injects production's faults beside them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import asyncpg

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.topology import queue_names
from entrypoints.faults import CRASH_EXIT
from tools.chaos.at_rest import queue_depth
from tools.chaos.broker import ConsumerGaps, close_all_connections
from tools.chaos.campaign import Campaign
from tools.chaos.checks import crashed_by_failpoint
from tools.chaos.fleet import Fleet
from tools.chaos.plan import plan_rng
from tools.chaos.report import EngineRun
from tools.chaos.verdict import CommitCounter
from tools.faults.rabbit_cluster import DLX_CONFIRM_TIMEOUT_S


async def outstanding(campaign: Campaign) -> dict[str, int]:
    """What the service still has to do, by kind (none: quiet): messages in the work and
    retry queues (on the campaign's own cluster, `--production`, per queue, ready and
    delivered and not yet acked apart: a consumer on a node that was paused holds its
    deliveries until its connection moves on), committed transactions not finished, inbox
    rows not relayed. What cannot be asked (no node answered the CLI in time, a failover
    under way) counts 1 under "not known": not known to be quiet, ask again."""
    settings = campaign.settings
    left: dict[str, int] = {}
    if campaign.production is not None:
        try:
            held = await campaign.production.messages(
                [q for e in campaign.layout.queues
                 for q in queue_names(e, settings.protocol.retry_delays_s).all_but_dead_letters])
        except RuntimeError:  # a node paused, a loaded machine
            left["not known: no node answered"] = 1
        else:
            for name, (ready, unacked) in held.items():
                left.update({f"{name} ready": ready, f"{name} unacked": unacked})
    else:
        left["queued messages"] = await queue_depth(
            settings.amqp_urls(), list(campaign.layout.queues), settings.protocol.retry_delays_s)
    try:
        row = await campaign.pool.fetchrow(
            "SELECT (SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL)"
            " AS unfinished, (SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL) AS inbox")
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        if campaign.production is None:
            raise
        left["not known: the database did not answer"] = 1  # a failover under way
    else:
        left.update({"committed transactions unfinished": int(row["unfinished"]),
                     "inbox rows not relayed": int(row["inbox"])})
    return {kind: n for kind, n in left.items() if n}


async def busy(campaign: Campaign) -> int:
    """How much `outstanding` counts (0: one condition of quiet)."""
    return sum((await outstanding(campaign)).values())


async def settle(campaign: Campaign, progress: CommitCounter, commits: int,
                 timeout_s: float = 120.0) -> None:
    """Until `commits` messages are known committed and nothing waits in a queue, a
    committed transaction or an inbox (a fence scenario's preamble), or `timeout_s` has
    passed (the run's checks then say what is missing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        if progress.count() < commits:
            continue
        if not await busy(campaign):
            return


@dataclass
class Marks:
    """Progress marks still to come: kills (commits reached, process), broker-side closes
    (commits reached) and production's faults (commits reached, kind)."""

    kills: list[tuple[float, str]]
    closes: list[float]
    production: list[tuple[float, str]] = field(default_factory=list)
    #: the task injecting `production`'s faults (`inject_at_marks`), while it runs
    injector: asyncio.Task[None] | None = None


def _hold_s(campaign: Campaign) -> float:
    """How long the service must look quiet before it is: after a fault of the run's
    RabbitMQ cluster (`--production`), longer than the at-least-once dead-lettering's confirm
    timeout (`DLX_CONFIRM_TIMEOUT_S`, and 5 s more): a retry that a retry queue expired
    into a work queue whose leader died is sent again only then, and no queue counts it
    meanwhile."""
    production = campaign.production
    if production is not None and any(r.kind.startswith("rabbitmq") for r in production.records):
        return DLX_CONFIRM_TIMEOUT_S + 5.0
    return 0.0


async def inject_at_marks(campaign: Campaign, progress: CommitCounter, result: EngineRun,
                          marks: Marks) -> None:
    """Inject production's faults (`--production`) as their marks are reached, looking at
    the commits every 0.1 s: a run may commit its messages in a few seconds, and `quiesce`'s
    own look (every 0.5 s and more) would inject them all after the work. Started before
    the messages are published (`marks.injector`), it ends after the last mark."""
    production = campaign.production
    assert production is not None
    while marks.production:
        await asyncio.sleep(0.1)
        commits = progress.count()
        while marks.production and marks.production[0][0] <= commits:
            mark, kind = marks.production[0]
            targets = plan_rng(result.plan.seed, result.plan.run, f"production/{mark}")
            await production.inject(kind, campaign.layout.queues, targets)
            marks.production.pop(0)
            result.faults[kind] += 1


async def quiesce(campaign: Campaign, fleet: Fleet, rabbit: RabbitConnection,
                  progress: CommitCounter, result: EngineRun, marks: Marks,
                  gaps: ConsumerGaps, started: float) -> None:
    """Until the service is quiet: the work and retry queues empty, no committed
    transaction unfinished, no inbox row waiting, and no new commit for 1 s once the
    reference's count is reached (15 s before: the checks then say what is missing), or
    the run's timeout. Restarts crashed processes without their failpoints, kills and has
    the broker close connections at the plan's marks."""
    settings, layout = campaign.settings, campaign.layout
    idle, last, quiet_since = 0, -1, time.monotonic()
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
            if campaign.production is not None:  # the campaign's cluster, its own CLI
                try:
                    await campaign.production.close_all_connections()
                except RuntimeError:  # no node answered: the fault was not injected
                    result.faults["broker closed every connection (not injected)"] += 1
                    continue
            else:
                await asyncio.to_thread(close_all_connections, settings.amqp())
            result.faults["broker closed every connection"] += 1
        # while commits grow the service is not quiet: `busy` is asked only when they
        # stand still (on the campaign's cluster it costs a CLI call, a second or two, which
        # would space out the marks of a run that commits its messages in a few seconds)
        if commits == last and await busy(campaign) == 0:
            idle += 1
        else:
            idle, quiet_since = 0, time.monotonic()
        last = commits
        # short of the fault-free runs' commits, wait 15 s for the rest (the checks then
        # say what is missing), or 3 s when the commits are not compared (they may depend
        # on the order)
        if idle >= (2 if commits >= result.expected_commits else
                    30 if result.commits_compared else 6) and (
                time.monotonic() - quiet_since >= _hold_s(campaign)):
            injector = marks.injector
            if injector is not None and not injector.done():
                if not marks.production or marks.production[0][0] <= commits:
                    idle = 0  # a fault being injected
                    continue
                injector.cancel()  # its marks are past what the run commits
                await asyncio.gather(injector, return_exceptions=True)
            if campaign.production is not None and campaign.production.pending:
                # quiet with a node paused or down is not quiet: what it holds comes back
                # when it does (a queue whose leader is away counts nothing meanwhile)
                await campaign.production.restore()
                idle = 0
                continue
            break
    else:  # the run's timeout: what was left says why (a lost message, a stuck queue)
        try:
            left = await outstanding(campaign)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            left = {f"not known: {exc}": 1}
        result.not_quiet.append(
            f"not quiet after {time.monotonic() - started:.0f} s: "
            + (", ".join(f"{kind} {n}" for kind, n in sorted(left.items())) or "nothing left"))
