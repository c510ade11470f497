"""What the audit reads: the endpoints' tables through JDBC (partitioned reads) and the input
dataset (the TPC-H tables `eo pipeline export-tpch` writes) as typed Spark DataFrames."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

from tools.pipeline.spark import JDBC_DRIVER

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: TPC-H money columns are DECIMAL(15,2); CSV input is cast to this exactly.
MONEY = "decimal(15,2)"
INPUT_TABLES = ("orders", "lineitem", "customer")


class InputError(ValueError):
    """The input dataset is missing or malformed; the message names the path or column."""


@dataclass(frozen=True)
class Jdbc:
    """A PostgreSQL database as Spark's JDBC source sees it: `url` (jdbc:postgresql://...)
    and connection `properties` (user, password, driver, fetch size)."""

    url: str
    properties: dict[str, str] = field(default_factory=dict)


def jdbc_of(dsn: str, fetch_size: int = 10_000) -> Jdbc:
    """The JDBC form of a libpq DSN `postgresql://user:password@host:port/db?opt=v`.

    Query options (e.g. sslmode) are passed on as JDBC properties. Raises ValueError for
    another scheme or a DSN without a database name.
    """
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("expected a postgresql:// DSN")
    database = parts.path.lstrip("/")
    if not database:
        raise ValueError("the DSN names no database")
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or 5432
    props = {"driver": JDBC_DRIVER, "fetchsize": str(fetch_size)}
    props.update(dict(parse_qsl(parts.query)))
    if parts.username:
        props["user"] = unquote(parts.username)
    if parts.password:
        props["password"] = unquote(parts.password)
    return Jdbc(f"jdbc:postgresql://{host}:{port}/{database}", props)


def read_query(spark: SparkSession, jdbc: Jdbc, query: str, split_on: str,
               partitions: int = 4) -> DataFrame:
    """The rows of `query` (a SELECT, pushed down to PostgreSQL) read in `partitions` parallel
    JDBC reads, split on `hashtext(split_on)` (a text expression of the query's columns), so
    any key shape spreads evenly. Lazy: nothing is read before an action."""
    buckets = max(1, partitions)
    predicates = [f"mod(hashtext({split_on}) & 2147483647, {buckets}) = {i}"
                  for i in range(buckets)]
    return spark.read.jdbc(jdbc.url, f"({query}) AS q", predicates=predicates,
                           properties=jdbc.properties)


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
