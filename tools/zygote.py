"""A fork server for `eo` processes: imports the framework once, then forks each process.

Starting `eo consume` imports the whole framework (aio-pika, asyncpg, aioboto3, FastAPI,
pydantic, ...): 2.5 s of CPU per process here with the bytecode compiled (5.5 s without), on
2 cores, and the process tests and `eo chaos` start hundreds. The zygote pays that once per
test process (`tests/support/processes.py`'s `Fleet` forks through it) and once per campaign
(`tools/chaos/fleet.py`'s `Fleet`): it imports the modules
every `eo` command needs (`PRELOADED`, those that exist), then for each request forks a
child that takes the request's environment, sends stdout and stderr to the request's log
file, and runs `eo <args>` as `main()`; the service itself (`EO_SERVICE`) is imported by
the child. The children are ordinary processes of their own: they crash (`os._exit`), get
SIGTERM or SIGKILL and exit with their own codes, which the zygote reports. Nothing the
zygote imports may start a thread or read the environment's settings at import: the child's
environment is the request's, set after the fork.

Wire protocol (JSON lines): stdin `{"argv": [...], "env": {...}, "log": path, "cwd": path}`
(`cwd` optional: the child's working directory); stdout
`{"pid": n}` for each request in order, and `{"exited": pid, "code": c}` when a child ends.
EOF on stdin kills the remaining children and ends the zygote.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _child(request: dict[str, Any]) -> None:  # pragma: no cover - runs in the fork
    try:
        os.setpgrp()
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = ["eo", *request["argv"]]
        from entrypoints.cli import main

        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException:  # noqa: BLE001 - never return into the zygote's loop
        import traceback

        traceback.print_exc()
        os._exit(1)


#: What the zygote imports before it forks anything: what `eo consume`, `eo serve` and the
#: operators' commands import at their start (a module that is not there is skipped: a
#: service made without the sample).
PRELOADED = ("entrypoints.cli", "entrypoints.service", "entrypoints.local",
             "entrypoints.startup", "entrypoints.callee_app", "entrypoints.dead_letter_cli",
             "entrypoints.dead_letter_api", "entrypoints.operator_page",
             "entrypoints.operator_servers", "service.registry")


def serve() -> None:  # pragma: no cover - runs as its own process
    """The zygote's loop (see the module docstring)."""
    import importlib

    for name in PRELOADED:  # the point: import once, fork many
        with contextlib.suppress(ImportError):
            importlib.import_module(name)

    children: set[int] = set()

    def say(message: dict[str, Any]) -> None:
        os.write(1, (json.dumps(message) + "\n").encode())

    buffer = b""
    try:
        while True:
            readable, _, _ = select.select([0], [], [], 0.05)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
            if not readable:
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request)
                children.add(pid)
                say({"pid": pid})
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


class Children:
    """The zygote's children's exit codes, by (pid, birth): the kernel reuses a pid once its
    process is reaped (pid_max is 32,768 here, and a campaign of an hour forks more), so a
    code kept by pid alone made a new child that got an old child's pid look exited at once
    (with that old child's code: an `eo chaos` run restarted a consumer that still ran, and
    reported it as exited 0). The zygote reports each exit before the fork that may reuse
    its pid, so counting the forks of each pid tells the children apart."""

    def __init__(self) -> None:
        self.births: dict[int, int] = {}
        self.codes: dict[tuple[int, int], int] = {}

    def forked(self, pid: int) -> tuple[int, int]:
        """A child was forked as `pid`: its key."""
        self.births[pid] = self.births.get(pid, 0) + 1
        return pid, self.births[pid]

    def exited(self, pid: int, code: int) -> None:
        """The newest child of `pid` exited with `code`."""
        self.codes[(pid, self.births.get(pid, 0))] = code


class ZygoteProcess:
    """A forked `eo` process, seen like a `subprocess.Popen` (poll, wait, send_signal,
    kill, pid, returncode)."""

    def __init__(self, zygote: Zygote, key: tuple[int, int]) -> None:
        self.zygote = zygote
        self.key = key
        self.pid = key[0]

    @property
    def returncode(self) -> int | None:
        return self.zygote.children.codes.get(self.key)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        codes = self.zygote.children.codes
        with self.zygote.changed:
            if not self.zygote.changed.wait_for(lambda: self.key in codes, timeout):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            return codes[self.key]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The caller's side of the fork server: `spawn(argv, env, log)` -> `ZygoteProcess`;
    `close()` ends it and the children still running."""

    def __init__(self, wrapper: Sequence[str] = ()) -> None:
        """`wrapper`: a command the zygote runs under (e.g. `ip netns exec <name>`: the
        zygote and every process it forks in that network namespace)."""
        python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-c", "from tools.zygote import serve; serve()"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": python_path})
        self.children = Children()
        self.changed = threading.Condition()
        self._pids: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.changed:
                if "pid" in message:
                    self._pids.append(self.children.forked(int(message["pid"])))
                else:
                    self.children.exited(int(message["exited"]), int(message["code"]))
                self.changed.notify_all()

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
              ) -> ZygoteProcess:
        """Fork `eo <argv>` with exactly `env`, stdout and stderr appended to `log`, in
        `cwd` (default: the zygote's, the project's root)."""
        assert self.proc.stdin is not None
        with self._lock, self.changed:
            before = len(self._pids)
            self.proc.stdin.write((json.dumps({"argv": argv, "env": env, "log": str(log),
                                               "cwd": str(cwd or "")}) + "\n").encode())
            self.proc.stdin.flush()
            if not self.changed.wait_for(lambda: len(self._pids) > before, 60):
                raise RuntimeError("the zygote did not fork within 60 s")
            return ZygoteProcess(self, self._pids[before])

    def close(self) -> None:
        """End the zygote; it kills the children still running."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
