"""`eo` commands run in the test's own process, for the tests whose point is what a command
does, not that it runs as a process: a cold `eo` imports and builds the whole system to
read one table (seconds of CPU each), the Typer app (entrypoints/cli.py) does the same work
on a warm interpreter. Keep at least one real subprocess of each command a module uses (the
console entry point, `tests/support/processes.py` `eo_command`).

    done = await eo_in_thread(fleet.env(), "dead-letters", "list", "--format", "json")
    assert done.returncode == 0, done.stderr     # as `subprocess.run` gives it

The process's environment and its `sys.stdout` / `sys.stderr` serve each call (settings are
read from `os.environ`: entrypoints/settings.py): calls take turns, and each leaves both as
it found them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import traceback
from collections.abc import Mapping

from typer.testing import CliRunner

from entrypoints.cli import app

_TURN = threading.Lock()


def run_eo(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`eo <args>` through the Typer app in this thread, with `os.environ` exactly `env`
    during the call (a variable of this process that `env` lacks is removed meanwhile) and
    restored after: the exit code, stdout and stderr as `subprocess.run(..., text=True,
    capture_output=True)` gives them (`args` is `["eo", *args]`). An exception the command
    does not turn into an exit code gives what the interpreter gives: exit code 1 and the
    traceback on stderr. Calls from several threads take turns. Not from a thread with a
    running event loop: the commands call `asyncio.run` (`eo_in_thread`)."""
    with _TURN:
        overrides: dict[str, str | None] = {k: None for k in os.environ if k not in env}
        overrides.update(env)
        result = CliRunner().invoke(app, list(args), env=overrides, prog_name="eo")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["eo", *args], result.exit_code, result.stdout, stderr)


async def eo_in_thread(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`run_eo(env, *args)` in a worker thread, for async tests (their loop keeps running
    meanwhile)."""
    return await asyncio.to_thread(run_eo, env, *args)
