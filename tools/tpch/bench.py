"""`eo pipeline bench`: the audit's Spark stages at scale, with rows/s per stage.

1. TPC-H at scale factor `sf` (sf=0.1: 150,000 orders, about 600,000 line items) is written
   by DuckDB; the order states a clean run would leave are built from it inside Spark (the
   JSON the service stores: every line with its fields, total, invoice key). With a database
   they are written to `eo_transaction_record` and read back through JDBC (partitioned reads,
   projected by PostgreSQL as the audit reads them); without one Spark projects them. Then
   the audit's state-versus-oracle comparison runs on them (`order_findings`: the oracle's
   totals and kept lines from the line items, compared order by order and line by line),
   `repeat` times. Its rate is counted in input line items per second.
2. `records` blob side-effect records and a listing of `keys` objects (1% of them orphans)
   are generated inside Spark (spark.range); the audit's orphan search (anti join) runs on
   them. Its rate is counted in records + keys per second.
3. With `audit` (and a database), the whole audit (`run_audit`, as `eo pipeline audit` runs
   it) on the states written there, the TPC-H input and an S3 Inventory report of the states'
   invoice keys (Parquet, in `workdir`): one stage for all of it, then each of its own
   stages. No ledger or payments states exist, so every order's outcome and every customer
   are findings (written like any other); the order, orphan and missing-object findings must
   be 0.

Every stage ends with a full evaluation (a count or a write), so the time covers all the
work, not a lazy plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.pipeline.named_keys import orphan_objects
from tools.pipeline.sources import Jdbc, read_query
from tools.pipeline.stages import Stage
from tools.tpch.audit_findings import EXACT, order_findings
from tools.tpch.audit_input import read_input
from tools.tpch.audit_states import orders_query, typed_orders
from tools.tpch.data import export_tables

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ORPHAN_SHARE = 0.01
_STATE_COLUMNS = ("order_key bigint, customer_key bigint, status string, total string, "
                  "invoice_key string, lines array<struct<line_number: bigint>>")
_OLD = datetime(2020, 1, 1, tzinfo=UTC)


@dataclass
class BenchResult:
    """Timed stages, the line items compared and the orphans found (a sanity check: the
    clean states must give 0 order findings, the listing exactly its orphan share)."""

    stages: list[Stage] = field(default_factory=list)
    line_items: int = 0
    order_findings: int = 0
    orphans: int = 0
    expected_orphans: int = 0
    #: the whole audit's findings per kind (with `audit`), else empty
    audit_counts: dict[str, int] = field(default_factory=dict)

    def stage(self, name: str) -> Stage:
        """The stage called `name`; raises KeyError."""
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


def clean_order_states(spark: SparkSession, lineitem_path: Path, orders_path: Path
                       ) -> DataFrame:
    """(partition_key, state JSON) of every order as the orders endpoint leaves it once
    confirmed: the fields of domain.sample.orders.Order encoded as application.codec does
    (Decimal as string, lines sorted by number, removed line numbers, total, invoice key)."""
    from pyspark.sql import functions as F

    items = spark.read.parquet(str(lineitem_path))
    kept = items.l_returnflag != "R"
    line = F.struct(
        F.col("l_linenumber").alias("line_number"), F.col("l_partkey").alias("part_key"),
        F.col("l_quantity").cast("string").alias("quantity"),
        F.col("l_extendedprice").cast("string").alias("extended_price"),
        F.col("l_discount").cast("string").alias("discount"),
        F.col("l_tax").cast("string").alias("tax"))
    price = F.col("l_extendedprice")
    net = price - price * F.col("l_discount")
    amount = (net + net * F.col("l_tax")).cast(EXACT)
    per_order = items.groupBy("l_orderkey").agg(
        F.sort_array(F.collect_list(F.when(kept, line))).alias("lines"),
        F.sort_array(F.collect_list(F.when(~kept, F.col("l_linenumber")))).alias("removed"),
        F.count("*").alias("line_count"),
        F.bround(F.coalesce(F.sum(F.when(kept, amount)), F.lit(0).cast(EXACT)), 2)
        .cast("decimal(38,2)").cast("string").alias("total"))
    headers = spark.read.parquet(str(orders_path))
    joined = per_order.join(headers, headers.o_orderkey == per_order.l_orderkey)
    state = F.struct(
        F.col("o_orderkey").alias("order_key"), F.col("o_custkey").alias("customer_key"),
        F.col("o_orderdate").cast("string").alias("order_date"),
        F.col("o_orderpriority").alias("priority"), F.lit(True).alias("placed"),
        F.col("line_count"), F.lit(True).alias("submitted"),
        F.size("removed").alias("removal_count"), F.col("lines"), F.col("removed"),
        F.lit("confirmed").alias("status"), F.col("total"),
        F.concat(F.lit("invoices/"), F.expr("uuid()")).alias("invoice_key"))
    return joined.select(F.col("o_orderkey").cast("string").alias("partition_key"),
                         F.to_json(state).alias("state"))


def artifact_keys(spark: SparkSession, n: int, offset: int = 0) -> DataFrame:
    """`n` distinct keys `invoices/<16 hex digits>` (a hash of id + `offset`), column key."""
    from pyspark.sql import functions as F

    return spark.range(offset, offset + n).select(
        F.concat(F.lit("invoices/"), F.lpad(F.lower(F.hex(F.xxhash64("id"))), 16, "0"),
                 F.lit("-"), F.col("id").cast("string")).alias("key"))


def _timed(result: BenchResult, name: str, rows: int, action: Callable[[], object],
           progress: Callable[[str], None]) -> None:
    progress(name)
    started = time.perf_counter()
    action()
    result.stages.append(Stage(name, time.perf_counter() - started, rows))


def run_bench(
    spark: SparkSession,
    workdir: Path,
    sf: float = 0.1,
    records: int = 10_000_000,
    keys: int = 10_000_000,
    database: Jdbc | None = None,
    partitions: int = 4,
    repeat: int = 3,
    progress: Callable[[str], None] = lambda _stage: None,
    audit: bool = False,
) -> BenchResult:
    """Run both benchmarks (module docstring) under `workdir` (TPC-H files, states).

    `database`: write the states to its `eo_transaction_record` (endpoint `orders`,
    rows replaced) and read them back through JDBC with `partitions` parallel reads; None
    keeps them in Spark. The comparison runs `repeat` times (the first one includes the JVM's
    warm-up); a last stage gives the median. `progress` is called with each stage's name as
    it starts. `audit` (with a `database`): the whole audit too (module docstring, 3).
    Raises ValueError for `audit` without a database.
    """
    if audit and database is None:
        raise ValueError("the whole audit reads the states through JDBC: give a database")
    from pyspark.sql import functions as F

    result = BenchResult()
    tpch = workdir / "tpch"
    started = time.perf_counter()
    progress(f"TPC-H sf={sf} (DuckDB)")
    paths = export_tables(sf, tpch)
    result.stages.append(Stage(f"generate TPC-H sf={sf} (DuckDB)",
                               time.perf_counter() - started))
    tables = read_input(spark, tpch)
    result.line_items = tables.lineitem.count()
    states_path = workdir / "order_states"
    built = clean_order_states(spark, paths["lineitem"], paths["orders"])
    orders = tables.orders.count()
    _timed(result, "build clean order states (JSON)", orders,
           lambda: built.write.mode("overwrite").parquet(str(states_path)), progress)
    states = spark.read.parquet(str(states_path))
    if database is not None:
        _write_states(database, states, result, progress)
        raw = read_query(spark, database, orders_query(), "partition_key", partitions)
        label = "read order states (JDBC, projected by PostgreSQL)"
    else:  # the rows the JDBC read would give, projected from the JSON by Spark
        raw = states.select("partition_key",
                            F.from_json("state", _STATE_COLUMNS).alias("s")).select(
            "partition_key", "s.order_key", "s.customer_key", "s.status", "s.total",
            "s.invoice_key", F.transform("s.lines", lambda x: x["line_number"])
            .alias("line_numbers"))
        label = "load order states"
    typed = typed_orders(raw).cache()
    _timed(result, label, orders, typed.count, progress)
    findings = order_findings(typed, tables.lineitem)
    counted: list[int] = []
    runs: list[Stage] = []
    for run in range(1, repeat + 1):
        name = f"compare order states with the oracle (run {run} of {repeat})"
        _timed(result, name, result.line_items, lambda: counted.append(findings.count()),
               progress)
        runs.append(result.stages[-1])
    median = sorted(runs, key=lambda s: s.seconds)[len(runs) // 2]
    result.stages.append(Stage("compare order states with the oracle (median)",
                               median.seconds, result.line_items))
    result.order_findings = max(counted)
    typed.unpersist()
    orphans_expected = int(keys * ORPHAN_SHARE)
    named = artifact_keys(spark, records)
    listing = (artifact_keys(spark, keys - orphans_expected)
               .unionByName(artifact_keys(spark, orphans_expected, offset=records))
               .select("key", F.lit(8).cast("bigint").alias("size"),
                       F.lit(_OLD).alias("last_modified")))
    found = orphan_objects(listing, named, datetime.now(UTC))
    _timed(result, f"find orphans: {records:,} records vs {keys:,} keys", records + keys,
           lambda: counted.append(found.count()), progress)
    result.orphans, result.expected_orphans = counted[-1], orphans_expected
    if audit and database is not None:
        _whole_audit(spark, workdir, tpch, states, database, partitions, result, progress)
    return result


def _whole_audit(spark: SparkSession, workdir: Path, tpch: Path, states: DataFrame,
                 database: Jdbc, partitions: int, result: BenchResult,
                 progress: Callable[[str], None]) -> None:
    """`run_audit` on the states in `database`, `tpch` and an inventory of their invoice
    keys: one stage for the whole, then its own stages prefixed with "audit: "."""
    from pyspark.sql import functions as F

    from tools.pipeline.audit import run_audit
    from tools.pipeline.audit_config import AuditConfig
    from tools.pipeline.listing import read_inventory
    from tools.tpch.audit import TpchAudit

    inventory = workdir / "inventory"
    states.select(F.get_json_object("state", "$.invoice_key").alias("key"),
                  F.lit(1200).cast("bigint").alias("size"),
                  F.lit(_OLD).alias("last_modified_date")).write.mode("overwrite").parquet(
        str(inventory))
    config = AuditConfig(database=database, tokens=database, now=datetime.now(UTC),
                         older_than_s=0.0, states={"orders": ("invoice_key",)},
                         prefixes=("invoices",), partitions=partitions)
    done: list[Any] = []

    def whole() -> None:
        done.append(run_audit(spark, config, read_inventory(spark, inventory),
                              workdir / "audit", progress=progress, domain=TpchAudit(tpch)))

    _timed(result, "audit end to end (eo pipeline audit's run_audit)", states.count(), whole,
           progress)
    audited = done[0]
    result.stages += [Stage(f"audit: {s.name}", s.seconds, s.rows) for s in audited.stages]
    result.audit_counts = dict(audited.counts)


def _write_states(database: Jdbc, states: DataFrame, result: BenchResult,
                  progress: Callable[[str], None]) -> None:
    from pyspark.sql import functions as F

    rows = states.select(F.lit("orders").alias("endpoint"), "partition_key",
                         F.lit(1).cast("bigint").alias("version"), "state")
    props = {**database.properties, "stringtype": "unspecified", "batchsize": "5000"}

    def write() -> None:
        import asyncio

        asyncio.run(_clear_orders(database))
        rows.write.jdbc(database.url, "eo_transaction_record", "append", props)

    _timed(result, "write order states (JDBC)", rows.count(), write, progress)


async def _clear_orders(database: Jdbc) -> None:
    import asyncpg

    conn = await asyncpg.connect(database_dsn(database))
    try:
        await conn.execute("DELETE FROM eo_transaction_record WHERE endpoint = 'orders'")
    finally:
        await conn.close()


def database_dsn(database: Jdbc) -> str:
    """The libpq DSN of a Jdbc (inverse of sources.jdbc_of for host, port, db, user)."""
    from urllib.parse import quote

    rest = database.url.removeprefix("jdbc:postgresql://")
    user = database.properties.get("user")
    password = database.properties.get("password")
    auth = ""
    if user:
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
    return f"postgresql://{auth}{rest}"
