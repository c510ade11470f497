"""The consumer processes of an `eo bench` run (tools/bench/run.py): each started
(`python -m tools.bench.worker`) and waited for until ready, then stopped and its report read,
and its CPU at an instant from the samples it reports."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


async def spawn_worker(config: dict[str, Any], prefix: Sequence[str] = (),
                       start_timeout_s: float = 60) -> asyncio.subprocess.Process:
    """Start a consumer process (`python -m tools.bench.worker '<config>'`, after the
    command `prefix`) and wait until it is ready; its stderr goes to a file (a pipe nobody
    reads while it runs would fill and stop it), read back when it fails. Raises
    RuntimeError when it exits before it is ready, TimeoutError after `start_timeout_s`
    (the process is killed first: an orphan would go on consuming the bench's queues)."""
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
    proc = await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-m", "tools.bench.worker", json.dumps(config), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=errors)
    _ERRORS[proc.pid] = errors
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), start_timeout_s)
    except BaseException:  # a timeout or a cancellation: no consumer is left behind
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        _stderr(proc)
        raise
    if not line:
        raise RuntimeError(f"{config['path']}: the consumer did not start: {_stderr(proc)}")
    return proc


_ERRORS: dict[int, Any] = {}


def _stderr(proc: asyncio.subprocess.Process) -> str:
    errors = _ERRORS.pop(proc.pid, None)
    if errors is None:
        return ""
    errors.seek(0)
    text = str(errors.read().decode(errors="replace"))
    errors.close()
    return text[-2000:]


async def stop_worker(proc: asyncio.subprocess.Process, path: str) -> dict[str, Any]:
    """Stop a consumer process (SIGTERM) and return its report (the last line it printed:
    `samples` of its CPU, `round_trips`). Raises RuntimeError naming `path` when it reports
    nothing or a failure, TimeoutError when it does not exit within 60 s."""
    if proc.returncode is None:
        proc.terminate()
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    lines = out.decode().strip().splitlines()
    stderr = _stderr(proc)
    if not lines:
        raise RuntimeError(f"{path}: the consumer reported nothing: {stderr}")
    report: dict[str, Any] = json.loads(lines[-1])
    if report.get("failure"):
        raise RuntimeError(f"{path}: the consumer failed: {report['failure']}")
    return report


def cpu_at(samples: list[list[float]], t_ns: int) -> float:
    """A process's CPU seconds at `t_ns`, interpolated between its samples."""
    before = [s for s in samples if s[0] <= t_ns]
    after = [s for s in samples if s[0] >= t_ns]
    if not before:
        return after[0][1]
    if not after:
        return before[-1][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t_ns - t0) / (t1 - t0)
