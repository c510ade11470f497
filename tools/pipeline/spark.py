"""One place that builds the pipeline's Spark session (local by default, a cluster through
`--master` or `spark-submit`) with the PostgreSQL JDBC driver on its class path."""

from __future__ import annotations

import os
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


def build_session(
    master: str | None = "local[*]",
    app_name: str = "eo-pipeline",
    driver_memory: str = "1g",
    jar: Path | None = None,
    shuffle_partitions: int = 8,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """A Spark session (or the active one) for the pipeline.

    `master` None leaves the master to `spark-submit`; so does running under `spark-submit`
    (it sets PYSPARK_GATEWAY_PORT): its `--master` and `--conf` win over ours. On a local
    master the driver binds to 127.0.0.1 and the UI is off (a laptop or CI machine has no
    reachable hostname). Raises JdbcDriverMissing (see `jdbc_jar`).
    """
    from pyspark.sql import SparkSession

    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        master = None
    builder = SparkSession.builder.appName(app_name)
    builder = builder.config("spark.jars", str(jdbc_jar(jar)))
    builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = (builder.config("spark.driver.host", "127.0.0.1")
                       .config("spark.driver.bindAddress", "127.0.0.1")
                       .config("spark.ui.enabled", "false")
                       .config("spark.driver.memory", driver_memory))
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


@contextmanager
def session_scope(
    master: str | None,
    app_name: str,
    driver_memory: str = "1g",
    jar: Path | None = None,
    shuffle_partitions: int = 8,
    extra: dict[str, str] | None = None,
) -> Iterator[SparkSession]:
    """`build_session` for one job: the session is stopped afterwards only when this call
    started it (a caller's running session, e.g. the tests' shared one, stays up)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    session = build_session(master, app_name, driver_memory, jar, shuffle_partitions, extra)
    try:
        yield session
    finally:
        if existing is None:
            session.stop()
