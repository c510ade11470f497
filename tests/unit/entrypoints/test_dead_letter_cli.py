"""`eo dead-letters` (entrypoints/dead_letter_cli.py) refusing bad input as a usage error (exit
2, the option and the limit named) before it connects to anything: a reason over the bound.
What the commands do on real servers: tests/integration/test_dead_letter_process.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from entrypoints import cli, dead_letter_cli
from tests.support.counters.registry import SPEC


@pytest.fixture(autouse=True)
def _refused_before_connecting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only `EO_SERVICE` (the counters) is set; a command that reaches the servers fails
    the test (bad input must be refused first)."""
    for name in list(os.environ):
        if name.upper().startswith("EO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("EO_SERVICE", SPEC)
    monkeypatch.chdir(tmp_path)

    def connect(*_args: Any) -> Any:
        raise AssertionError("the command went on to the servers with bad input")

    monkeypatch.setattr(dead_letter_cli, "_run", connect)


def _eo(*args: str) -> tuple[int, str]:
    """Exit code and output (stdout and stderr) of `eo dead-letters args...`."""
    result = CliRunner().invoke(cli.app, ["dead-letters", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


@pytest.mark.parametrize("args", [
    ["discard", "7", "--why", "x" * 100_000],
    ["discard", "--all", "--endpoint", "counter", "--why", "x" * 1001],
])
def test_a_why_over_1000_characters_is_a_usage_error_naming_the_limit(args: list[str]
                                                                      ) -> None:
    code, output = _eo(*args)
    assert code == 2, output
    assert "--why" in output
    assert "at most 1000 characters" in output
    assert "x" * 1001 not in output  # not echoed back
    assert "Traceback" not in output
