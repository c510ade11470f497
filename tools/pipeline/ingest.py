"""`eo pipeline ingest`: Spark writes boundary commands into a gateway's inbox, keyed by
natural message ID, so that a re-run of the job, or a retried Spark task, adds no duplicate.

Any service: `ingest_file` reads Parquet, CSV or JSON lines, takes the message's fields from
the columns of the same names (checked against the gateway's message type before Spark
runs) and derives each message ID from the columns the user names, in a namespace per
producer (`natural_ids`: a uuid5 computed by Spark itself, the same as Python's). The sample's
TPC-H derivation (tools/tpch/ingest.py) writes through the same `write_commands`.

The write goes through a staging table of the run's own: a JDBC bulk write (each task one
transaction; a retried task's rows are only copies), then one `INSERT ... SELECT ... ON
CONFLICT (endpoint, producer, message_id) DO NOTHING` that also drops the staging table.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
from rich.console import Console

from adapters.postgres.inbox import (
    create_staging,
    drop_staging,
    drop_stale_staging,
    merge_staging,
    staging_name,
)
from tools.pipeline.sources import InputError, jdbc_of
from tools.pipeline.spark_progress import SparkProgress

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from application.registry import Registration

#: A staging table older than this was left by a killed driver: the next run drops it.
STALE_STAGING = timedelta(hours=24)
#: The input formats of `ingest_file`, by file suffix.
FILE_FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}


@dataclass(frozen=True)
class IngestReport:
    """One run: commands derived and staged (copies of input rows included), rows new to the
    inbox, the rest already there (from an earlier run or a copy), and the wall time."""

    staged: int
    new: int
    seconds: float

    @property
    def already_present(self) -> int:
        return self.staged - self.new


class InboxUnavailable(RuntimeError):
    """The inbox's database does not answer, or has no `eo_inbox` (run `eo migrate`)."""


