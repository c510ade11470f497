"""`eo pipeline bench` at a tiny size: it runs every stage, checks itself and prints rows/s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from typer.testing import CliRunner

from tools.pipeline.cli import pipeline_app

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
