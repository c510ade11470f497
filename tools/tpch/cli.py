"""The sample's `eo pipeline` commands (`export-tpch`, `ingest-tpch`, `bench`), registered
by tools/pipeline/cli.py when the sample is there (a service made without it has none)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tools.pipeline.command import (
    JarOption,
    MasterOption,
    driver_jar,
    fail,
    pipeline_settings,
    progress_bar,
    spark_session,
)
from tools.tpch.data import export_tables


def register(app: typer.Typer) -> None:
    """Add the sample's commands to `eo pipeline`."""
    app.command("export-tpch")(export_tpch)
    app.command("ingest-tpch")(ingest_tpch)
    app.command("bench")(bench_command)


def export_tpch(
    output: Annotated[Path, typer.Option(help="directory to write the tables into")],
    sf: Annotated[float, typer.Option(help="TPC-H scale factor (0.1: 600,000 line items)")]
        = 0.01,
    fmt: Annotated[str, typer.Option("--format", help="parquet or csv")] = "parquet",
) -> None:
    """Write TPC-H `orders`, `lineitem` and `customer` (DuckDB, offline) as the pipeline's
    input dataset."""
    try:
        written = export_tables(sf, output, fmt)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--format") from exc
    for table, path in written.items():
        Console().print(f"{table}: {path}")


def ingest_tpch(
    input_dir: Annotated[Path, typer.Option(
        "--input", help="directory holding orders and lineitem (.parquet or .csv)")],
    fmt: Annotated[str | None, typer.Option(
        "--format", help="parquet or csv (default: whichever files exist)")] = None,
    master: Annotated[str | None, typer.Option(
        help="Spark master (default EO_SPARK_MASTER: local[*]; spark://host:7077 for a "
             "cluster)")] = None,
    jdbc_jar: Annotated[Path | None, typer.Option(
        help="PostgreSQL JDBC driver jar (default EO_SPARK_JDBC_JAR, else Debian's)")] = None,
    profile: Annotated[str | None, typer.Option(
        help="local or production: whose EO_DATABASE_DSN holds the gateway's inbox")] = None,
) -> None:
    """Derive the sample's boundary commands (natural message IDs) from TPC-H with Spark and
    add them to the gateway's inbox; re-running adds nothing. The gateway relays them."""
    import asyncpg
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from entrypoints.settings import SettingsError
    from tools.pipeline.ingest import InboxUnavailable, check_inbox
    from tools.pipeline.sources import InputError
    from tools.pipeline.spark import JdbcDriverMissing, session_scope, spark_failure
    from tools.pipeline.spark import jdbc_jar as jar_of
    from tools.settings import load_tool_settings
    from tools.tpch.ingest import ingest, table_paths

    err = Console(stderr=True)
    try:
        settings = load_tool_settings(**({"profile": profile} if profile else {}))
        if settings.profile == "embedded":  # the inbox is PostgreSQL's: local by default
            settings = load_tool_settings(profile="local")
    except SettingsError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    try:
        table_paths(input_dir, fmt)  # bad input fails before Spark starts
    except InputError as exc:
        hint = "--format" if str(exc).startswith("--format") else "--input"
        raise typer.BadParameter(str(exc).removeprefix(f"{hint} "), param_hint=hint) from exc
    try:
        jar = jar_of(jdbc_jar or settings.spark_jdbc_jar)
    except JdbcDriverMissing as exc:
        raise typer.BadParameter(str(exc), param_hint="--jdbc-jar") from exc
    try:
        check_inbox(settings.database())
    except InboxUnavailable as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(3) from exc
    console = Console()
    with ExitStack() as stack:
        with console.status("starting Spark"):
            spark = stack.enter_context(session_scope(
                master or settings.spark_master, "eo-pipeline-ingest",
                settings.spark_driver_memory, jar,
                extra={"spark.ui.showConsoleProgress": "false"}, python=settings.spark_python))
        try:
            report = ingest(spark, input_dir, settings.database(), fmt, console=console)
        except InputError as exc:
            raise typer.BadParameter(str(exc).removeprefix("--input "), param_hint="--input"
                                     ) from exc
        except (OSError, asyncpg.PostgresError) as exc:
            err.print(f"[red]ingest failed: {type(exc).__name__}: {exc} "
                      "(run `eo migrate`?)[/red]")
            raise typer.Exit(3) from exc
        except (Py4JJavaError, PySparkException) as exc:
            err.print(f"[red]ingest failed in Spark: {spark_failure(exc)}[/red]")
            raise typer.Exit(3) from exc
    console.print(f"commands derived: {report.staged:,}; new in the gateway's inbox: "
                  f"{report.new:,}; already there: {report.already_present:,} "
                  f"({report.seconds:.1f} s)")


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
    from tools.pipeline.sources import jdbc_of
    from tools.tpch.bench import run_bench

    if audit and not jdbc:
        raise typer.BadParameter("the whole audit reads the states through JDBC: add --jdbc",
                                 param_hint="--audit")
    settings = pipeline_settings(None)
    console = Console()
    jar = driver_jar(settings, jdbc_jar)
    database = None
    if jdbc:
        from adapters.postgres.admin import ensure_database

        asyncio.run(ensure_database(database_dsn))
        from adapters.postgres.migrate import upgrade_async

        asyncio.run(upgrade_async(database_dsn))
        database = jdbc_of(database_dsn)
    with tempfile.TemporaryDirectory(prefix="eo-pipeline-bench-") as scratch:
        where = workdir or Path(scratch)
        with spark_session(settings, master, jar, "eo-pipeline-bench", console,
                      shuffle_partitions) as spark, progress_bar(console) as progress:
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
        raise fail("bench sanity check failed: the clean states gave findings, or the "
                    "orphans found differ from those generated", 1)