async def _inbox_exists(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT to_regclass('eo_inbox')") is not None
    finally:
        await conn.close()


def check_inbox(dsn: str) -> None:
    """Fail fast, before Spark starts: the database `dsn` answers and holds `eo_inbox`.
    Raises InboxUnavailable with the reason (never the DSN)."""
    try:
        exists = asyncio.run(_inbox_exists(dsn))
    except (OSError, asyncpg.PostgresError) as exc:
        raise InboxUnavailable(f"the inbox's database: {type(exc).__name__}: {exc}") from exc
    if not exists:
        raise InboxUnavailable("the inbox's database has no eo_inbox table: run `eo migrate`")


async def _prepare_staging(dsn: str) -> tuple[str, list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        stale = await drop_stale_staging(conn, datetime.now(UTC) - STALE_STAGING)
        name = staging_name()
        await create_staging(conn, name)
        return name, stale
    finally:
        await conn.close()


async def _merge(dsn: str, name: str, endpoint: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        return await merge_staging(conn, name, endpoint)
    finally:
        await conn.close()


async def _drop(dsn: str, name: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await drop_staging(conn, name)
    finally:
        await conn.close()


def write_commands(spark: SparkSession, commands: DataFrame, dsn: str, endpoint: str,
                   progress: SparkProgress, console: Console | None = None) -> tuple[int, int]:
    """Add `commands` (message_id text, type text, body binary) to `endpoint`'s inbox in the
    database `dsn`: a staging table of the run's own written by Spark's JDBC writer, then
    merged (`ON CONFLICT DO NOTHING`). Returns (rows staged, rows new to the inbox). Raises
    OSError or asyncpg errors (the database) and Spark's errors (the JDBC write); the
    staging table is dropped on failure (else the next run drops it once stale)."""
    jdbc = jdbc_of(dsn)
    name, stale = asyncio.run(_prepare_staging(dsn))
    if stale and console is not None:
        console.print(f"dropped staging tables of killed runs: {', '.join(stale)}")
    try:
        progress.phase("deriving commands, writing the staging table")
        commands.write.jdbc(jdbc.url, name, mode="append",
                            properties={**jdbc.properties, "batchsize": "5000"})
        progress.phase("merging into the inbox")
        return asyncio.run(_merge(dsn, name, endpoint))
    except BaseException:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            asyncio.run(_drop(dsn, name))
        raise


def producer_namespace(producer: str) -> uuid.UUID:
    """The namespace of `producer`'s natural message IDs: uuid5(NAMESPACE_URL,
    "urn:eo:producer:<producer>") (RFC 9562 5.5): two producers naming the same columns get
    different IDs."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"urn:eo:producer:{producer}")


def natural_id(namespace: uuid.UUID, type_name: str, values: Sequence[object]) -> uuid.UUID:
    """What `natural_ids` computes, in Python: uuid5(namespace, "<type>/<v1>/<v2>...") with
    each value as Spark casts it to a string."""
    return uuid.uuid5(namespace, "/".join([type_name, *(str(v) for v in values)]))


def natural_ids(namespace: uuid.UUID, type_name: str, columns: Sequence[str]) -> Column:
    """A Spark column: `natural_id(namespace, type_name, <the row's columns>)` as text,
    computed by Spark's own functions (SHA-1 of the namespace's bytes and the name's UTF-8
    bytes, version and variant bits set as RFC 9562 5.5 says): no Python on the executors.
    A NULL in a named column gives a NULL ID (the caller refuses such rows)."""
    from pyspark.sql import functions as F

    name = F.concat_ws("/", F.lit(type_name), *(F.col(c).cast("string") for c in columns))
    nulls = F.greatest(*(F.col(c).isNull() for c in columns)) if len(columns) > 1 else (
        F.col(columns[0]).isNull())
    digest = F.sha1(F.concat(F.unhex(F.lit(namespace.hex)), F.encode(name, "UTF-8")))
    variant = F.lower(F.hex(F.conv(F.substring(digest, 17, 1), 16, 10).cast("int")
                            .bitwiseAND(3).bitwiseOR(8)))
    text = F.concat_ws("-", F.substring(digest, 1, 8), F.substring(digest, 9, 4),
                       F.concat(F.lit("5"), F.substring(digest, 14, 3)),
                       F.concat(variant, F.substring(digest, 18, 3)),
                       F.substring(digest, 21, 12))
    return F.when(~nulls, text)


def message_fields(registration: Registration, type_name: str) -> tuple[list[str], list[str]]:
    """The fields of message type `type_name` at `registration`'s endpoint, and those of them
    that have no default. Raises InputError naming `--type` when the endpoint has no
    such message type."""
    cls = registration.endpoint.messages.get(type_name)
    if cls is None or not dataclasses.is_dataclass(cls):
        known = ", ".join(sorted(registration.endpoint.messages))
        raise InputError(f"--type {type_name}: {registration.name} takes {known}")
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    return [f.name for f in fields], required


def read_file(spark: SparkSession, path: Path, fmt: str | None = None) -> DataFrame:
    """`path` (a file, or a directory of parts) as a DataFrame: Parquet, CSV (header row) or
    JSON lines, by `fmt` or the suffix. Raises InputError naming `--file` or `--format`."""
    if fmt is None:
        fmt = FILE_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise InputError(f"--file {path}: give --format (parquet, csv or json): the name "
                             "does not say")
    elif fmt not in set(FILE_FORMATS.values()):
        raise InputError(f"--format {fmt}: expected parquet, csv or json")
    if not path.exists():
        raise InputError(f"--file {path}: no such file or directory")
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    return reader.format(fmt).load(str(path))


def file_commands(frame: DataFrame, registration: Registration, type_name: str,
                  id_columns: Sequence[str], namespace: uuid.UUID,
                  renames: Mapping[str, str] | None = None) -> DataFrame:
    """The commands of `frame`'s rows for `registration`'s endpoint: message_id (natural,
    from `id_columns`), type, body (the JSON of the message's fields, each from the column
    of its name, or of the column `renames` gives for it). Lazy. Raises InputError naming
    the option to fix: a message field or ID column the input lacks, an unknown type."""
    from pyspark.sql import functions as F

    fields, required = message_fields(registration, type_name)
    renames = dict(renames or {})
    unknown = [f for f in renames if f not in fields]
    if unknown:
        raise InputError(f"--field {', '.join(unknown)}: not a field of {type_name} "
                         f"({', '.join(fields)})")
    source = {f: renames.get(f, f) for f in fields}
    missing = [f"{f} (column {c})" if c != f else f for f, c in source.items()
               if f in required and c not in frame.columns]
    if missing:
        raise InputError(f"--file: no column for {type_name}'s field(s) {', '.join(missing)}"
                         " (rename one with --field FIELD=COLUMN)")
    absent = [c for c in id_columns if c not in frame.columns]
    if absent or not id_columns:
        raise InputError(f"--id-columns: {', '.join(absent) or 'none given'}: the message "
                         f"IDs come from columns of the input ({', '.join(frame.columns)})")
    body = F.to_json(F.struct(*(F.col(c).alias(f) for f, c in source.items()
                                if c in frame.columns)))
    return frame.select(natural_ids(namespace, type_name, id_columns).alias("message_id"),
                        F.lit(type_name).alias("type"), F.encode(body, "UTF-8").alias("body"))


def ingest_file(spark: SparkSession, path: Path, registration: Registration, type_name: str,
                id_columns: Sequence[str], producer: str, dsn: str, fmt: str | None = None,
                renames: Mapping[str, str] | None = None, console: Console | None = None
                ) -> IngestReport:
    """Add a command per row of `path` to the inbox of `registration`'s gateway in the
    database `dsn` (migrated: `eo migrate`), with IDs from `id_columns` in `producer`'s
    namespace. Idempotent: a second run with the same input adds nothing. Raises InputError
    (the message names the option: `--file`, `--format`, `--type`, `--id-columns`,
    `--field`; a row whose ID columns hold a NULL is refused too), OSError or asyncpg errors
    (the database) and Spark's errors."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    with SparkProgress(spark, console) as progress:
        progress.phase("reading the input")
        frame = read_file(spark, path, fmt)
        commands = file_commands(frame, registration, type_name, id_columns,
                                 producer_namespace(producer), renames).cache()
        try:
            nulls = commands.where(F.col("message_id").isNull()).count()
            if nulls:
                raise InputError(f"--id-columns {','.join(id_columns)}: {nulls:,} row(s) of "
                                 f"{path} have no value in one of them (no message ID)")
            staged, new = write_commands(spark, commands, dsn, registration.name, progress,
                                         console)
        finally:
            commands.unpersist()
    return IngestReport(staged, new, time.monotonic() - started)
