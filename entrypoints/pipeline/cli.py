"""`eo pipeline ...`: the Spark jobs (ingest, audit, sweep, bench)."""

from __future__ import annotations

import typer

pipeline_app = typer.Typer(
    help="Spark jobs: boundary ingest into the gateway inbox, the exactly-once audit, the "
         "orphan sweep and their benchmark.", no_args_is_help=True)
