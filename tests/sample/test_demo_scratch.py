"""`eo demo` leaves no temporary directory behind (issue 38): the embedded run's invoices
(`eo-demo-blobs-*`), the local run's process logs (`eo-demo-logs-*`) and the Spark ingest's
TPC-H export (`eo-demo-tpch-*`) go with the run, also when it fails; what the user asked to
keep (`--blob-dir`, `--log-dir`) stays where they said. The failures are planted where each
directory is in use; the stores and the processes are not the point here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from tools.demo import cli as demo_cli
from tools.demo import spark_ingest

runner = CliRunner()


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory `tempfile` makes temporary directories in, empty, for this test; the
    sample's service and no other EO_ setting."""
    for name in list(os.environ):
        if name.upper().startswith("EO_"):
            monkeypatch.delenv(name)
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def _demo(*args: str) -> Result:
    return runner.invoke(demo_cli.demo_app, ["--sf", "0.0002", *args])


def test_the_embedded_demo_removes_its_invoices_unless_blob_dir_keeps_them(
        tmp_path: Path, temporary: Path) -> None:
    result = _demo()
    assert result.exit_code == 0, result.output
    assert list(temporary.iterdir()) == []
    kept = tmp_path / "invoices"
    result = _demo("--blob-dir", str(kept))
    assert result.exit_code == 0, result.output
    assert f"invoices kept in {kept}" in result.output.replace("\n", "")
    assert any((kept / "invoices").iterdir())
    assert list(temporary.iterdir()) == []


def test_a_failed_embedded_demo_removes_its_invoices(
        temporary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("the run failed")

    monkeypatch.setattr(demo_cli, "_embedded_demo", broken)
    result = _demo()
    assert isinstance(result.exception, RuntimeError)
    assert list(temporary.iterdir()) == []


def _failing_local_run(seen: list[Path]) -> Any:
    async def run(*args: Any, **_kwargs: Any) -> None:
        log_dir = next(a for a in args if isinstance(a, Path))
        (log_dir / "gateway.1.jsonl").write_text("{}\n")
        seen.append(log_dir)
        raise OSError("the broker went away")

    return run


def test_a_failed_local_demo_removes_its_logs_unless_log_dir_keeps_them(
        tmp_path: Path, temporary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Path] = []
    monkeypatch.setattr(demo_cli, "run_local_demo", _failing_local_run(seen))
    result = _demo("--profile", "local")
    assert result.exit_code == 3, result.output
    [logs] = seen
    assert logs.parent == temporary                  # the logs were in a temporary directory
    assert list(temporary.iterdir()) == []
    kept = tmp_path / "logs"
    result = _demo("--profile", "local", "--log-dir", str(kept))
    assert result.exit_code == 3, result.output
    assert (kept / "gateway.1.jsonl").exists()
    assert list(temporary.iterdir()) == []


def test_a_failed_spark_ingest_removes_its_tpch_export(
        temporary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exported: list[Path] = []

    def export(_sf: float, directory: Path) -> None:
        (directory / "orders.parquet").write_bytes(b"PAR1")
        exported.append(directory)

    def spark_fails(*_args: Any) -> None:
        raise RuntimeError("Spark failed")

    monkeypatch.setattr(spark_ingest, "export_tables", export)
    monkeypatch.setattr(demo_cli, "_spark_commands", spark_fails)
    result = _demo("--ingest", "spark")
    assert isinstance(result.exception, RuntimeError)
    [export_dir] = exported
    assert export_dir.name.startswith("eo-demo-tpch-")
    assert list(temporary.iterdir()) == []
