"""`eo dead-letters` (entrypoints/dead_letter_cli.py) refusing bad input as a usage error (exit
2, the option and the limit named) before it connects to anything: a reason over the bound,
dead-letter IDs outside PostgreSQL's bigint, ages past 100 years. What the commands do on
real servers: tests/integration/test_dead_letter_process.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from entrypoints import cli, dead_letter_cli
from tests.support.counters.registry import SPEC

TOO_BIG_ID = "99999999999999999999"


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


@pytest.mark.parametrize(("args", "named"), [
    (["show", TOO_BIG_ID], "DEAD_LETTER_ID"),
    (["show", "0"], "DEAD_LETTER_ID"),
    (["replay", "7", TOO_BIG_ID], "IDS"),
    (["discard", TOO_BIG_ID, "--why", "duplicate order"], "IDS"),
    (["list", "--older-than", "99999999999d"], "--older-than"),
    (["list", "--newer-than", "9" * 400 + "s"], "--newer-than"),
    (["replay", "--all", "--older-than", "36526d"], "--older-than"),
])
def test_ids_and_ages_out_of_range_are_usage_errors_naming_the_limit(args: list[str],
                                                                     named: str) -> None:
    code, output = _eo(*args)
    assert code == 2, output
    assert named in output
    limit = "100 years" if named.endswith("-than") else "9223372036854775807"
    assert limit in output
    assert "Traceback" not in output
