"""What every `eo pipeline` command shares (tools/pipeline/cli.py): its Spark and profile
options, the tools' settings and the service they name, the JDBC driver's jar, a Spark session
and a progress spinner, and the exit with a message (2: bad input or settings, the message
naming the option or the EO_ variable)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from entrypoints.service_spec import Service, resolve_service
from entrypoints.settings import SettingsError
from tools.settings import ToolSettings, load_tool_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_SPARK_QUIET = {"spark.ui.showConsoleProgress": "false"}

MasterOption = Annotated[str | None, typer.Option(
    help="Spark master (default EO_SPARK_MASTER: local[*]; spark://host:7077 for a cluster)")]
JarOption = Annotated[Path | None, typer.Option(
    help="PostgreSQL JDBC driver jar (default EO_SPARK_JDBC_JAR, else Debian's "
         "/usr/share/java/postgresql.jar)")]
ProfileOption = Annotated[str | None, typer.Option(
    help="local or production: whose EO_DATABASE_DSN and EO_S3_* to audit")]


def fail(message: str, code: int) -> typer.Exit:
    """Print `message` in red on stderr; the `typer.Exit(code)` to raise."""
    Console(stderr=True).print(f"[red]{message}[/red]", highlight=False)
    return typer.Exit(code)


def pipeline_settings(profile: str | None) -> ToolSettings:
    """The tools' settings of `profile` (the local services for the embedded profile: the
    pipeline reads PostgreSQL and S3); exits 2 naming the variable of a bad setting."""
    try:
        settings = load_tool_settings(**({"profile": profile} if profile else {}))
        if settings.profile == "embedded":  # the audited stores are the local services
            settings = load_tool_settings(profile="local")
    except SettingsError as exc:
        raise fail(str(exc), 2) from exc
    return settings


def pipeline_service(settings: ToolSettings) -> Service:
    """The service `EO_SERVICE` names, with its strategies; exits 2 naming the variable when
    it cannot be resolved."""
    try:
        return resolve_service(settings)
    except SettingsError as exc:
        raise fail(str(exc), 2) from exc


def driver_jar(settings: ToolSettings, jar_path: Path | None) -> Path:
    """The PostgreSQL JDBC driver's jar (`--jdbc-jar`, EO_SPARK_JDBC_JAR, Debian's); exits 2
    saying how to get it."""
    from tools.pipeline.spark import JdbcDriverMissing, jdbc_jar

    try:
        return jdbc_jar(jar_path or settings.spark_jdbc_jar)
    except JdbcDriverMissing as exc:
        raise fail(str(exc), 2) from exc


@contextmanager
def spark_session(settings: ToolSettings, master: str | None, jar: Path, app_name: str,
                  console: Console, shuffle_partitions: int = 8) -> Iterator[SparkSession]:
    """A Spark session for one command, stopped afterwards unless it was already running
    (a caller's, e.g. the tests')."""
    from tools.pipeline.spark import session_scope

    with ExitStack() as stack:
        with console.status("starting Spark"):
            spark = stack.enter_context(session_scope(
                master or settings.spark_master, app_name, settings.spark_driver_memory, jar,
                shuffle_partitions, extra=_SPARK_QUIET, python=settings.spark_python))
        yield spark


def progress_bar(console: Console) -> Progress:
    """A transient spinner with the stage's name and the time elapsed."""
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    console=console, transient=True)
