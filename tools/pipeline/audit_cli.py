"""`eo pipeline audit`, `eo pipeline sweep` and `eo pipeline bench` (registered on the
pipeline's typer app in tools/pipeline/cli.py).

Exit codes: 0 clean (audit) or done; 1 the audit found violations; 2 bad input or settings
(the message names the option or the EO_ variable); 3 a service failed while running.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from adapters.postgres.admin import redacted_dsn
from application.strategy import Strategy
from entrypoints.settings import SettingsError, resolve_service
from tools.settings import ToolSettings, load_tool_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Endpoints with a work queue, hence a dead-letter queue (payments is an HTTP callee).
QUEUED_ENDPOINTS = ("gateway", "orders", "ledger")
_SPARK_QUIET = {"spark.ui.showConsoleProgress": "false"}

MasterOption = Annotated[str | None, typer.Option(
    help="Spark master (default EO_SPARK_MASTER: local[*]; spark://host:7077 for a cluster)")]
JarOption = Annotated[Path | None, typer.Option(
    help="PostgreSQL JDBC driver jar (default EO_SPARK_JDBC_JAR, else Debian's "
         "/usr/share/java/postgresql.jar)")]
ProfileOption = Annotated[str | None, typer.Option(
    help="local or production: whose EO_DATABASE_DSN and EO_S3_* to audit")]


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True).print(f"[red]{message}[/red]", highlight=False)
    return typer.Exit(code)


def _pipeline_settings(profile: str | None) -> ToolSettings:
    try:
        settings = load_tool_settings(**({"profile": profile} if profile else {}))
        if settings.profile == "embedded":  # the audited stores are the local services
            settings = load_tool_settings(profile="local")
    except SettingsError as exc:
        raise _fail(str(exc), 2) from exc
    return settings


async def _check_database(dsn: str, variable: str) -> None:
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise _fail(f"database {redacted_dsn(dsn)} unreachable ({type(exc).__name__}: "
                    f"{exc}): check {variable}", 2) from exc
    try:
        found = await conn.fetchval("SELECT to_regclass('eo_transaction_record') IS NOT NULL "
                                    "AND to_regclass('eo_token') IS NOT NULL")
    finally:
        await conn.close()
    if not found:
        raise _fail(f"database {redacted_dsn(dsn)} has no eo_* tables: check {variable} "
                    "or run `eo migrate`", 2)


async def dead_letter_counts(amqp_url: str, retry_delays: int) -> dict[str, int | None]:
    """Messages in each endpoint's dead-letter queue (None: the queue does not exist).
    Raises aio_pika's errors or OSError when the broker does not answer."""
    import aio_pika

    from adapters.rabbitmq.topology import queue_names

    counts: dict[str, int | None] = {}
    connection = await aio_pika.connect(amqp_url, timeout=10)
    try:
        for endpoint in QUEUED_ENDPOINTS:
            channel = await connection.channel()
            name = queue_names(endpoint, retry_delays).dead_letter
            try:
                queue = await channel.declare_queue(name, passive=True)
                counts[endpoint] = queue.declaration_result.message_count or 0
            except aio_pika.exceptions.ChannelClosed:
                counts[endpoint] = None
    finally:
        await connection.close()
    return counts


def _strategy(settings: ToolSettings, endpoint: str) -> Strategy:
    """The strategy `endpoint` runs with (the service's registry and `EO_STRATEGIES`); exits
    2 naming the variable when the service cannot be resolved."""
    try:
        return resolve_service(settings).strategy(endpoint)
    except SettingsError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


def _jar(settings: ToolSettings, jar_path: Path | None) -> Path:
    from tools.pipeline.spark import JdbcDriverMissing, jdbc_jar

    try:
        return jdbc_jar(jar_path or settings.spark_jdbc_jar)
    except JdbcDriverMissing as exc:
        raise _fail(str(exc), 2) from exc


