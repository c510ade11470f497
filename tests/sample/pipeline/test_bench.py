"""`eo pipeline bench` at a tiny size: it runs every stage, checks itself and prints rows/s."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from adapters.postgres.admin import drop_database, with_database
from tests.support.processes import this_run
from tests.support.services import discover
from tools.pipeline.cli import pipeline_app

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_a_tiny_bench_prints_rows_per_second_per_stage(spark: SparkSession,
                                                       tmp_path: Path) -> None:
    result = CliRunner().invoke(pipeline_app, [
        "bench", "--sf", "0.001", "--records", "2000", "--keys", "1000", "--repeat", "2",
        "--workdir", str(tmp_path / "work"), "--json", str(tmp_path / "bench.json")])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "order findings (clean states, must be 0): 0" in out
    assert "orphans found: 10 of 10 generated" in out
    figures = json.loads((tmp_path / "bench.json").read_text())
    stages = {s["name"]: s for s in figures["stages"]}
    compare = stages["compare order states with the oracle (median)"]
    assert compare["rows"] == figures["line_items"] == 6005
    assert compare["rows_per_s"] > 0
    assert stages["find orphans: 2,000 records vs 1,000 keys"]["rows"] == 3000


def test_the_whole_audit_stage_runs_the_audit_on_the_states_it_wrote(
        spark: SparkSession, tmp_path: Path) -> None:
    """`--jdbc --audit`: the states through PostgreSQL, then `run_audit` on them with an
    inventory of their invoice keys, timed as a whole and stage by stage; the clean states
    give no order, orphan or missing-object finding."""
    services = discover(rabbitmq=False)
    dsn = with_database(services.postgres_dsn, this_run("eo_pipeline_bench_audit"))
    try:
        result = CliRunner().invoke(pipeline_app, [
            "bench", "--sf", "0.001", "--records", "100", "--keys", "100", "--repeat", "1",
            "--jdbc", "--database-dsn", dsn, "--audit", "--workdir", str(tmp_path / "work"),
            "--json", str(tmp_path / "bench.json")])
    finally:
        asyncio.run(drop_database(dsn))
        services.close()
    assert result.exit_code == 0, result.output
    figures = json.loads((tmp_path / "bench.json").read_text())
    stages = {s["name"]: s for s in figures["stages"]}
    whole = stages["audit end to end (eo pipeline audit's run_audit)"]
    assert whole["rows"] == 1500  # the order states audited
    assert stages["audit: compare order states with the oracle"]["rows"] == 6005
    assert whole["seconds"] >= stages["audit: read order states (JDBC)"]["seconds"]
    findings = figures["audit_findings"]
    assert (findings["orders"], findings["orphans"], findings["missing_objects"]) == (0, 0, 0)
    assert findings["outcomes"] == 1500  # no ledger states: every order is a finding


def test_the_whole_audit_needs_the_states_in_a_database() -> None:
    result = CliRunner().invoke(pipeline_app, ["bench", "--audit"])
    assert result.exit_code == 2
    assert "add --jdbc" in " ".join(result.output.replace("│", " ").split())
