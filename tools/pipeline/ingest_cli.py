"""`eo pipeline ingest`: a file of rows into a gateway's inbox, one command per row
(tools/pipeline/ingest.py). Exit codes: 0 done; 2 bad input or settings (the message names
the option or the EO_ variable); 3 the database or Spark failed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import unquote, urlsplit

import typer
from rich.console import Console

from application.registry import Role
from tools.pipeline.command import (
    JarOption,
    MasterOption,
    ProfileOption,
    driver_jar,
    fail,
    pipeline_service,
    pipeline_settings,
    spark_session,
)


def ingest_command(
    file: Annotated[Path, typer.Option(
        help="the rows: Parquet, CSV (a header row) or JSON lines; a file or a directory of "
             "parts")],
    endpoint: Annotated[str, typer.Option(help="the gateway whose inbox takes the commands")],
    type_name: Annotated[str, typer.Option(
        "--type", help="the message type of every row (one of the gateway's)")],
    id_columns: Annotated[str, typer.Option(
        help="comma-separated columns whose values name a row's message: its ID is "
             "uuid5(the producer's namespace, '<type>/<value>/...'), the same on every run")],
    producer: Annotated[str | None, typer.Option(
        help="the namespace of the IDs (default: the database user, who is the inbox "
             "rows' producer)")] = None,
    field: Annotated[list[str] | None, typer.Option(
        help="FIELD=COLUMN: take a message field from a column of another name "
             "(repeatable)")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", help="parquet, csv or json (default: by the file's suffix)")] = None,
    master: MasterOption = None,
    jdbc_jar: JarOption = None,
    profile: ProfileOption = None,
) -> None:
    """Add a command per row of a file to a gateway's inbox (EO_DATABASE_DSN), with IDs
    derived from the columns you name: re-running adds nothing. The message's fields come
    from the columns of the same names; the gateway relays the commands."""
    import asyncpg
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from tools.pipeline.ingest import InboxUnavailable, check_inbox, ingest_file
    from tools.pipeline.sources import InputError
    from tools.pipeline.spark import spark_failure

    settings = pipeline_settings(profile)
    registry = pipeline_service(settings).registry
    if endpoint not in registry or registry[endpoint].role is not Role.GATEWAY:
        gateways = ", ".join(registry.names(Role.GATEWAY)) or "none"
        raise fail(f"--endpoint {endpoint}: not a gateway of {registry.service} (its gateways:"
                   f" {gateways}); outside producers' messages enter through a gateway", 2)
    renames: dict[str, str] = {}
    for item in field or []:
        name, sep, column = item.partition("=")
        if not sep or not name or not column:
            raise fail(f"--field {item}: expected FIELD=COLUMN", 2)
        renames[name] = column
    columns = [c.strip() for c in id_columns.split(",") if c.strip()]
    jar = driver_jar(settings, jdbc_jar)
    try:
        check_inbox(settings.database())
    except InboxUnavailable as exc:
        raise fail(str(exc), 3) from exc
    who = producer or unquote(urlsplit(settings.database()).username or "") or "postgres"
    console = Console()
    with spark_session(settings, master, jar, "eo-pipeline-ingest", console) as spark:
        try:
            report = ingest_file(spark, file, registry[endpoint], type_name, columns, who,
                                 settings.database(), fmt, renames, console)
        except InputError as exc:
            raise fail(str(exc), 2) from exc
        except (OSError, asyncpg.PostgresError) as exc:
            raise fail(f"ingest failed: {type(exc).__name__}: {exc} (run `eo migrate`?)",
                       3) from exc
        except (Py4JJavaError, PySparkException) as exc:
            raise fail(f"ingest failed in Spark: {spark_failure(exc)}", 3) from exc
    console.print(f"rows: {report.staged:,}; new in {endpoint}'s inbox: {report.new:,}; "
                  f"already there: {report.already_present:,} ({report.seconds:.1f} s)")
