"""The `eo` command line."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import aio_pika
import asyncpg
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from application.envelope import Envelope
from application.errors import PermanentError, TransientError
from application.failpoints import NAMES, PREFIXES, parse
from application.observability import CountingSink
from entrypoints.chaos.cli import chaos
from entrypoints.container import EmbeddedContainer
from entrypoints.demo.local import demo_settings, run_local_demo
from entrypoints.demo.run import DemoReport, DuplicatingDispatcher, run_demo
from entrypoints.demo.spark_ingest import derived_envelopes, export_input
from entrypoints.demo.tpch import TpchSample, generate
from entrypoints.embedded import ENDPOINTS
from entrypoints.logging import StructlogEventSink, configure_logging
from entrypoints.operations import inspect, migrate_all
from entrypoints.pipeline.cli import pipeline_app
from entrypoints.pipeline.spark import JdbcDriverMissing
from entrypoints.service import run_consumer, run_payments
from entrypoints.settings import Settings, SettingsError, load_settings

app = typer.Typer(help="Exactly-once service template: run the demo, inspect the protocol.",
                  no_args_is_help=True, add_completion=False)
console = Console(stderr=False)
app.add_typer(pipeline_app, name="pipeline")
app.command(name="chaos")(chaos)


def _settings(**overrides: object) -> Settings:
    try:
        return load_settings(**overrides)
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


@app.command()
def demo(
    sf: Annotated[float, typer.Option(help="TPC-H scale factor (0.001: 1,500 orders)")] = 0.001,
    consumers: Annotated[int, typer.Option(
        help="competing consumers per endpoint (local: orders processes, at least 2)")] = 3,
    duplicates: Annotated[float, typer.Option(help="share of messages re-published")] = 0.15,
    seed: Annotated[int, typer.Option(help="seed of shuffling and duplicate injection")] = 1,
    strategy: Annotated[list[str], typer.Option(
        help="ENDPOINT=token|outbox, repeatable (e.g. ledger=outbox)")] = [],  # noqa: B006
    log_file: Annotated[Path | None, typer.Option(
        help="write protocol events as JSON lines here")] = None,
    profile: Annotated[str, typer.Option(
        help="embedded (in-process) or local (RabbitMQ, PostgreSQL, processes)")] = "embedded",
    ingest: Annotated[str, typer.Option(
        help="how the commands enter: publish (to the gateway's queue) or spark (`eo "
             "pipeline ingest` into the gateway's inbox, twice; the gateway relays)")]
        = "publish",
) -> None:
    """Run the sample end to end with duplicates and out-of-order delivery, check the oracle.

    Exits 1 when the oracle fails or anything is left behind.
    """
    if profile not in ("embedded", "local"):
        raise typer.BadParameter("embedded or local", param_hint="--profile")
    if ingest not in ("publish", "spark"):
        raise typer.BadParameter("publish or spark", param_hint="--ingest")
    strategies = {name: str(value) for name, value in _settings().strategies.items()}
    strategies.update(_strategies(strategy))
    blob_dir = Path(tempfile.mkdtemp(prefix="eo-demo-blobs-"))
    settings = _settings(strategies=strategies, blob_dir=blob_dir)
    with console.status(f"generating TPC-H sf={sf} with DuckDB"):
        sample = generate(sf)
    ingest_dir = feed = None
    if ingest == "spark":
        with console.status(f"exporting TPC-H sf={sf} for the Spark ingest"):
            ingest_dir = export_input(sf)
        if profile == "embedded":  # no PostgreSQL: Spark's commands go to the memory inbox
            with console.status("deriving the commands with Spark"):
                feed = _spark_commands(settings, ingest_dir)
    with Progress(TextColumn("orders settled"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        bar = progress.add_task("orders", total=len(sample.expected))

        def advance(done: int) -> None:
            progress.update(bar, completed=done)

        if profile == "local":
            report = _local_demo(settings, sample, consumers, duplicates, seed, advance,
                                 ingest_dir)
        else:
            report = _embedded_demo(settings, sample, consumers, duplicates, seed, log_file,
                                    advance, feed)
    workers = (f"1 gateway, {max(consumers, 2)} orders and 1 ledger process"
               if profile == "local" else f"{consumers} consumers per endpoint")
    _print_report(report, sf, workers, strategies)
    if not report.ok:
        raise typer.Exit(1)


def _spark_commands(settings: Settings, input_dir: Path) -> list[Envelope]:
    try:
        return derived_envelopes(settings, input_dir)
    except JdbcDriverMissing as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


def _embedded_demo(settings: Settings, sample: TpchSample, consumers: int, duplicates: float,
                   seed: int, log_file: Path | None, advance: Callable[[int], None],
                   feed: list[Envelope] | None = None) -> DemoReport:
    if log_file is not None:
        configure_logging(settings.log_level, log_file.open("w"))
    rng = random.Random(seed)
    container = EmbeddedContainer(settings=settings)
    container.broker.override(EmbeddedContainer.broker.cls(shuffle=random.Random(seed + 1)))
    container.events.override(CountingSink(StructlogEventSink() if log_file else None))
    duplicating = DuplicatingDispatcher(container.broker(), duplicates, rng)
    container.dispatcher.override(duplicating)
    return asyncio.run(run_demo(container.system(), sample, duplicating, consumers, rng,
                                advance, inbox_feed=feed))


def _local_demo(settings: Settings, sample: TpchSample, consumers: int, duplicates: float,
                seed: int, advance: Callable[[int], None],
                ingest_dir: Path | None = None) -> DemoReport:
    local = demo_settings(_service_settings("local"), settings.blob_dir)
    local = local.model_copy(update={"strategies": settings.strategies})
    log_dir = Path(tempfile.mkdtemp(prefix="eo-demo-logs-"))
    console.print(f"consumer logs: {log_dir}")
    try:
        return asyncio.run(run_local_demo(local, sample, max(consumers, 2), duplicates, seed,
                                          log_dir, advance, ingest_dir=ingest_dir))
    except JdbcDriverMissing as exc:
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


def _service_settings(profile: str | None) -> Settings:
    overrides: dict[str, object] = {}
    if profile is not None:
        overrides["profile"] = profile
    settings = _settings(**overrides)
    if settings.profile == "embedded":
        settings = _settings(**{**overrides, "profile": "local"})
    return settings


def _run_service(coro: Coroutine[Any, Any, None]) -> None:
    try:
        asyncio.run(coro)
    except (TransientError, PermanentError) as exc:
        Console(stderr=True).print(f"[red]cannot start: {exc}[/red]")
        raise typer.Exit(3) from exc


@app.command()
def consume(
    endpoint: Annotated[str, typer.Option(help="the endpoint whose queue to consume")],
    profile: Annotated[str | None, typer.Option(help="local or production")] = None,
) -> None:
    """Run one endpoint's consumer on RabbitMQ and PostgreSQL (the service's main process),
    with its sweeper and its status port (/metrics, /ready). SIGTERM stops it gracefully."""
    if endpoint not in ENDPOINTS:
        raise typer.BadParameter(f"one of {sorted(ENDPOINTS)}", param_hint="--endpoint")
    _run_service(run_consumer(_service_settings(profile), endpoint))


@app.command()
def gateway(
    profile: Annotated[str | None, typer.Option(help="local or production")] = None,
) -> None:
    """Run the boundary gateway: outside commands (natural message IDs, no tokens) in,
    token-protected messages out (the inbox/outbox path)."""
    _run_service(run_consumer(_service_settings(profile), "gateway"))


@app.command(name="serve-payments")
def serve_payments(
    profile: Annotated[str | None, typer.Option(help="local or production")] = None,
) -> None:
    """Serve the payments callee over HTTP (PUT/POST/GET/DELETE /requests/{id}, bearer
    token EO_PAYMENTS_TOKEN, OpenAPI at /openapi.json) on EO_PAYMENTS_HOST:EO_PAYMENTS_PORT."""
    settings = _service_settings(profile)
    if settings.payments_token is None:
        Console(stderr=True).print("[red]invalid setting EO_PAYMENTS_TOKEN: required to "
                                   "serve payments[/red]")
        raise typer.Exit(2)
    _run_service(run_payments(settings))


@app.command()
def migrate(
    profile: Annotated[str | None, typer.Option(help="local or production")] = None,
) -> None:
    """Create the databases if missing and apply the schema migrations (alembic)."""
    settings = _service_settings(profile)
    try:
        created = asyncio.run(migrate_all(settings))
    except (OSError, asyncpg.PostgresError) as exc:
        Console(stderr=True).print(f"[red]migration failed: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(3) from exc
    for name in created:
        console.print(f"created database {name}")
    console.print("schema is up to date")


@app.command(name="inspect")
def inspect_command(
    profile: Annotated[str | None, typer.Option(help="local or production")] = None,
) -> None:
    """Tokens in flight, unfinished transaction records, deferred clean-ups, dead letters."""
    settings = _service_settings(profile)
    try:
        found = asyncio.run(inspect(settings, [*ENDPOINTS]))
    except (OSError, asyncpg.PostgresError, aio_pika.exceptions.AMQPError) as exc:
        Console(stderr=True).print(f"[red]inspection failed: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(3) from exc
    table = Table("endpoint", "unfinished TRs", "oldest (s)", "deferred clean-ups",
                  "dead letters", title=f"tokens in flight: {found.tokens}")
    for name in ENDPOINTS:
        dlq = found.dead_letters.get(name)
        table.add_row(name, str(found.unfinished.get(name, 0)),
                      f"{found.oldest_unfinished_s.get(name, 0.0):.1f}",
                      str(found.deferred_cleanups.get(name, 0)),
                      "no queue" if dlq is None else str(dlq))
    console.print(table)


@app.command()
def failpoints(
    spec: Annotated[str | None, typer.Argument(help="an EO_FAILPOINTS value to check")] = None,
) -> None:
    """List the failpoint names (protocol 10), or check an EO_FAILPOINTS value."""
    if spec is not None:
        try:
            rules = parse(spec)
        except ValueError as exc:
            Console(stderr=True).print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from exc
        for rule in rules.values():
            when = {"@": f"on hit {rule.n}", "*": f"on the first {rule.n} hits"}
            console.print(f"{rule.name}: {rule.action} {when.get(rule.mode or '', 'always')}")
        return
    for name in sorted(NAMES):
        console.print(name)
    for prefix in PREFIXES:
        console.print(f"{prefix}<{'k' if 'publish' in prefix else 'kind'}>")


@app.command()
def bench(
    messages: Annotated[int, typer.Option(min=1, help="messages per path")] = 3_000,
    partitions: Annotated[int, typer.Option(min=1, help="accounts (partitions)")] = 1_000,
    in_flight: Annotated[int, typer.Option(min=1, help="deliveries in flight (prefetch)")] = 8,
    json_path: Annotated[Path, typer.Option("--json", help="where to write the results")] = Path(
        "var/bench.json"),
    database_dsn: Annotated[str, typer.Option(help="a database of the bench's own")] = (
        "postgresql://postgres@127.0.0.1:5432/eo_bench"),
    amqp_url: Annotated[str | None, typer.Option(
        help="RabbitMQ (default: the local profile's)")] = None,
) -> None:
    """At-least-once baseline, outbox path and token path side by side on PostgreSQL and
    RabbitMQ: messages/s, end-to-end latency, DB round trips per message, dedup rows at rest."""
    from entrypoints.bench.report import Params, print_table, write_json
    from entrypoints.bench.run import run_bench

    url = amqp_url or _settings(profile="local").amqp()
    params = Params(messages, partitions, in_flight, database_dsn, url)
    try:
        result = asyncio.run(run_bench(params))
    except (TransientError, OSError, asyncpg.PostgresError, RuntimeError) as exc:
        Console(stderr=True).print(f"[red]bench failed: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(3) from exc
    print_table(result, console)
    write_json(result, json_path)
    console.print(f"results written to {json_path}")


@app.command()
def settings() -> None:
    """Print the effective settings (from EO_* variables) and exit 2 if one is invalid."""
    for name, value in _settings().model_dump(mode="json").items():
        console.print(f"EO_{name.upper()}={value}")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="eo")


if __name__ == "__main__":
    main()
