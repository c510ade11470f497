"""`eo` run in the test's process (tests/support/in_process.py), as a subprocess would see and
give it: `os.environ` exactly the environment given during the call and as it was after
(nothing leaks into the next invocation or test), stdout and stderr apart, exit codes, and an
exception the command lets through as exit code 1 with its traceback on stderr. No servers:
`eo settings` and a usage error."""

from __future__ import annotations

import os

import pytest

from entrypoints import cli
from tests.support.counters.registry import SPEC
from tests.support.in_process import eo_in_thread, run_eo


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("EO_")} | {
        "EO_SERVICE": SPEC, **extra}


def test_the_command_sees_exactly_the_environment_given_and_the_process_keeps_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_MAX_ATTEMPTS", "7")  # the process's own: not given to the call
    monkeypatch.delenv("EO_POOL_SIZE", raising=False)
    before = dict(os.environ)
    done = run_eo(_env(EO_POOL_SIZE="3"), "settings")
    assert done.returncode == 0, done.stderr
    assert "EO_POOL_SIZE=3" in done.stdout.splitlines()
    assert "EO_MAX_ATTEMPTS=5" in done.stdout.splitlines()  # the default: 7 was removed
    assert dict(os.environ) == before
    again = run_eo(_env(), "settings")
    assert "EO_POOL_SIZE=12" in again.stdout.splitlines()  # the first call's 3 is gone
    assert dict(os.environ) == before


def test_a_usage_error_exits_2_on_stderr() -> None:
    done = run_eo(_env(), "dead-letters", "show", "0")
    assert (done.returncode, done.stdout) == (2, "")
    assert "Usage: eo dead-letters show" in done.stderr
    assert "DEAD_LETTER_ID" in done.stderr


def test_an_exception_let_through_exits_1_with_its_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug in the command")

    monkeypatch.setattr(cli, "load", broken)
    done = run_eo(_env(), "settings")
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "RuntimeError: a bug in the command" in done.stderr


async def test_from_an_async_test_in_a_thread() -> None:
    before = dict(os.environ)
    done = await eo_in_thread(_env(EO_POOL_SIZE="4"), "settings")
    assert done.returncode == 0, done.stderr
    assert "EO_POOL_SIZE=4" in done.stdout.splitlines()
    assert dict(os.environ) == before
