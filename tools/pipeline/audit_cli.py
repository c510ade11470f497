"""`eo pipeline audit` (registered on the pipeline's typer app in tools/pipeline/cli.py): the
checks of its settings and services before Spark starts, the domain check it loads, and its
summary, report and table.

Exit codes: 0 clean; 1 the audit found violations; 2 bad input or settings (the message names
the option or the EO_ variable); 3 a service failed while running.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from adapters.postgres.admin import redacted_dsn
from tools.pipeline.command import (
    JarOption,
    MasterOption,
    ProfileOption,
    driver_jar,
    fail,
    pipeline_service,
    pipeline_settings,
    progress_bar,
    spark_session,
)

if TYPE_CHECKING:
    from tools.pipeline.domain_audit import DomainAudit


async def _check_database(dsn: str, variable: str) -> None:
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise fail(f"database {redacted_dsn(dsn)} unreachable ({type(exc).__name__}: "
                    f"{exc}): check {variable}", 2) from exc
    try:
        found = await conn.fetchval("SELECT to_regclass('eo_transaction_record') IS NOT NULL "
                                    "AND to_regclass('eo_token') IS NOT NULL")
    finally:
        await conn.close()
    if not found:
        raise fail(f"database {redacted_dsn(dsn)} has no eo_* tables: check {variable} "
                    "or run `eo migrate`", 2)


async def dead_letter_counts(amqp_url: str, endpoints: Sequence[str]
                             ) -> dict[str, int | None]:
    """Messages in the dead-letter queue of each of `endpoints` (those with a work queue;
    None: the queue does not exist). Raises aio_pika's errors or OSError when the broker
    does not answer."""
    import aio_pika

    from adapters.rabbitmq.topology import queue_names

    counts: dict[str, int | None] = {}
    connection = await aio_pika.connect(amqp_url, timeout=10)
    try:
        for endpoint in endpoints:
            channel = await connection.channel()
            name = queue_names(endpoint).dead_letter
            try:
                queue = await channel.declare_queue(name, passive=True)
                counts[endpoint] = queue.declaration_result.message_count or 0
            except aio_pika.exceptions.ChannelClosed:
                counts[endpoint] = None
    finally:
        await connection.close()
    return counts


#: The domain check `--input` runs without `--domain` where its module is installed (the
#: sample's TPC-H oracle, while the service keeps the sample): a module path resolved with
#: importlib, so the framework's tools import no sample (pyproject.toml's contracts) and a
#: service without it never meets its name.
INSTALLED_DOMAIN = "tools.tpch.audit:TpchAudit"


def default_domain() -> str | None:
    """`INSTALLED_DOMAIN` when its module is installed, else None (`--input` then needs
    `--domain`)."""
    try:
        found = importlib.util.find_spec(INSTALLED_DOMAIN.partition(":")[0]) is not None
    except ImportError:  # its package is absent
        found = False
    return INSTALLED_DOMAIN if found else None


def _domain(spec: str | None, input_dir: Path | None) -> DomainAudit | None:
    """The domain check `spec` (module:name, called with `input_dir`); without `spec`,
    `default_domain()` when there is an `input_dir`. Exits 2 naming the option when it
    cannot be loaded."""
    if spec is None:
        if input_dir is None:
            return None
        spec = default_domain()
        if spec is None:
            raise fail(f"--input {input_dir}: the input of a domain check, and none is "
                        "named: add --domain module:name (a DomainAudit factory)", 2)
    module_name, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise fail(f"--domain {spec}: cannot load it ({type(exc).__name__}: {exc}); "
                    "expected module:name of a DomainAudit factory", 2) from exc
    from tools.pipeline.sources import InputError

    try:
        return cast("DomainAudit", factory(input_dir))
    except InputError as exc:  # the check's own input, refused before Spark starts
        raise fail(str(exc), 2) from exc


_DOMAIN_HELP = ("module:name of your domain check (a DomainAudit factory, called with "
                "--input; tools/pipeline/domain_audit.py)"
                + (f"; default with --input: {d}" if (d := default_domain()) else ""))


def audit_command(
    output: Annotated[Path, typer.Option(
        help="directory for the findings (Parquet), summary.json, report.md, counts.png")],
    input_dir: Annotated[Path | None, typer.Option(
        "--input", help="the domain check's input: what its factory is called with (a "
                        "directory of the data its expectations are computed from)")] = None,
    domain: Annotated[str | None, typer.Option(help=_DOMAIN_HELP)] = None,
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
    """Audit exactly-once at rest, for every endpoint of the service: stale tokens, tokens
    of dead letters, unfinished transaction records, orphan and missing objects, dead
    letters; plus your domain check (--domain, on its --input).
    Exits 1 on any violation, 2 on bad input or settings, 3 when Spark fails."""
    from tools.pipeline.audit import run_audit, write_summary
    from tools.pipeline.audit_config import audit_config
    from tools.pipeline.listing import ListingError, S3Location, list_bucket, read_inventory
    from tools.pipeline.report import write_report
    from tools.pipeline.sources import InputError, jdbc_of

    settings = pipeline_settings(profile)
    service = pipeline_service(settings)
    console = Console()
    check = _domain(domain, input_dir)
    jar = driver_jar(settings, jdbc_jar)
    if inventory is None and settings.blobs.s3_endpoint_url is None and settings.profile == "local":
        raise fail("EO_S3_ENDPOINT_URL is not set: in the local profile each service process "
                    "starts a moto server of its own, which the audit cannot see; set it, or "
                    "pass --inventory", 2)
    asyncio.run(_check_database(settings.database(), "EO_DATABASE_DSN"))
    if settings.tokens_database() != settings.database():
        asyncio.run(_check_database(settings.tokens_database(), "EO_TOKEN_DSN"))
    counts: dict[str, int | None] = {}
    if dead_letters:
        try:
            counts = asyncio.run(dead_letter_counts(settings.amqp(),
                                                    service.registry.consuming()))
        except Exception as exc:
            raise fail(f"RabbitMQ unreachable ({type(exc).__name__}: {exc}): check "
                        "EO_AMQP_URL, or pass --no-dead-letters", 2) from exc
    config = audit_config(
        service, jdbc_of(settings.database()), jdbc_of(settings.tokens_database()),
        datetime.now(UTC),
        settings.audit_older_than_s if older_than is None else older_than, partitions)
    location = S3Location(
        settings.bucket(), settings.blobs.s3_endpoint_url, settings.blobs.s3_region,
        settings.blobs.s3_access_key.get_secret_value() if settings.blobs.s3_access_key else None,
        settings.blobs.s3_secret_key.get_secret_value() if settings.blobs.s3_secret_key else None)
    with spark_session(settings, master, jar, "eo-pipeline-audit", console) as spark:
        try:
            listing = (read_inventory(spark, inventory) if inventory is not None
                       else list_bucket(spark, location, list_splits))
        except ListingError as exc:
            raise fail(str(exc), 2) from exc
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        from tools.pipeline.spark import spark_failure

        try:
            with progress_bar(console) as progress:
                task = progress.add_task("audit", total=None)
                result = run_audit(spark, config, listing, output, counts,
                                   lambda stage: progress.update(task, description=stage),
                                   domain=check)
        except InputError as exc:
            raise fail(str(exc), 2) from exc
        except (Py4JJavaError, PySparkException) as exc:
            raise fail(f"audit failed in Spark: {spark_failure(exc)}", 3) from exc
    summary = write_summary(result)
    _annotate(summary, service=service.registry.service, bucket=settings.bucket(),
              inventory=str(inventory or ""), input=str(input_dir or ""),
              domain=domain or (check is not None and default_domain()) or "",
              database=redacted_dsn(settings.database()))
    report = write_report(result)
    table = Table("finding", "rows",
                  title=f"eo pipeline audit of {service.registry.service} (threshold "
                        f"{result.cutoff:%Y-%m-%d %H:%M:%S} UTC)")
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
