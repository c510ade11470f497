"""`eo demo --ingest spark`: the demo's commands come from the Spark ingest (`eo pipeline
ingest`) through the gateway's inbox instead of being published to the gateway's queue."""

from __future__ import annotations

import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from application.envelope import Envelope
from tools.pipeline.spark import session_scope
from tools.settings import ToolSettings
from tools.tpch.data import export_tables
from tools.tpch.ingest import derive_commands, ingest, read_tables, table_paths

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def export_input(sf: float, directory: Path) -> Path:
    """TPC-H `orders`, `lineitem` and `customer` at scale factor `sf` as Parquet in
    `directory` (the ingest's input: the caller removes it); returns the directory."""
    export_tables(sf, directory)
    return directory


def _session(settings: ToolSettings) -> AbstractContextManager[SparkSession]:
    return session_scope(settings.spark_master, "eo-demo-ingest", settings.spark_driver_memory,
                         settings.spark_jdbc_jar,
                         extra={"spark.ui.showConsoleProgress": "false"})


def ingest_twice(settings: ToolSettings, input_dir: Path) -> list[str]:
    """Run the Spark ingest of `input_dir` into the inbox of `settings.database()` twice (a
    producer that re-ran its job: the second run must add nothing); returns report lines.
    Blocking (Spark): call it in a thread from async code. Raises like `ingest`."""
    with _session(settings) as spark:
        first = ingest(spark, input_dir, settings.database())
        second = ingest(spark, input_dir, settings.database())
    return [f"spark ingest run 1: {first.staged:,} commands derived, {first.new:,} new in the "
            f"gateway's inbox ({first.seconds:.1f} s)",
            f"spark ingest run 2 (re-run): {second.staged:,} derived, {second.new:,} new, "
            f"{second.already_present:,} already there ({second.seconds:.1f} s)"]


def derived_envelopes(settings: ToolSettings, input_dir: Path) -> list[Envelope]:
    """The commands Spark derives from `input_dir`, collected to the driver as envelopes
    (natural message ID, type, body): the embedded demo's inbox rows."""
    with _session(settings) as spark:
        paths, fmt = table_paths(input_dir)
        rows = derive_commands(spark, *read_tables(spark, paths, fmt)).collect()
    return [Envelope(uuid.UUID(r.message_id), r.type, bytes(r.body)) for r in rows]
