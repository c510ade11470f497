"""The input of the sample's audit (tools/tpch/audit.py): the TPC-H tables `eo pipeline
export-tpch` writes (`orders`, `lineitem`, `customer`), found without Spark (bad input fails
fast) and read by Spark, typed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tools.pipeline.sources import InputError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: TPC-H money columns are DECIMAL(15,2); CSV input is cast to this exactly.
MONEY = "decimal(15,2)"
INPUT_TABLES = ("orders", "lineitem", "customer")


def _table_path(directory: Path, table: str) -> tuple[Path, str]:
    for fmt in ("parquet", "csv"):
        path = directory / f"{table}.{fmt}"
        if path.exists():
            return path, fmt
    raise InputError(f"--input {directory}: no {table}.parquet or {table}.csv (write them with "
                     "`eo pipeline export-tpch --output DIR`)")


def input_paths(directory: Path) -> dict[str, Path]:
    """table -> file of the input dataset under `directory` (no Spark needed: bad input fails
    fast). Raises InputError naming the directory or the missing table."""
    if not directory.is_dir():
        raise InputError(f"--input {directory}: not a directory")
    return {table: _table_path(directory, table)[0] for table in INPUT_TABLES}


@dataclass(frozen=True)
class InputTables:
    """The input dataset, typed: `orders` (o_orderkey, o_custkey: long), `lineitem`
    (l_orderkey, l_linenumber: long, l_extendedprice, l_discount, l_tax: decimal(15,2),
    l_returnflag: string), `customer` (c_custkey: long, c_acctbal: decimal(15,2))."""

    orders: DataFrame
    lineitem: DataFrame
    customer: DataFrame


_COLUMNS = {
    "orders": {"o_orderkey": "bigint", "o_custkey": "bigint"},
    "lineitem": {"l_orderkey": "bigint", "l_linenumber": "bigint", "l_extendedprice": MONEY,
                 "l_discount": MONEY, "l_tax": MONEY, "l_returnflag": "string"},
    "customer": {"c_custkey": "bigint", "c_acctbal": MONEY},
}


def read_input(spark: SparkSession, directory: Path) -> InputTables:
    """The `orders`, `lineitem` and `customer` tables under `directory`, each as
    `<table>.parquet` or `<table>.csv` (header row; a file or a directory of parts).

    Raises InputError when the directory, a table or one of its columns is missing.
    """
    if not directory.is_dir():
        raise InputError(f"--input {directory}: not a directory")
    frames: dict[str, DataFrame] = {}
    for table, columns in _COLUMNS.items():
        path, fmt = _table_path(directory, table)
        reader = spark.read.option("header", "true") if fmt == "csv" else spark.read
        frame = reader.format(fmt).load(str(path))
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise InputError(f"--input {path}: missing column(s) {', '.join(missing)}")
        frames[table] = frame.selectExpr(*(f"CAST({c} AS {t}) AS {c}"
                                           for c, t in columns.items()))
    return InputTables(frames["orders"], frames["lineitem"], frames["customer"])
