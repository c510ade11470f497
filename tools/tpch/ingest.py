"""`eo pipeline ingest-tpch`: Spark derives the sample's boundary commands from TPC-H `orders`
and `lineitem` and writes them into the gateway's inbox (tools/pipeline/ingest.py's
`write_commands`), keyed by natural message ID, so that a re-run of the job, or a retried
Spark task, adds no duplicate.

The derivation is the Spark form of `tools/tpch/data.py` `generate()`: per order a
`PlaceOrder`, per line an `AddItem`, per line with `l_returnflag = 'R'` a `RemoveItem`, per
order a `SubmitOrder`; IDs from `domain/sample/messages.py` `natural_id`, bodies encoded by
`application/codec.py` `encode` inside `mapPartitions`, so both are byte-identical to the
Python producer's. Line and removal counts count distinct line numbers, so an input with
copies of rows (a producer that re-sent a file) still yields the same commands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tools.pipeline.ingest import IngestReport, write_commands
from tools.pipeline.sources import InputError
from tools.pipeline.spark_progress import SparkProgress
from tools.tpch.audit_input import MONEY
from tools.tpch.ingest_commands import line_commands, order_commands

#: The sample's gateway: the ingest writes into its inbox.
GATEWAY = "gateway"

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The tables the ingest reads, with the columns it needs and their Spark types (CSV input,
#: read as text, is cast to these; Parquet from `export-tpch` has them already).
COLUMNS = {
    "orders": {"o_orderkey": "bigint", "o_custkey": "bigint", "o_orderdate": "date",
               "o_orderpriority": "string"},
    "lineitem": {"l_orderkey": "bigint", "l_linenumber": "bigint", "l_partkey": "bigint",
                 "l_quantity": MONEY, "l_extendedprice": MONEY, "l_discount": MONEY,
                 "l_tax": MONEY, "l_returnflag": "string"},
}
FORMATS = ("parquet", "csv")


def table_paths(directory: Path, fmt: str | None = None) -> tuple[dict[str, Path], str]:
    """The `orders` and `lineitem` inputs under `directory` (`<table>.parquet` or
    `<table>.csv`: a file or a directory of parts) and their format; `fmt` None takes the
    format whose files exist. Raises InputError (message starting with the option to fix:
    `--input` or `--format`)."""
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: expected parquet or csv")
    if not directory.is_dir():
        raise InputError(f"--input {directory}: not a directory")
    for candidate in (fmt,) if fmt else FORMATS:
        paths = {table: directory / f"{table}.{candidate}" for table in COLUMNS}
        if all(path.exists() for path in paths.values()):
            return paths, str(candidate)
    wanted = " and ".join(f"{t}.{fmt or 'parquet'}" for t in COLUMNS)
    alternative = "" if fmt else " (or both as .csv)"
    raise InputError(f"--input {directory}: needs {wanted}{alternative}; write them with "
                     "`eo pipeline export-tpch --output DIR`")


def read_tables(spark: SparkSession, paths: dict[str, Path], fmt: str
                ) -> tuple[DataFrame, DataFrame]:
    """`orders` and `lineitem` with the columns of `COLUMNS`, typed. Raises InputError
    naming the file and the missing columns."""
    frames = []
    for table, columns in COLUMNS.items():
        reader = spark.read.option("header", "true") if fmt == "csv" else spark.read
        frame = reader.format(fmt).load(str(paths[table]))
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise InputError(f"--input {paths[table]}: missing column(s) {', '.join(missing)}")
        frames.append(frame.selectExpr(*(f"CAST({c} AS {t}) AS {c}"
                                         for c, t in columns.items())))
    return frames[0], frames[1]


def derive_commands(spark: SparkSession, orders: DataFrame, lineitem: DataFrame) -> DataFrame:
    """The boundary commands of `orders` and `lineitem` (as `read_tables` returns them):
    columns `message_id` (the natural ID as text), `type`, `body` (binary JSON). Lazy."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    counts = lineitem.groupBy(F.col("l_orderkey").alias("o_orderkey")).agg(
        F.countDistinct("l_linenumber").alias("line_count"),
        F.countDistinct(F.when(F.col("l_returnflag") == "R", F.col("l_linenumber")))
        .alias("removal_count"))
    heads = (orders.join(counts, "o_orderkey", "left")
             .fillna(0, subset=["line_count", "removal_count"]))
    rows = heads.rdd.mapPartitions(order_commands).union(
        lineitem.rdd.mapPartitions(line_commands))
    schema = StructType([StructField("message_id", StringType(), False),
                         StructField("type", StringType(), False),
                         StructField("body", BinaryType(), False)])
    return spark.createDataFrame(rows, schema)


def ingest(spark: SparkSession, input_dir: Path, dsn: str, fmt: str | None = None,
           endpoint: str = GATEWAY, console: Console | None = None) -> IngestReport:
    """Derive the commands of the TPC-H tables under `input_dir` and add the new ones to
    `endpoint`'s inbox in the database `dsn` (migrated: `eo migrate`).

    Idempotent: a second run with the same input adds nothing. Shows progress on `console`.
    Raises InputError (bad input: the message names `--input` or `--format`), OSError or
    asyncpg errors (the database), and Spark's errors (the JDBC write).
    """
    started = time.monotonic()
    paths, fmt = table_paths(input_dir, fmt)
    with SparkProgress(spark, console) as progress:
        progress.phase("reading the input")
        orders, lineitem = read_tables(spark, paths, fmt)
        commands = derive_commands(spark, orders, lineitem)
        staged, new = write_commands(spark, commands, dsn, endpoint, progress, console)
    return IngestReport(staged, new, time.monotonic() - started)
