"""A Spark standalone cluster for tests: one master and one worker started from the pyspark
package's `spark-class`, on ports they pick (0) and 127.0.0.1, the master's REST server off;
and `eo` run as a subprocess from a directory of the test's own, which is not the project's.

Typical use::

    with standalone_cluster(tmp_path) as master:        # "spark://127.0.0.1:<port>"
        result = eo_elsewhere(tmp_path, ["pipeline", "audit", "--master", master, ...], env)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.support.processes import eo_command

#: How long the master and the worker may take to start and register (7 s seen here).
START_TIMEOUT_S = 90.0
_MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.]+:\d+)")
_REGISTERED = "Successfully registered with master"


def spark_class() -> Path:
    """The pyspark package's `bin/spark-class` (Spark's launcher of its JVM daemons)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _daemon(args: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([str(spark_class()), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=dict(env), cwd=log.parent,
                                start_new_session=True)


def _wait_for(log: Path, process: subprocess.Popen[bytes], pattern: re.Pattern[str] | str
              ) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = (pattern.search(text) if isinstance(pattern, re.Pattern)
                 else re.search(re.escape(pattern), text))
        if found:
            return found.group(found.lastindex or 0)
        if process.poll() is not None:
            raise RuntimeError(f"{log.name} exited with {process.returncode}:\n{text[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{log.name}: no {pattern!r} within {START_TIMEOUT_S} s:\n"
                       f"{log.read_text(errors='replace')[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@contextlib.contextmanager
def standalone_cluster(directory: Path, cores: int = 2, memory: str = "1536m"
                       ) -> Iterator[str]:
    """A master and a worker (`cores` cores, `memory` for executors) whose logs and work
    files stay in `directory`; yields the master's URL once the worker has registered, and
    stops both (their process groups) afterwards. Raises TimeoutError or RuntimeError with
    the daemon's log when one does not start."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_LOG_DIR": str(directory), "SPARK_WORKER_DIR": str(directory / "work"),
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    master = _daemon(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                      "--port", "0", "--webui-port", "0"], directory / "master.log", env)
    try:
        url = _wait_for(directory / "master.log", master, _MASTER_URL)
        worker = _daemon(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                          "--port", "0", "--webui-port", "0", "--cores", str(cores),
                          "--memory", memory, "--work-dir", str(directory / "work"), url],
                         directory / "worker.log", env)
        try:
            _wait_for(directory / "worker.log", worker, _REGISTERED)
            yield url
        finally:
            _stop(worker)
    finally:
        _stop(master)


def _environment(env: Mapping[str, str]) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    environment.update(env)
    environment["COLUMNS"] = "200"
    environment["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver, where the cluster's daemons are
    return environment


def eo_elsewhere(cwd: Path, args: list[str], env: Mapping[str, str], timeout: float = 300
                 ) -> subprocess.CompletedProcess[str]:
    """`eo args...` run from `cwd` (not the project's directory) with `env` added to this
    process's environment, minus PYTHONPATH and PYSPARK_PYTHON (the command must find the
    project and the executors' Python on its own), and SPARK_LOCAL_IP 127.0.0.1."""
    return subprocess.run([*eo_command(), *args], cwd=cwd, env=_environment(env),
                          capture_output=True, text=True, timeout=timeout)


def spark_submit_elsewhere(cwd: Path, master: str, args: list[str], env: Mapping[str, str],
                           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`spark-submit --master master --jars <JDBC driver> <project>/entrypoints/cli.py
    args...` from `cwd`, with the environment of `eo_elsewhere` and this environment's `bin`
    leading PATH (spark-submit runs the driver with the first `python3` found there)."""
    import pyspark

    from tools.pipeline.spark import jdbc_jar

    environment = _environment(env)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    cli = Path(__file__).resolve().parents[3] / "entrypoints" / "cli.py"
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    return subprocess.run([str(submit), "--master", master, "--jars", str(jdbc_jar()),
                           str(cli), *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=timeout)


def python_elsewhere(cwd: Path, script: str, timeout: float = 300
                     ) -> subprocess.CompletedProcess[str]:
    """This interpreter running `script` (Python source) from `cwd`, with the environment of
    `eo_elsewhere`."""
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=_environment({}),
                          capture_output=True, text=True, timeout=timeout)