@contextmanager
def _session(settings: ToolSettings, master: str | None, jar: Path, app_name: str,
             console: Console, shuffle_partitions: int = 8) -> Iterator[SparkSession]:
    """A Spark session for one command, stopped afterwards unless it was already running
    (a caller's, e.g. the tests')."""
    from tools.pipeline.spark import session_scope

    with ExitStack() as stack:
        with console.status("starting Spark"):
            spark = stack.enter_context(session_scope(
                master or settings.spark_master, app_name, settings.spark_driver_memory, jar,
                shuffle_partitions, extra=_SPARK_QUIET, python=settings.spark_python))
        yield spark


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    console=console, transient=True)


def audit_command(
    input_dir: Annotated[Path, typer.Option(
        "--input", help="the input dataset: orders, lineitem, customer (.parquet or .csv), "
                        "as `eo pipeline export-tpch` writes them")],
    output: Annotated[Path, typer.Option(
        help="directory for the findings (Parquet), summary.json, report.md, counts.png")],
    older_than: Annotated[float | None, typer.Option(
        "--older-than", min=0, help="seconds: orphans, tokens and unfinished transaction "
                                    "records count when older (default EO_AUDIT_OLDER_THAN_S)")
    ] = None,
    inventory: Annotated[Path | None, typer.Option(
        help="an S3 Inventory report (CSV, Parquet or ORC files) instead of listing the "
             "bucket")] = None,
    list_splits: Annotated[str, typer.Option(
        help="characters after each top-level prefix at which the live listing is split into "
             "parallel tasks")] = "123456789abcdef",
    dead_letters: Annotated[bool, typer.Option(
        help="count the dead-letter queues on RabbitMQ (EO_AMQP_URL)")] = True,
    partitions: Annotated[int, typer.Option(min=1, help="parallel JDBC reads per table")] = 4,
    master: MasterOption = None,
    jdbc_jar: JarOption = None,
    profile: ProfileOption = None,
) -> None:
    """Audit exactly-once at rest: order states against the oracle, confirmations, payments
    and ledger per customer, orphan and missing objects, stale tokens and transaction
    records, dead letters. Exits 1 on any violation, 2 on bad input or settings."""
    from tools.pipeline.audit import AuditConfig, run_audit, write_summary
    from tools.pipeline.listing import ListingError, S3Location, list_bucket, read_inventory
    from tools.pipeline.report import write_report
    from tools.pipeline.sources import InputError, input_paths, jdbc_of, read_input

    settings = _pipeline_settings(profile)
    console = Console()
    try:
        input_paths(input_dir)
    except InputError as exc:
        raise _fail(str(exc), 2) from exc
    jar = _jar(settings, jdbc_jar)
    if inventory is None and settings.s3_endpoint_url is None and settings.profile == "local":
        raise _fail("EO_S3_ENDPOINT_URL is not set: in the local profile each service process "
                    "starts a moto server of its own, which the audit cannot see; set it, or "
                    "pass --inventory", 2)
    asyncio.run(_check_database(settings.database(), "EO_DATABASE_DSN"))
    if settings.tokens_database() != settings.database():
        asyncio.run(_check_database(settings.tokens_database(), "EO_TOKEN_DSN"))
    counts: dict[str, int | None] = {}
    if dead_letters:
        try:
            counts = asyncio.run(dead_letter_counts(settings.amqp(),
                                                    len(settings.retry_delays_s)))
        except Exception as exc:
            raise _fail(f"RabbitMQ unreachable ({type(exc).__name__}: {exc}): check "
                        "EO_AMQP_URL, or pass --no-dead-letters", 2) from exc
    config = AuditConfig(
        database=jdbc_of(settings.database()), tokens=jdbc_of(settings.tokens_database()),
        now=datetime.now(UTC),
        older_than_s=settings.audit_older_than_s if older_than is None else older_than,
        ledger_stream=_strategy(settings, "ledger") is Strategy.STATE, partitions=partitions)
    location = S3Location(
        settings.bucket(), settings.s3_endpoint_url, settings.s3_region,
        settings.s3_access_key.get_secret_value() if settings.s3_access_key else None,
        settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None)
    with _session(settings, master, jar, "eo-pipeline-audit", console) as spark:
        try:
            listing = (read_inventory(spark, inventory) if inventory is not None
                       else list_bucket(spark, location, list_splits))
        except ListingError as exc:
            raise _fail(str(exc), 2) from exc
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        from tools.pipeline.spark import spark_failure

        try:
            with _progress(console) as progress:
                task = progress.add_task("audit", total=None)
                result = run_audit(spark, config, read_input(spark, input_dir), listing,
                                   output, counts,
                                   lambda stage: progress.update(task, description=stage))
        except InputError as exc:
            raise _fail(str(exc), 2) from exc
        except (Py4JJavaError, PySparkException) as exc:
            raise _fail(f"audit failed in Spark: {spark_failure(exc)}", 3) from exc
    summary = write_summary(result)
    _annotate(summary, bucket=settings.bucket(), inventory=str(inventory or ""),
              input=str(input_dir), database=redacted_dsn(settings.database()))
    report = write_report(result)
    table = Table("finding", "rows",
                  title=f"eo pipeline audit (threshold {result.cutoff:%Y-%m-%d %H:%M:%S} UTC)")
    for name, n in result.counts.items():
        table.add_row(name, f"[red]{n:,}[/red]" if n else "0")
    for endpoint, depth in result.dead_letters.items():
        table.add_row(f"dead letters: {endpoint}", "no queue" if depth is None else f"{depth:,}")
    console.print(table)
    console.print(f"report: {report}\nsummary: {summary}")
    if result.violations:
        console.print(f"[red]FAIL: {result.violations:,} violation(s)[/red]")
        raise typer.Exit(1)
    console.print("[green]PASS[/green]")


