"""`eo pipeline ...`: the Spark jobs for any service (ingest into a gateway's inbox, the
exactly-once audit, the orphan sweep), and the sample's own (`export-tpch`, `ingest-tpch`,
`bench`: tools/tpch/cli.py) when it is there."""

from __future__ import annotations

import importlib
import importlib.util

import typer

from tools.pipeline.audit_cli import audit_command
from tools.pipeline.ingest_cli import ingest_command
from tools.pipeline.sweep_cli import sweep_command

pipeline_app = typer.Typer(
    help="Spark jobs: ingest into a gateway's inbox, the exactly-once audit of every endpoint "
         "and the orphan sweep.", no_args_is_help=True)
pipeline_app.command("ingest")(ingest_command)
pipeline_app.command("audit")(audit_command)
pipeline_app.command("sweep")(sweep_command)

if importlib.util.find_spec("tools.tpch") is not None:  # the sample's commands
    importlib.import_module("tools.tpch.cli").register(pipeline_app)
