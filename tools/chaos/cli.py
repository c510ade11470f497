"""`eo chaos`: the randomized fault campaign's command line (tools/chaos/engine.py), on the
workload `--messages FILE` or `--workload module:name` gives, else on the sample's TPC-H
orders with its oracle (tools/tpch/chaos.py, when the sample is there)."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

import asyncpg
import typer
from rich.console import Console
from rich.table import Table

from application.errors import TransientError
from entrypoints.service_spec import resolve_service
from entrypoints.settings import Settings, SettingsError, load_settings
from tools.chaos.engine import ENGINE_DATABASE, engine_settings, run_engine
from tools.chaos.production import ProductionServers, unavailable
from tools.chaos.report import EngineReport, EngineRun
from tools.chaos.workload import Workload, WorkloadError, load_attribute, load_workload
from tools.guard import refuse_production

console = Console()
chaos_app = typer.Typer(add_completion=False)
#: What `eo chaos` runs without --messages or --workload: a function of the registry that
#: returns a workload (raising `SettingsError` when the registry lacks its endpoints), found
#: by name so that the tool imports no endpoint: the sample's, where the sample is there.
DEFAULT_WORKLOAD = "tools.tpch.chaos:default_workload"


@chaos_app.command()
def chaos(
    duration: Annotated[float, typer.Option(
        help="seconds of campaign, fence scenarios included: a run starts only when it is "
             "expected to end in time (the first always does); the summary says how the "
             "time was spent")] = 60.0,
    seed: Annotated[int, typer.Option(help="campaign seed: the same seed, the same plans")] = 1,
    run: Annotated[int | None, typer.Option(
        help="replay only this run of the campaign (see a violation's run number)")] = None,
    runs: Annotated[int | None, typer.Option(
        min=0, help="at most this many random runs (default: as many as --duration "
                    "allows)")] = None,
    order_independent: Annotated[bool, typer.Option(
        help="with --messages: the final states do not depend on the order the messages "
             "are taken in, so compare every endpoint's states with the fault-free run's "
             "(default: the partitions, and --check judges the states)")] = False,
    size: Annotated[int, typer.Option(
        min=1, help="the workload's draw per run, in its own unit (--workload: what its "
                    "draw(rng, size) takes; without a workload, the sample's TPC-H orders "
                    "per run, where the sample is there)")] = 20,
    log_dir: Annotated[Path | None, typer.Option(
        help="keep each run's process logs here (default: a temp dir, removed)")] = None,
    report: Annotated[Path | None, typer.Option(
        help="write the campaign report (plans, faults, violations) as JSON here")] = None,
    database: Annotated[str | None, typer.Option(
        help="prefix of the campaign's own database, created as <prefix>_<pid>_<hex> on "
             "EO_DATABASE_DSN's server and dropped at the end (default: eo_chaos)")] = None,
    messages: Annotated[Path | None, typer.Option(
        help="your service's workload: messages in the outside producers' format (JSON "
             "lines, as `eo embedded` reads them), all published each run")] = None,
    workload: Annotated[str | None, typer.Option(
        help="your service's workload: module:name of a generator it declares "
             "(tools/chaos/workload.py)")] = None,
    check: Annotated[str | None, typer.Option(
        help="with --messages: module:function, the domain's check of a run's final "
             "states (a list of violations)")] = None,
    workers: Annotated[int, typer.Option(
        min=1, help="consumer processes per consuming endpoint")] = 2,
    fence: Annotated[bool, typer.Option(
        help="first the fence scenarios (two scripted runs per endpoint that stage a late "
             "finisher against the next commit; not with --run)")] = True,
    fence_only: Annotated[bool, typer.Option(
        help="the fence scenarios only, every one of them (no random run; --duration does "
             "not apply)")] = False,
    production: Annotated[bool, typer.Option(
        help="on a RabbitMQ cluster and a PostgreSQL primary and standby of the campaign's "
             "own, each random run also loses a node, fails over or restarts the database "
             "(root and Debian's rabbitmq-server and PostgreSQL 15; docs/fault-injection.md)"
    )] = False,
    asynchronous_standby: Annotated[bool, typer.Option(
        help="with --production, the standby replicates asynchronously: a failover then "
             "loses the commits it lacked, and the campaign reports them (a documented "
             "failure of that configuration, not of the service)")] = False,
    fail_fast: Annotated[bool, typer.Option(
        envvar="EO_CHAOS_FAIL_FAST",
        help="stop after the first run (fence scenario or random) that finds a violation: "
             "its logs kept, its replay printed")] = False,
) -> None:
    """Randomized fault campaign with real processes: kill -9 and restarts, failpoints
    (crash, raise, sleep, drop_conn), broker-side connection closes (a virtual host of its
    own when the broker is local), duplicates and shuffled input; after each run the
    protocol's invariants for every endpoint (and the domain's check), first the fence
    scenarios of every endpoint, all within --duration. On your service's workload with
    --messages or --workload (without them, the sample's TPC-H workload and its oracle,
    where the sample is there).
    Exits 1 on any violation, 2 on a bad setting or workload, 3 when a service is
    unreachable. Uses the local profile's PostgreSQL and RabbitMQ (EO_DATABASE_DSN and
    EO_AMQP_URL name the server and the broker): the campaign creates a database and a
    virtual host of its own there and removes them at the end; it never touches the ones
    they name (docs/fault-injection.md)."""
    mode: Literal["first", "only", "off"] = "only" if fence_only else "first" if fence else "off"
    if messages is not None or workload is not None or check is not None:
        _any_service(duration, seed, run, log_dir, report, database or ENGINE_DATABASE,
                     messages, workload, check, size, workers, mode, runs=runs,
                     order_independent=order_independent, production=production,
                     synchronous=not asynchronous_standby, fail_fast=fail_fast)
        return
    try:  # the service's own default, where it declares one (the sample's workload)
        default = load_attribute(DEFAULT_WORKLOAD, "the default workload")
    except WorkloadError as exc:  # a service made without the sample
        Console(stderr=True).print(
            f"[red]no workload given, and none by default here ({exc}): give your service's "
            "workload with --messages FILE or --workload module:name[/red]")
        raise typer.Exit(2) from exc
    try:
        with console.status("making the default workload"):
            given = default(resolve_service(load_settings(profile="local")).registry)
    except SettingsError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    _any_service(duration, seed, run, log_dir, report, database or ENGINE_DATABASE, None,
                 None, None, size, workers, mode, given, runs, production=production,
                 synchronous=not asynchronous_standby, fail_fast=fail_fast)


def _any_service(duration: float, seed: int, run: int | None, log_dir: Path | None,
                 report: Path | None, database: str, messages: Path | None,
                 workload: str | None, check: str | None, size: int, workers: int,
                 fence: Literal["first", "only", "off"], given: Workload | None = None,
                 runs: int | None = None, order_independent: bool = False,
                 production: bool = False, synchronous: bool = True,
                 fail_fast: bool = False) -> None:
    """The campaign on the service `EO_SERVICE` names, with its workload (`given`, else
    the one `messages`, `workload` and `check` name)."""
    err = Console(stderr=True)
    try:
        refuse_production("chaos")
        base = load_settings(profile="local")
        service = resolve_service(base)
        load = given if given is not None else load_workload(messages, workload, check,
                                                             order_independent)
        if production and (why := unavailable()) is not None:
            raise SettingsError(f"--production: {why}")
        if not synchronous and not production:
            raise SettingsError("--asynchronous-standby needs --production")
    except (SettingsError, WorkloadError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    logging.getLogger("adapters.rabbitmq").setLevel(logging.ERROR)
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    # a pool refilling its floor while --production restarts the database says so each time
    logging.getLogger("asyncpg.pool").setLevel(logging.CRITICAL)
    scope = ("the fence scenarios only" if fence == "only" else f"run {run} only"
             if run is not None else f"{duration:.0f} s")
    console.print(f"eo chaos: {service.registry.service}, seed {seed}, {scope}, {workers} "
                  "consumers per endpoint")
    try:
        # the processes' blob directory (unused with the campaign's S3 bucket), removed
        # with the campaign whatever its end
        with tempfile.TemporaryDirectory(prefix="eo-chaos-blobs-") as blobs:
            result = asyncio.run(_campaign(
                engine_settings(base, Path(blobs)), production, synchronous, service, load,
                seed, duration, run, size, workers, log_dir, _print_engine_run, database=database,
                fence=fence, max_runs=runs, fail_fast=fail_fast))
    except SettingsError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    except (OSError, asyncpg.PostgresError, TransientError, TimeoutError) as exc:
        err.print_exception(max_frames=6)  # where: the campaign's tooling or a server
        err.print(f"[red]campaign failed: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(3) from exc
    _print_engine_summary(result)
    if report is not None:
        report.write_text(json.dumps(result.as_json(), indent=2, default=str))
        console.print(f"report: {report}")
    if result.violations:
        raise typer.Exit(1)


async def _campaign(settings: Settings, production: bool, synchronous: bool, *args: Any,
                    **kwargs: Any) -> EngineReport:
    """`run_engine`, on production's servers of its own with `production` (started first,
    removed after; the standby `synchronous` or not)."""
    if not production:
        return await run_engine(settings, *args, **kwargs)
    servers = ProductionServers(synchronous=synchronous)
    await servers.start()
    try:
        return await run_engine(servers.settings(settings), *args,
                                **{**kwargs, "production": servers})
    finally:
        await servers.remove()


def _print_engine_run(result: EngineRun) -> None:
    plan = result.plan
    rules = "; ".join(f"{n}: {r}" for n, r in plan.failpoints.items() if r) or "none"
    kills = ", ".join(f"{n}@{k:.0%}" for k, n in plan.kills) or "none"
    closes = ", ".join(f"@{k:.0%}" for k in plan.broker_closes) or "none"
    verdict = "[green]ok[/green]" if not result.violations else "[red]VIOLATION[/red]"
    if result.scenario:
        console.print(f"{result.scenario}: {result.commits}/{result.expected_commits} commits, "
                      f"{result.seconds:.1f} s, {verdict}")
        for violation in result.violations:
            console.print(f"  [red]{violation}[/red]")
        if result.logs is not None:
            console.print(f"  the run's process logs: {result.logs}")
        return
    console.print(f"run {plan.run}: {result.messages} messages, {result.deliveries_published} "
                  f"deliveries, {result.commits}/{result.expected_commits} commits, "
                  f"{result.dead_letters} dead letters, {result.blobs} blobs, "
                  f"{result.api_executions} API executions, {result.seconds:.1f} s, {verdict};"
                  f" failpoints {rules}; kill -9 {kills}; broker closes {closes}")
    for line in result.production:
        console.print(f"  {line}")
    for line in result.not_quiet:
        console.print(f"  [yellow]{line}[/yellow]")
    for violation in result.violations:
        console.print(f"  [red]{violation}[/red]")
    if result.violations:
        console.print(f"  replay: eo chaos ... --seed {plan.seed} --run {plan.run}")
        if result.logs is not None:
            console.print(f"  the run's process logs: {result.logs}")


def _print_engine_summary(report: EngineReport) -> None:
    table = Table(title=f"eo chaos: {report.service}, seed {report.seed}, {len(report.runs)} "
                        f"runs in {report.seconds:.0f} s", show_header=False)
    fences = [r for r in report.runs if r.scenario]
    table.add_row("runs", f"{len(report.runs) - len(fences)} random, {len(fences)} fence "
                          "scenarios")
    table.add_row("messages / deliveries published",
                  f"{sum(r.messages for r in report.runs):,} / "
                  f"{sum(r.deliveries_published for r in report.runs):,}")
    table.add_row("commits / expected", f"{sum(r.commits for r in report.runs):,} / "
                                        f"{sum(r.expected_commits for r in report.runs):,}")
    for kind, n in sorted(report.faults.items()):
        table.add_row(f"faults: {kind}", f"{n:,}")
    for endpoint, why in sorted(report.fence_skipped.items()):
        table.add_row(f"fence scenarios skipped: {endpoint}", why)
    if report.fence_not_run:
        table.add_row("fence scenarios not run (no time left)",
                      "; ".join(report.fence_not_run) + ": give --duration more, or "
                      "--fence-only")
    skipped = _not_compared(report)
    if skipped:
        table.add_row("not compared (two fault-free runs in two orders disagree: it "
                      "depends on the order of the messages, or on the run)",
                      "; ".join(f"{aspect} ({n} of {len(report.runs)} runs)"
                                for aspect, n in sorted(skipped.items())))
        table.add_row("checked whatever the order", "each message committed once or "
                      "dead-lettered, each effect once, nothing left at rest")
    table.add_row("compared with the fault-free run", "the whole outcome: commits, dead "
                  "letters, partitions, states, blobs, API executions (the workload declares "
                  "it independent of the order)" if report.order_independent else
                  "the partitions: the workload does not declare its outcome independent of "
                  "the order (order_independent, --order-independent), so the domain check "
                  "judges the rest")
    kept = Counter[str]()
    for r in report.runs:
        kept.update(r.kept)
    for what, n in sorted(kept.items()):
        if n:
            table.add_row(f"kept at rest on purpose: {what}", f"{n:,} (not a violation)")
    domain = [r for r in report.runs if r.domain_checked]
    if domain:
        table.add_row("domain check", f"on {len(domain)} random runs (a fence scenario's two "
                                      "messages are compared with their fault-free run)")
    for what, seconds in report.time.items():
        fence = what == "fence scenarios"
        count = sum(1 for r in report.runs if bool(r.scenario) == fence)
        runs = f" ({count} runs)" if what in ("fence scenarios", "random runs") else ""
        table.add_row(f"time: {what}", f"{seconds:.0f} s{runs}")
    table.add_row("violations", str(len(report.violations)))
    console.print(table)


def _not_compared(report: EngineReport) -> dict[str, int]:
    """Aspect -> the number of runs that did not compare it."""
    counted = Counter[str]()
    for r in report.runs:
        counted.update(r.not_compared)
    return dict(counted)