def _annotate(summary: Path, **extra: Any) -> None:
    data = json.loads(summary.read_text())
    data.update(extra)
    summary.write_text(json.dumps(data, indent=2) + "\n")


def sweep_command(
    audit_dir: Annotated[Path, typer.Option(
        "--audit", help="the --output directory of `eo pipeline audit`")],
    apply: Annotated[bool, typer.Option(
        "--apply", help="delete; without it, a dry run lists what would be deleted")] = False,
    profile: ProfileOption = None,
) -> None:
    """Delete the orphan objects the audit found, through the blob port; each key is checked
    again against the database first. A dry run unless --apply."""
    from application.errors import PermanentError, TransientError
    from tools.pipeline.sweep import SweepError, sweep

    settings = _pipeline_settings(profile)
    console = Console()
    summary_path = audit_dir / "summary.json"
    if summary_path.is_file():
        audited = json.loads(summary_path.read_text()).get("bucket")
        if not audited:  # an audit must say which bucket it listed, or it is not swept
            raise _fail(f"--audit {audit_dir}: summary.json names no bucket: refused", 2)
        if audited != settings.bucket():
            raise _fail(f"--audit {audit_dir} audited bucket {audited!r}, but EO_S3_BUCKET is "
                        f"{settings.bucket()!r}", 2)
    try:
        result = asyncio.run(sweep(
            audit_dir, settings.database(), settings.bucket(), settings.s3_endpoint_url,
            settings.s3_region,
            settings.s3_access_key.get_secret_value() if settings.s3_access_key else None,
            settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None,
            apply=apply, on_key=lambda action, key: console.print(f"{action}: {key}",
                                                                 highlight=False)))
    except SweepError as exc:
        raise _fail(str(exc), 2) from exc
    except (OSError, PermanentError, TransientError) as exc:
        raise _fail(f"sweep failed: {type(exc).__name__}: {exc}", 3) from exc
    verb = "deleted" if apply else "would delete (dry run; --apply deletes)"
    console.print(f"orphans in the audit: {len(result.orphans):,}; {verb}: "
                  f"{len(result.deleted):,}; skipped (named now): {len(result.skipped):,}; "
                  f"skipped (not the service's): {len(result.foreign):,}")


