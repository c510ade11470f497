"""`eo pipeline ...`: the Spark jobs (ingest, audit, sweep, bench)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from entrypoints.demo.tpch import export_tables

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
