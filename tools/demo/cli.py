"""`eo demo`: the sample end to end, embedded (one process) or local (RabbitMQ, PostgreSQL,
processes), with duplicates and out-of-order delivery, checked by the sample's oracle."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import asyncpg
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from adapters.memory.broker import MemoryBroker
from application.envelope import Envelope
from application.errors import TransientError
from application.observability import CountingSink
from entrypoints.embedded import EmbeddedContainer
from entrypoints.logs import StructlogEventSink, configure_logging
from entrypoints.service_spec import Service, resolve_service
from entrypoints.settings import SettingsError
from tools.demo.local import demo_settings, run_local_demo
from tools.demo.run import DemoReport, DuplicatingDispatcher, run_demo
from tools.guard import refuse_production
from tools.pipeline.spark import JdbcDriverMissing
from tools.settings import ToolSettings, load_tool_settings
from tools.tpch.data import TpchSample, generate
from tools.tpch.oracle import require_sample

console = Console()
demo_app = typer.Typer(add_completion=False)


def _load(**overrides: object) -> tuple[ToolSettings, Service]:
    try:
        refuse_production("demo")
        settings = load_tool_settings(**overrides)
        service = resolve_service(settings)
        require_sample(service.registry)
        return settings, service
    except SettingsError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


def _strategies(values: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, strategy = value.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected ENDPOINT=STRATEGY, got {value!r}")
        out[name] = strategy
    return out


@demo_app.command()
def demo(
    sf: Annotated[float, typer.Option(help="TPC-H scale factor (0.001: 1,500 orders)")] = 0.001,
    consumers: Annotated[int, typer.Option(
        help="competing consumers per endpoint (local: orders processes, at least 2)")] = 3,
    duplicates: Annotated[float, typer.Option(help="share of messages re-published")] = 0.15,
    seed: Annotated[int, typer.Option(help="seed of shuffling and duplicate injection")] = 1,
    strategy: Annotated[list[str], typer.Option(
        help="ENDPOINT=token|outbox|state, repeatable (e.g. ledger=outbox)")] = [],  # noqa: B006
    log_file: Annotated[Path | None, typer.Option(
        help="write protocol events as JSON lines here")] = None,
    profile: Annotated[str, typer.Option(
        help="embedded (in-process) or local (RabbitMQ, PostgreSQL, processes)")] = "embedded",
    ingest: Annotated[str, typer.Option(
        help="how the commands enter: publish (to the gateway's queue) or spark (`eo "
             "pipeline ingest-tpch` into the gateway's inbox, twice; the gateway relays)")]
        = "publish",
    keep_database: Annotated[bool, typer.Option(
        help="local: keep the run's database (named in the report) for a look or the "
             "pipeline's audit; by default it is dropped at the end")] = False,
    blob_dir: Annotated[Path | None, typer.Option(
        help="embedded: where the invoices go, kept after the run (default: a temporary "
             "directory, removed at the end)")] = None,
    log_dir: Annotated[Path | None, typer.Option(
        help="local: where the processes' JSON logs go, kept after the run (default: a "
             "temporary directory, removed at the end)")] = None,
) -> None:
    """Run the sample end to end with duplicates and out-of-order delivery, check the oracle.

    Exits 1 when the oracle fails or anything is left behind.
    """
    if profile not in ("embedded", "local"):
        raise typer.BadParameter("embedded or local", param_hint="--profile")
    if ingest not in ("publish", "spark"):
        raise typer.BadParameter("publish or spark", param_hint="--ingest")
    base, _ = _load()
    strategies = {name: str(value) for name, value in base.strategies.items()}
    strategies.update(_strategies(strategy))
    # what nobody asked to keep (--blob-dir, --log-dir) goes with the run, however it ends
    with ExitStack() as scratch:
        def temporary(kind: str) -> Path:
            return Path(scratch.enter_context(
                tempfile.TemporaryDirectory(prefix=f"eo-demo-{kind}-")))

        settings, service = _load(strategies=strategies,
                                  blob_dir=blob_dir or temporary("blobs"))
        with console.status(f"generating TPC-H sf={sf} with DuckDB"):
            sample = generate(sf)
        ingest_dir = feed = None
        if ingest == "spark":
            from tools.demo.spark_ingest import export_input

            with console.status(f"exporting TPC-H sf={sf} for the Spark ingest"):
                ingest_dir = export_input(sf, temporary("tpch"))
            if profile == "embedded":  # no PostgreSQL: Spark's commands go to the memory inbox
                with console.status("deriving the commands with Spark"):
                    feed = _spark_commands(settings, ingest_dir)
        with Progress(TextColumn("orders settled"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            bar = progress.add_task("orders", total=len(sample.expected))

            def advance(done: int) -> None:
                progress.update(bar, completed=done)

            if profile == "local":
                if log_dir is not None:
                    log_dir.mkdir(parents=True, exist_ok=True)
                    console.print(f"the processes' logs: {log_dir}")
                report = _local_demo(settings, service, sample, consumers, duplicates, seed,
                                     advance, log_dir or temporary("logs"), ingest_dir,
                                     keep_database)
            else:
                report = _embedded_demo(settings, service, sample, consumers, duplicates,
                                        seed, log_file, advance, feed)
    workers = (f"1 gateway, {max(consumers, 2)} orders and 1 ledger process"
               if profile == "local" else f"{consumers} consumers per endpoint")
    shown = {name: str(value) for name, value in service.strategies.items()}
    _print_report(report, sf, workers, shown)
    if blob_dir is not None and profile == "embedded":
        console.print(f"invoices kept in {blob_dir}")
    if log_dir is not None and profile == "local":
        console.print(f"the processes' logs kept in {log_dir}")
    if not report.ok:
        if log_dir is None and profile == "local":
            console.print("the processes' logs were removed with the run: --log-dir DIR "
                          "keeps them")
        raise typer.Exit(1)


def _spark_commands(settings: ToolSettings, input_dir: Path) -> list[Envelope]:
    from tools.demo.spark_ingest import derived_envelopes

    try:
        return derived_envelopes(settings, input_dir)
    except JdbcDriverMissing as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


def _embedded_demo(settings: ToolSettings, service: Service, sample: TpchSample,
                   consumers: int, duplicates: float, seed: int, log_file: Path | None,
                   advance: Callable[[int], None], feed: list[Envelope] | None = None
                   ) -> DemoReport:
    if log_file is not None:
        configure_logging(settings.log_level, log_file.open("w"))
    rng = random.Random(seed)
    container = EmbeddedContainer(settings=settings, service=service)
    broker = MemoryBroker(shuffle=random.Random(seed + 1))
    container.broker.override(broker)
    container.events.override(CountingSink(StructlogEventSink() if log_file else None))
    duplicating = DuplicatingDispatcher(broker, duplicates, rng)
    container.dispatcher.override(duplicating)
    return asyncio.run(run_demo(container.workers(), sample, duplicating, consumers, rng,
                                settings.credit_limit, settings, advance, inbox_feed=feed))


def _local_demo(settings: ToolSettings, service: Service, sample: TpchSample, consumers: int,
                duplicates: float, seed: int, advance: Callable[[int], None], log_dir: Path,
                ingest_dir: Path | None = None, keep_database: bool = False) -> DemoReport:
    local_base, _ = _load(profile="local")
    local = demo_settings(local_base, settings.blobs.blob_dir)
    local = local.replaced(strategies=settings.strategies)
    try:
        return asyncio.run(run_local_demo(local, service, sample, max(consumers, 2),
                                          duplicates, seed, log_dir, advance,
                                          ingest_dir=ingest_dir, keep_database=keep_database))
    except (JdbcDriverMissing, SettingsError) as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    except (OSError, asyncpg.PostgresError, TransientError) as exc:
        Console(stderr=True).print(f"[red]local demo failed: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(3) from exc


def _print_report(report: DemoReport, sf: float, workers: str,
                  strategies: dict[str, str]) -> None:
    s = report.settlements
    shown = ", ".join(f"{name}={value}" for name, value in strategies.items())
    table = Table(title=f"eo demo: TPC-H sf={sf}, {workers}, {shown}",
                  show_header=False)
    rows = [
        ("deliveries settled", f"{report.deliveries:,} in {report.seconds:.1f} s "
                               f"({report.deliveries / report.seconds:,.0f}/s)"),
        ("  processed (distinct messages)", f"{s['processed']:,}"),
        ("  duplicates dropped", f"{s['duplicate']:,}"),
        ("  retried (delayed)", f"{s['retried']:,}"),
        ("  dead-lettered", f"{s['dead_lettered']:,}"),
        ("duplicates injected", f"{report.duplicates_injected:,} "
                                f"({report.duplicates_injected / report.deliveries:.1%} "
                                "of deliveries)"),
        ("conflicts retried", f"{report.conflicts:,}"),
        ("handler runs", f"{report.handler_runs:,}"),
        ("orders confirmed / rejected", f"{report.oracle.confirmed:,} / "
                                        f"{report.oracle.rejected:,} of {report.orders:,}"),
        *([("carrier bookings executed (one per confirmed order)",
            f"{report.oracle.bookings:,}")] if report.oracle.bookings is not None else []),
        *((f"{name} left", str(n)) for name, n in report.leftovers.items()),
        ("oracle", "PASS" if report.ok else "FAIL"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for violation in report.oracle.violations:
        console.print(f"[red]violation:[/red] {violation}")
    for note in report.notes:
        console.print(note)
