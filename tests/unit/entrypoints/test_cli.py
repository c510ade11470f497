"""The `eo` command line (entrypoints/cli.py) on the counters service (`EO_SERVICE`): the
endpoints listed, a bad endpoint refused, `eo embedded`, and the tools listed lazily."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoints import cli, run_embedded, tool_commands
from entrypoints.settings import Settings
from tests.support.counters.registry import SPEC
from tests.support.shipping_service import SPEC as SHIPPING_SPEC

ROOT = Path(__file__).resolve().parents[3]
NAMES = ["front", "counter", "audit", "bank"]


@pytest.fixture(autouse=True)
def _counters_service(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only `EO_SERVICE` (the counters) is set; no `.env` file is read."""
    for name in list(os.environ):
        if name.upper().startswith("EO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("EO_SERVICE", SPEC)
    monkeypatch.chdir(tmp_path)


def _eo(*args: str) -> tuple[int, str]:
    """Exit code and output (stdout and stderr) of `eo args...`."""
    result = CliRunner().invoke(cli.app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_endpoints_lists_the_services_endpoints_with_role_strategy_and_queues() -> None:
    code, output = _eo("endpoints")
    assert code == 0, output
    assert "service counters" in output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in output.splitlines() if line.startswith("│")}
    assert list(rows) == NAMES
    assert rows["front"][:3] == ["gateway", "outbox", "front, counter"]
    assert rows["counter"] == ["consumer", "token", "counter, audit", "blobs, calls bank"]
    assert rows["bank"] == ["callee", "token", "-", "stored requests: Withdraw"]


def test_endpoints_lists_the_third_party_apis_an_endpoint_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_SERVICE", SHIPPING_SPEC)
    code, output = _eo("endpoints")
    assert code == 0, output
    (shipping,) = [line for line in output.splitlines() if line.startswith("│ shipping ")]
    assert shipping.split("│")[5].strip() == "calls API carrier"


def test_endpoints_applies_eo_strategies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"audit": "state"}')
    code, output = _eo("endpoints")
    assert code == 0, output
    (audit,) = [line for line in output.splitlines() if line.startswith("│ audit ")]
    assert "state" in audit.split("│")[3]


def test_a_strategy_the_registry_refuses_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"front": "token"}')
    code, output = _eo("endpoints")
    assert code == 2
    assert "invalid setting EO_STRATEGIES: front: a gateway uses 'outbox'" in output


@pytest.mark.parametrize("command", ["consume", "serve"])
def test_an_unknown_endpoint_exits_2_naming_the_endpoints(command: str) -> None:
    code, output = _eo(command, "--endpoint", "nope")
    assert code == 2
    assert f"no endpoint 'nope'; the service has {NAMES}" in output


def _lines(path: Path, *messages: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(m) + "\n" for m in messages))
    return path


def _add(message_id: int, amount: int) -> dict[str, object]:
    return {"queue": "front", "message_id": str(uuid.UUID(int=message_id)), "type": "Add",
            "body": {"counter": "c1", "amount": amount}}


def test_embedded_runs_a_file_and_prints_the_report_as_json(tmp_path: Path) -> None:
    messages = _lines(tmp_path / "in.jsonl", _add(1, 1), _add(2, 2), _add(1, 1))
    code, output = _eo("embedded", str(messages), "--format", "json",
                       "--blob-dir", str(tmp_path / "blobs"))
    assert code == 0, output
    report = json.loads(output)
    assert report["service"] == "counters"
    assert report["input"] == {"lines": 3, "published": 3, "rejected": []}
    assert report["states"]["counter"]["c1"]["total"] == 3
    assert report["settled"]["front"]["duplicate"] == 1
    assert not any(report["at_rest"].values())
    assert len(report["blobs"]) == 2
    assert sorted(p.name for p in (tmp_path / "blobs" / "receipts").iterdir()) == \
        sorted(key.removeprefix("receipts/") for key in report["blobs"])


