"""What the pipeline reads: the endpoints' tables through JDBC (partitioned reads), and SQL
string literals for the queries it builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

from tools.pipeline.spark import JDBC_DRIVER

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class InputError(ValueError):
    """An input (a dataset, a file) is missing or malformed; the message names the path or
    column, and the option to fix."""


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


def sql_literal(text: str) -> str:
    """`text` as a SQL string literal (PostgreSQL's and DuckDB's): quoted, embedded quotes
    doubled."""
    return "'" + text.replace("'", "''") + "'"
