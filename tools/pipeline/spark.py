"""One place that builds the pipeline's Spark session (local by default, a cluster through
`--master` or `spark-submit`) with the PostgreSQL JDBC driver on its class path, the project's
code shipped to the executors and their Python named, so that a job runs from any directory,
on `local[*]`, a cluster or under `spark-submit` alike."""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Debian's `libpostgresql-jdbc-java` installs the driver here.
DEBIAN_JDBC_JAR = Path("/usr/share/java/postgresql.jar")
JDBC_DRIVER = "org.postgresql.Driver"


class JdbcDriverMissing(RuntimeError):
    """No PostgreSQL JDBC driver jar: install `libpostgresql-jdbc-java` or pass `--jdbc-jar`."""


def jdbc_jar(path: Path | None = None) -> Path:
    """The JDBC driver jar: `path` when given, else Debian's. Raises JdbcDriverMissing when
    the file does not exist (the message names both remedies)."""
    jar = path or DEBIAN_JDBC_JAR
    if not jar.is_file():
        raise JdbcDriverMissing(
            f"PostgreSQL JDBC driver not found at {jar}: `apt-get install "
            "libpostgresql-jdbc-java`, or pass --jdbc-jar / EO_SPARK_JDBC_JAR")
    return jar


#: The project's top-level packages that executors may import (the ingest's encoder, the
#: listing's S3 client): shipped with every job, whichever of them this installation has.
PROJECT_PACKAGES = ("domain", "application", "adapters", "entrypoints", "service", "tools")

#: A Python exception named at the end of a Python worker's traceback, e.g.
#: "ModuleNotFoundError: No module named 'pydantic'".
_PYTHON_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$", re.MULTILINE)
#: A Java exception naming why the executor failed, e.g. an interpreter that is not there.
_JAVA_CAUSE = re.compile(r"(?:Caused by: )?java\.io\.IOException: (.+)$", re.MULTILINE)


def project_archive(directory: Path) -> Path:
    """A zip of the project's packages (`PROJECT_PACKAGES` found by the import system, their
    files but no bytecode) written into `directory`: what `SparkContext.addPyFile` ships to
    every executor, so that they import the driver's code whatever their working directory.
    Raises OSError when a file cannot be read or the zip written."""
    archive = directory / "eo-project.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name in PROJECT_PACKAGES:
            spec = importlib.util.find_spec(name)
            for location in (spec.submodule_search_locations or []) if spec else []:
                package = Path(location)
                for path in sorted(package.rglob("*")):
                    if path.is_file() and "__pycache__" not in path.parts:
                        zipped.write(path, Path(name) / path.relative_to(package))
    return archive


def executor_python(configured: str | None) -> str:
    """The interpreter the executors run Python with: `configured` (EO_SPARK_PYTHON) when
    given, else PYSPARK_PYTHON (what `spark-submit --conf spark.pyspark.python=...` sets),
    else this driver's own (`sys.executable`), which has the project's dependencies (pydantic
    for the ingest's encoder, boto3 for the listing) and is right for `local[*]` and for
    workers on the same machine or image. Workers elsewhere need one there: name it, e.g. a
    packed environment shipped with `spark.archives` (docs/sample/pipeline.md)."""
    return configured or os.environ.get("PYSPARK_PYTHON") or sys.executable


def spark_failure(exc: BaseException) -> str:
    """What made a Spark job fail, by its cause: the Python exception a worker raised (its
    last line, not PySpark's "An exception was thrown from the Python worker" header) or the
    Java I/O error that kept the worker from starting, with the remedy when it is the
    executors' Python (a module it cannot import, an interpreter that is not there); else the
    exception's first line. At most about 600 characters."""
    text = str(exc)
    python = _PYTHON_ERROR.findall(text)
    java = _JAVA_CAUSE.findall(text)
    if python:
        kind, message = python[-1]
        cause = f"{kind.rsplit('.', 1)[-1]}: {message.strip()}"
    elif java:
        cause = java[0].strip()
    else:
        lines = text.strip().splitlines()
        cause = lines[0] if lines else repr(exc)
    cause = cause[:500]
    if "ModuleNotFoundError" in cause or "Cannot run program" in cause:
        cause += (" (the executors' Python: set EO_SPARK_PYTHON to an interpreter with the "
                  "project's pipeline dependencies on every worker; default: this driver's)")
    return cause


def build_session(
    master: str | None = "local[*]",
    app_name: str = "eo-pipeline",
    driver_memory: str = "1g",
    jar: Path | None = None,
    shuffle_partitions: int = 8,
    extra: dict[str, str] | None = None,
    python: str | None = None,
) -> SparkSession:
    """A Spark session (or the active one) for the pipeline.

    `master` None leaves the master to `spark-submit`; so does running under `spark-submit`
    (it sets PYSPARK_GATEWAY_PORT): its `--master`, `--driver-memory` and `--conf` win over
    ours. Otherwise this call launches the driver, with `driver_memory` on any master. On a
    local master the driver binds to 127.0.0.1 and the UI is off (a laptop or CI machine has
    no reachable hostname). The executors get the project's code (`project_archive`) and run
    `executor_python(python)`. Raises JdbcDriverMissing (see `jdbc_jar`), OSError when the
    project's archive cannot be written.
    """
    from pyspark.sql import SparkSession

    submitted = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if submitted:
        master = None
    builder = SparkSession.builder.appName(app_name)
    builder = builder.config("spark.jars", str(jdbc_jar(jar)))
    builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    # PySpark's context reads the executors' interpreter from the environment, not the conf.
    os.environ["PYSPARK_PYTHON"] = executor_python(python)
    if not submitted:
        builder = builder.config("spark.driver.memory", driver_memory)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = (builder.config("spark.driver.host", "127.0.0.1")
                       .config("spark.driver.bindAddress", "127.0.0.1")
                       .config("spark.ui.enabled", "false"))
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _ship_project(session)
    return session


#: Spark applications (by ID) that were given the project's archive: a session shared by
#: several jobs (the tests') gets it once.
_SHIPPED: set[str] = set()


def _ship_project(session: SparkSession) -> None:
    """Add the project's archive to the Python path of every executor, once per Spark
    application. The archive's folder is removed when this process exits."""
    context = session.sparkContext
    if context.applicationId in _SHIPPED:
        return
    directory = Path(tempfile.mkdtemp(prefix="eo-spark-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    context.addPyFile(str(project_archive(directory)))
    _SHIPPED.add(context.applicationId)


@contextmanager
def session_scope(
    master: str | None,
    app_name: str,
    driver_memory: str = "1g",
    jar: Path | None = None,
    shuffle_partitions: int = 8,
    extra: dict[str, str] | None = None,
    python: str | None = None,
) -> Iterator[SparkSession]:
    """`build_session` for one job: the session is stopped afterwards only when this call
    started it (a caller's running session, e.g. the tests' shared one, stays up)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    session = build_session(master, app_name, driver_memory, jar, shuffle_partitions, extra,
                            python)
    try:
        yield session
    finally:
        if existing is None:
            session.stop()