def test_embedded_exits_1_when_a_message_is_dead_lettered_or_rejected(tmp_path: Path) -> None:
    bad = {**_add(1, 1), "message_id": "abc"}
    messages = _lines(tmp_path / "in.jsonl", bad, {**_add(2, 2), "queue": "nope"})
    code, output = _eo("embedded", str(messages), "--format", "json",
                       "--blob-dir", str(tmp_path / "blobs"))
    assert code == 1
    report = json.loads(output)
    assert report["dead_letters"]["front"][0]["reason"] == "message_id 'abc' is not a UUID"
    assert report["input"]["rejected"][0]["line"] == 2


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory `tempfile` makes temporary directories in, empty, for this test."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def test_embedded_removes_its_temporary_blobs_and_keeps_those_of_blob_dir(
        tmp_path: Path, temporary: Path) -> None:
    messages = _lines(tmp_path / "in.jsonl", _add(1, 1), _add(2, 2))
    code, output = _eo("embedded", str(messages), "--format", "json")
    assert code == 0, output
    assert len(json.loads(output)["blobs"]) == 2
    assert list(temporary.iterdir()) == []          # no eo-embedded-blobs-* left
    code, output = _eo("embedded", str(messages), "--blob-dir", str(tmp_path / "kept"))
    assert code == 0, output
    assert len(list((tmp_path / "kept" / "receipts").iterdir())) == 2
    assert list(temporary.iterdir()) == []


def test_embedded_removes_its_temporary_blobs_when_the_run_fails(
        tmp_path: Path, temporary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(settings: Settings, *_args: object) -> None:
        (settings.blobs.blob_dir / "half-written").write_bytes(b"x")
        raise RuntimeError("the run failed")

    monkeypatch.setattr(run_embedded, "run_embedded", broken)
    code, _ = _eo("embedded", str(_lines(tmp_path / "in.jsonl", _add(1, 1))))
    assert code == 1
    assert list(temporary.iterdir()) == []


def test_embedded_refuses_an_unknown_format_and_a_missing_file(tmp_path: Path) -> None:
    assert _eo("embedded", "-", "--format", "yaml")[0] == 2
    code, output = _eo("embedded", str(tmp_path / "missing.jsonl"))
    assert code == 2
    assert "cannot read" in output


def test_help_lists_the_tools_without_importing_them() -> None:
    probe = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from entrypoints.cli import app\n"
        "from entrypoints.tool_commands import TOOLS\n"
        "result = CliRunner().invoke(app, ['--help'])\n"
        "print(result.exit_code)\n"
        "print(result.output)\n"
        "print('IMPORTED:', sorted(m for m, _, _ in TOOLS.values() if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("EO_")}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    code, *output, imported = done.stdout.strip().splitlines()
    assert code == "0", done.stdout + done.stderr
    commands = [line.split()[0] for line in output if line.startswith("  ") and line.split()]
    for name in ("consume", "serve", "embedded", "endpoints"):
        assert name in commands
    # the tools of this installation (a service made without the sample keeps `bench` only)
    present = [name for name, (module, _, _) in tool_commands.TOOLS.items()
               if (ROOT / module.replace(".", "/")).with_suffix(".py").exists()]
    assert "bench" in present
    assert [c for c in commands if c in tool_commands.TOOLS] == present
    assert imported == "IMPORTED: []"  # tools.demo.cli and the others: not imported


def test_a_tool_whose_dependencies_are_missing_says_which_group_to_sync(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "ghost_tool.py").write_text("import no_such_dependency_of_eo  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(tool_commands.TOOLS, "ghost", ("ghost_tool", "app", "A tool for the test."))
    code, output = _eo("--help")
    assert code == 0
    assert "A tool for the test." in output
    code, output = _eo("ghost")
    assert code == 2
    assert "`eo ghost` needs the `dev` dependency group" in output
    assert "uv sync --group dev" in output


def test_cli_runs_as_a_script_whose_folder_leads_the_path(tmp_path: Path) -> None:
    """`spark-submit entrypoints/cli.py ...` (docs/sample/pipeline.md) runs the file as a
    script from another directory: its folder then leads `sys.path`, so a module there named
    after a standard one (`logging.py` once) would shadow it and the command would crash."""
    shadowing = sorted(path.stem for path in (ROOT / "entrypoints").glob("*.py")
                       if path.stem in sys.stdlib_module_names)
    assert shadowing == []
    result = subprocess.run(
        [sys.executable, str(ROOT / "entrypoints" / "cli.py"), "settings"], cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "EO_PROFILE=embedded" in result.stdout
