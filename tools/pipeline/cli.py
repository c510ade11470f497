"""`eo pipeline ...`: the Spark jobs (ingest, audit, sweep, bench)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tools.pipeline.audit_cli import audit_command, bench_command, sweep_command
from tools.tpch.data import export_tables

pipeline_app = typer.Typer(
    help="Spark jobs: boundary ingest into the gateway inbox, the exactly-once audit, the "
         "orphan sweep and their benchmark.", no_args_is_help=True)


@pipeline_app.command("export-tpch")
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


@pipeline_app.command("ingest")
def ingest_command(
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
    from tools.pipeline.ingest import InboxUnavailable, check_inbox, ingest, table_paths
    from tools.pipeline.sources import InputError
    from tools.pipeline.spark import JdbcDriverMissing, session_scope, spark_failure
    from tools.pipeline.spark import jdbc_jar as jar_of
    from tools.settings import load_tool_settings

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


pipeline_app.command("audit")(audit_command)
pipeline_app.command("sweep")(sweep_command)
pipeline_app.command("bench")(bench_command)