def bench_command(
    sf: Annotated[float, typer.Option(help="TPC-H scale factor (0.1: 600,000 line items)")]
        = 0.1,
    records: Annotated[int, typer.Option(min=1, help="blob side-effect records generated")]
        = 10_000_000,
    keys: Annotated[int, typer.Option(min=1, help="objects in the generated listing")]
        = 10_000_000,
    jdbc: Annotated[bool, typer.Option(
        help="also write the order states to PostgreSQL and read them back through JDBC "
             "(--database-dsn)")] = False,
    database_dsn: Annotated[str, typer.Option(
        help="a migrated database of the bench's own (its orders rows are replaced)")] = (
        "postgresql://postgres@127.0.0.1:5432/eo_pipeline_bench"),
    json_path: Annotated[Path | None, typer.Option(
        "--json", help="also write the figures here")] = None,
    workdir: Annotated[Path | None, typer.Option(
        help="scratch directory (default: a temporary one)")] = None,
    repeat: Annotated[int, typer.Option(
        min=1, help="runs of the comparison (the first includes the JVM's warm-up)")] = 5,
    shuffle_partitions: Annotated[int, typer.Option(min=1)] = 16,
    master: MasterOption = None,
    jdbc_jar: JarOption = None,
    audit: Annotated[bool, typer.Option(
        help="with --jdbc: also the whole audit on the states written (and an inventory of "
             "their invoice keys), timed end to end and stage by stage")] = False,
) -> None:
    """Time the audit's Spark stages on TPC-H (state versus oracle) and on generated
    side-effect records against a generated listing (orphans); with --jdbc --audit, the
    whole audit too; prints rows/s per stage."""
    from tools.pipeline.bench import run_bench
    from tools.pipeline.sources import jdbc_of

    if audit and not jdbc:
        raise typer.BadParameter("the whole audit reads the states through JDBC: add --jdbc",
                                 param_hint="--audit")
    settings = _pipeline_settings(None)
    console = Console()
    jar = _jar(settings, jdbc_jar)
    database = None
    if jdbc:
        from adapters.postgres.admin import ensure_database

        asyncio.run(ensure_database(database_dsn))
        from adapters.postgres.migrate import upgrade_async

        asyncio.run(upgrade_async(database_dsn))
        database = jdbc_of(database_dsn)
    with tempfile.TemporaryDirectory(prefix="eo-pipeline-bench-") as scratch:
        where = workdir or Path(scratch)
        with _session(settings, master, jar, "eo-pipeline-bench", console,
                      shuffle_partitions) as spark, _progress(console) as progress:
            task = progress.add_task("bench", total=None)
            result = run_bench(spark, where, sf, records, keys, database, repeat=repeat,
                               progress=lambda stage: progress.update(task, description=stage),
                               audit=audit)
    table = Table("stage", "rows", "seconds", "rows/s", title="eo pipeline bench")
    for s in result.stages:
        table.add_row(s.name, f"{s.rows:,}" if s.rows else "", f"{s.seconds:.2f}",
                      f"{s.rows_per_s:,.0f}" if s.rows_per_s else "")
    console.print(table)
    console.print(f"line items: {result.line_items:,}; order findings (clean states, must be "
                  f"0): {result.order_findings:,}; orphans found: {result.orphans:,} of "
                  f"{result.expected_orphans:,} generated")
    if result.audit_counts:
        console.print("the whole audit's findings (no ledger or payments states: outcomes and "
                      "customers are all findings): " + ", ".join(
                          f"{k} {v:,}" for k, v in result.audit_counts.items()))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({
            "sf": sf, "records": records, "keys": keys, "line_items": result.line_items,
            "order_findings": result.order_findings, "orphans": result.orphans,
            "audit_findings": result.audit_counts,
            "stages": [{"name": s.name, "rows": s.rows, "seconds": round(s.seconds, 3),
                        "rows_per_s": round(s.rows_per_s)} for s in result.stages]},
            indent=2) + "\n")
    clean = ("orders", "orphans", "missing_objects", "stale_tokens", "stale_transactions")
    if result.order_findings or result.orphans != result.expected_orphans or any(
            result.audit_counts.get(name, 0) for name in clean):
        raise _fail("bench sanity check failed: the clean states gave findings, or the "
                    "orphans found differ from those generated", 1)
