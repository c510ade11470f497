"""The exactly-once audit (`eo pipeline audit`): the independent safety net of protocol 8.

Spark compares what the endpoints committed with the oracle of docs/sample-domain.md computed
from the input dataset, and the bucket with the records that name its objects. Findings, each
a Parquet dataset of offending rows under the output directory:

- `orders`: an order whose state differs from the oracle (`missing order`, `unexpected
  order`, `unreadable state`, `missing line`, `doubled line`, `unexpected line`, `wrong
  total`, `not settled`, `no invoice`);
- `outcomes`: an order the ledger recorded other than exactly once, or with another outcome
  than the order's status;
- `customers`: payments debits, confirmed totals and ledger revenue that disagree, or an
  account over its credit limit;
- `orphans`: objects older than the threshold that no committed record names (an order
  state's invoice key, a blob side-effect record, a deferred clean-up);
- `missing_objects`: invoice keys of committed order states with no object;
- `stale_tokens`, `stale_transactions`: tokens and committed-but-unfinished transaction
  records older than the threshold.

States are read through JDBC projected by PostgreSQL (jsonb is parsed there already, so Spark
receives typed columns and only the fields it compares). The dead-letter queues' depths are
counted by the caller (a broker is no Spark source).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.pipeline.sources import InputTables, Jdbc, read_query

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

FINDINGS = ("orders", "outcomes", "customers", "orphans", "missing_objects", "stale_tokens",
            "stale_transactions")
#: Exact line amounts have at most 6 decimals (three factors of 2 each); totals are cents.
EXACT = "decimal(38,6)"
AMOUNT = "decimal(38,10)"


@dataclass(frozen=True)
class Stage:
    """One timed step: `rows` it went through (0: not counted) in `seconds` (wall clock)."""

    name: str
    seconds: float
    rows: int = 0

    @property
    def rows_per_s(self) -> float:
        """Throughput; 0 when no rows were counted or no time passed."""
        return self.rows / self.seconds if self.rows and self.seconds > 0 else 0.0


@dataclass(frozen=True)
class AuditConfig:
    """What to audit and how.

    - `database` / `tokens`: the endpoints' database and the token store (JDBC);
    - `now`, `older_than_s`: orphans, tokens and unfinished transaction records count only
      when older than `now - older_than_s` (UTC);
    - `ledger_stream`: the ledger keeps its state in `eo_state_entry` (strategy `state`);
    - `partitions`: parallel JDBC reads per table.
    """

    database: Jdbc
    tokens: Jdbc
    now: datetime
    older_than_s: float
    ledger_stream: bool = False
    partitions: int = 4

    @property
    def cutoff(self) -> datetime:
        """`now - older_than_s`, UTC."""
        return self.now.astimezone(UTC) - timedelta(seconds=self.older_than_s)


@dataclass
class AuditResult:
    """Counts per finding (FINDINGS order), dead letters per endpoint (None: no queue),
    timed stages, up to `sample_rows` offending rows per finding, and the files written."""

    counts: dict[str, int]
    dead_letters: dict[str, int | None]
    stages: list[Stage]
    samples: dict[str, list[dict[str, Any]]]
    output: Path
    cutoff: datetime
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        """Offending rows of every finding plus messages in dead-letter queues."""
        return sum(self.counts.values()) + sum(n or 0 for n in self.dead_letters.values())

    def summary(self) -> dict[str, Any]:
        """The JSON summary: counts, dead letters, cutoff, stages (seconds, rows, rows/s)."""
        return {
            "violations": self.violations,
            "counts": self.counts,
            "dead_letters": self.dead_letters,
            "cutoff": self.cutoff.isoformat(),
            "stages": [{"name": s.name, "seconds": round(s.seconds, 3), "rows": s.rows,
                        "rows_per_s": round(s.rows_per_s)} for s in self.stages],
            "files": {k: str(v) for k, v in self.files.items()},
        }


#: The prefixes of the sample's blob keys (`Context.artifact_key("invoices")`): the only
#: objects the audit may call orphans and the sweep may delete.
ARTIFACT_PREFIXES = ("invoices",)


def artifact_key_pattern(prefixes: Sequence[str]) -> str:
    """A regular expression (Java's and Python's) for `domain.context.is_artifact_key`."""
    alternatives = "|".join(re.escape(p) for p in prefixes)
    return (f"^({alternatives})/[0-9a-f]{{8}}-[0-9a-f]{{4}}-5[0-9a-f]{{3}}-[89ab][0-9a-f]{{3}}"
            "-[0-9a-f]{12}$")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def states_source(endpoint: str, stream: bool = False) -> str:
    """SQL for `endpoint`'s business states (partition_key text, state jsonb): from the
    transaction records, or the newest entry of each partition's state stream."""
    if stream:
        return ("SELECT DISTINCT ON (partition_key) partition_key, state FROM eo_state_entry "
                f"WHERE endpoint = {_literal(endpoint)} AND state IS NOT NULL "
                "ORDER BY partition_key, version DESC")
    return ("SELECT partition_key, state FROM eo_transaction_record "
            f"WHERE endpoint = {_literal(endpoint)} AND state IS NOT NULL")


def _number(path: str) -> str:
    return f"CASE WHEN jsonb_typeof({path}) = 'number' THEN ({path})::text::bigint END"


def _numbers(path: str) -> str:
    array = f"CASE WHEN jsonb_typeof({path}) = 'array' THEN {path} ELSE '[]'::jsonb END"
    return f"ARRAY(SELECT e::text::bigint FROM jsonb_array_elements({array}) AS e)"


def orders_query(stream: bool = False) -> str:
    """The orders' states projected by PostgreSQL (jsonb is parsed already: Spark receives
    typed columns, not JSON text): partition_key, order_key, customer_key (bigint, NULL when
    absent or not a number), status, total, invoice_key (text), line_numbers (bigint[], in
    stored order, duplicates kept)."""
    lines = ("CASE WHEN jsonb_typeof(state->'lines') = 'array' THEN state->'lines' "
             "ELSE '[]'::jsonb END")
    return ("SELECT partition_key, " + _number("state->'order_key'") + " AS order_key, "
            + _number("state->'customer_key'") + " AS customer_key, "
            "state->>'status' AS status, state->>'total' AS total, "
            "state->>'invoice_key' AS invoice_key, "
            "ARRAY(SELECT " + _number("l->'line_number'") + f" FROM jsonb_array_elements({lines})"
            f" AS l) AS line_numbers FROM ({states_source('orders', stream)}) AS s")


def ledgers_query(stream: bool = False) -> str:
    """The ledger's states projected by PostgreSQL: partition_key, customer_key, revenue
    (text), confirmed and rejected (bigint[], one entry per event)."""
    return ("SELECT partition_key, " + _number("state->'customer_key'") + " AS customer_key, "
            "state->>'revenue' AS revenue, " + _numbers("state->'confirmed'") + " AS confirmed, "
            + _numbers("state->'rejected'") + " AS rejected "
            f"FROM ({states_source('ledger', stream)}) AS s")


def accounts_query() -> str:
    """Payments' account states projected by PostgreSQL: partition_key, customer_key,
    balance, credit_limit (text)."""
    return ("SELECT partition_key, " + _number("state->'customer_key'") + " AS customer_key, "
            "state->>'balance' AS balance, state->>'credit_limit' AS credit_limit "
            f"FROM ({states_source('payments')}) AS s")


def typed_orders(raw: DataFrame) -> DataFrame:
    """Rows of `orders_query` -> order_key (from the state, else the partition key),
    readable (the state names its order), customer_key, status, total (decimal(38,10); NULL
    before finalising or when not a number), invoice_key, line_numbers."""
    from pyspark.sql import functions as F

    return raw.select(
        F.coalesce(F.col("order_key"), F.col("partition_key").try_cast("bigint"))
        .alias("order_key"),
        F.col("order_key").isNotNull().alias("readable"), "customer_key", "status",
        F.col("total").try_cast(AMOUNT).alias("total"), "invoice_key",
        F.coalesce("line_numbers", F.array().cast("array<bigint>")).alias("line_numbers"))


def _kept() -> Any:
    from pyspark.sql import functions as F

    return F.coalesce(F.col("l_returnflag"), F.lit("")) != "R"


def expected_totals(lineitem: DataFrame) -> DataFrame:
    """Per order with at least one line item: order_key, expected_total = sum over the lines
    whose l_returnflag is not 'R' of extended_price * (1 - discount) * (1 + tax), exact,
    rounded half-even to cents (0 when every line is removed), as decimal(38,10)."""
    from pyspark.sql import functions as F

    price = F.col("l_extendedprice")
    net = price - price * F.col("l_discount")
    amount = (net + net * F.col("l_tax")).cast(EXACT)
    return lineitem.groupBy(F.col("l_orderkey").alias("order_key")).agg(
        F.bround(F.coalesce(F.sum(F.when(_kept(), amount)), F.lit(0).cast(EXACT)), 2)
        .cast(AMOUNT).alias("expected_total"))


def expected_lines(lineitem: DataFrame) -> DataFrame:
    """The lines an order keeps: order_key, line_number of every line item whose
    l_returnflag is not 'R'."""
    from pyspark.sql import functions as F

    return lineitem.where(_kept()).select(F.col("l_orderkey").alias("order_key"),
                                          F.col("l_linenumber").alias("line_number"))


def oracle(lineitem: DataFrame) -> DataFrame:
    """The oracle of docs/sample-domain.md as domain/sample/oracle.py states it, from the
    same expressions the audit compares with: order_key, lines (sorted kept line numbers),
    expected_total (expected_totals)."""
    from pyspark.sql import functions as F

    lines = expected_lines(lineitem).groupBy("order_key").agg(
        F.sort_array(F.collect_list("line_number")).alias("lines"))
    return (expected_totals(lineitem).join(lines, "order_key", "left")
            .select("order_key",
                    F.coalesce("lines", F.array().cast("array<bigint>")).alias("lines"),
                    "expected_total"))


def order_findings(orders: DataFrame, lineitem: DataFrame) -> DataFrame:
    """Order states (typed_orders) against the oracle computed from `lineitem`: one row per
    order and problem, columns order_key, problem, line_numbers (the lines concerned, sorted),
    expected_total, found_total, status.

    Lines are compared as multisets without building per-order arrays: the kept line items
    and the states' exploded line numbers are counted per (order, line) in one aggregation,
    and only the (order, line) pairs whose counts differ go on.
    """
    from pyspark.sql import functions as F

    empty = F.array().cast("array<bigint>")
    counted = (expected_lines(lineitem).select("order_key", "line_number",
                                               F.lit(1).alias("o"), F.lit(0).alias("s"))
               .unionByName(orders.where("readable").select(
                   "order_key", F.explode("line_numbers").alias("line_number"),
                   F.lit(0).alias("o"), F.lit(1).alias("s")))
               .groupBy("order_key", "line_number").agg(F.sum("o").alias("o"),
                                                        F.sum("s").alias("s"))
               .where("o != s"))

    def lines_where(condition: Column) -> Column:
        return F.sort_array(F.collect_list(F.when(condition, F.col("line_number"))))

    # few rows (only the lines whose counts differ): broadcast to the order-level pass
    off = counted.groupBy("order_key").agg(
        lines_where(F.col("s") == 0).alias("missing"),
        lines_where((F.col("o") == 0) & (F.col("s") > 0)).alias("unexpected"),
        lines_where((F.col("o") > 0) & (F.col("s") > F.col("o"))).alias("doubled"))
    joined = (orders.join(expected_totals(lineitem), "order_key", "full_outer")
              .join(F.broadcast(off), "order_key", "left"))
    present = F.col("readable").isNotNull()
    known = F.col("expected_total").isNotNull()
    ok = present & known & F.coalesce(F.col("readable"), F.lit(False))

    def problem(when: Column, name: str, lines: Column | None = None) -> Column:
        return F.when(when, F.struct(F.lit(name).alias("problem"),
                                     (empty if lines is None else lines).alias("line_numbers")))

    def some(lines: str) -> Column:
        return ok & F.coalesce(F.size(lines) > 0, F.lit(False))

    problems = F.array(
        problem(~present, "missing order"),
        problem(present & ~known, "unexpected order"),
        problem(present & known & ~F.col("readable"), "unreadable state"),
        problem(some("missing"), "missing line", F.col("missing")),
        problem(some("doubled"), "doubled line", F.col("doubled")),
        problem(some("unexpected"), "unexpected line", F.col("unexpected")),
        problem(ok & ~F.col("total").eqNullSafe(F.col("expected_total")), "wrong total"),
        problem(ok & ~F.coalesce(F.col("status").isin("confirmed", "rejected"), F.lit(False)),
                "not settled"),
        problem(ok & F.col("status").isin("awaiting_payment", "confirmed", "rejected")
                & F.col("invoice_key").isNull(), "no invoice"),
    )
    return (joined.select("order_key", F.explode(problems).alias("p"), "expected_total",
                          F.col("total").alias("found_total"), "status")
            .where(F.col("p").isNotNull())
            .select("order_key", "p.problem", "p.line_numbers", "expected_total",
                    "found_total", "status"))


def typed_ledgers(raw: DataFrame) -> DataFrame:
    """Rows of `ledgers_query` -> customer_key, revenue (decimal(38,10)), confirmed,
    rejected (bigint arrays, empty when absent)."""
    from pyspark.sql import functions as F

    empty = F.array().cast("array<bigint>")
    return raw.select("customer_key", F.col("revenue").try_cast(AMOUNT).alias("revenue"),
                      F.coalesce("confirmed", empty).alias("confirmed"),
                      F.coalesce("rejected", empty).alias("rejected"))


def outcome_findings(orders: DataFrame, expected: DataFrame, ledgers: DataFrame) -> DataFrame:
    """Per order of the oracle (`expected`: its order_key column, e.g. expected_totals) and
    any other the ledger names: how often the ledger recorded
    it confirmed and rejected. Offending rows (order_key, problem, ledger_confirmed,
    ledger_rejected, status): `not recorded once` when the two counts do not add up to 1,
    `not in the input` for an order the oracle lacks, `ledger disagrees with the order` when
    the one outcome is not the order's status."""
    from pyspark.sql import functions as F

    events = (ledgers.select(F.explode("confirmed").alias("order_key"),
                             F.lit(1).alias("c"), F.lit(0).alias("r"))
              .unionByName(ledgers.select(F.explode("rejected").alias("order_key"),
                                          F.lit(0).alias("c"), F.lit(1).alias("r"))))
    counts = events.groupBy("order_key").agg(F.sum("c").alias("ledger_confirmed"),
                                             F.sum("r").alias("ledger_rejected"))
    universe = expected.select("order_key", F.lit(True).alias("in_input"))
    rows = (universe.join(counts, "order_key", "full_outer")
            .join(orders.select("order_key", "status"), "order_key", "left")
            .select("order_key", F.coalesce("in_input", F.lit(False)).alias("in_input"),
                    F.coalesce("ledger_confirmed", F.lit(0)).alias("ledger_confirmed"),
                    F.coalesce("ledger_rejected", F.lit(0)).alias("ledger_rejected"), "status"))
    total = F.col("ledger_confirmed") + F.col("ledger_rejected")
    problem = (F.when(~F.col("in_input"), "not in the input")
               .when(total != 1, "not recorded once")
               .when((F.col("ledger_confirmed") == 1)
                     != F.coalesce(F.col("status") == "confirmed", F.lit(False)),
                     "ledger disagrees with the order"))
    return (rows.withColumn("problem", problem).where(F.col("problem").isNotNull())
            .select("order_key", "problem", "ledger_confirmed", "ledger_rejected", "status"))


def customer_findings(tables: InputTables, orders: DataFrame, ledgers: DataFrame,
                      accounts: DataFrame) -> DataFrame:
    """Per input customer: debits (opening c_acctbal - account balance, 0 without an account),
    the confirmed orders' totals (by the input's o_custkey) and the ledger revenue must be
    equal, and balance + credit_limit >= 0. Offending rows: customer_key, problem, debits,
    confirmed_total, revenue, balance, credit_limit."""
    from pyspark.sql import functions as F

    zero = F.lit(0).cast(AMOUNT)
    account = accounts.select(F.col("customer_key").alias("c_custkey"),
                              F.col("balance").try_cast(AMOUNT).alias("balance"),
                              F.col("credit_limit").try_cast(AMOUNT).alias("credit_limit"))
    confirmed = (orders.where(F.col("status") == "confirmed")
                 .join(tables.orders, orders["order_key"] == tables.orders["o_orderkey"])
                 .groupBy(F.col("o_custkey").alias("c_custkey"))
                 .agg(F.sum(F.coalesce("total", zero)).cast(AMOUNT).alias("confirmed_total")))
    revenue = ledgers.select(F.col("customer_key").alias("c_custkey"), "revenue")
    rows = (tables.customer.join(account, "c_custkey", "left")
            .join(confirmed, "c_custkey", "left").join(revenue, "c_custkey", "left")
            .select(F.col("c_custkey").alias("customer_key"),
                    F.when(F.col("balance").isNull(), zero)
                    .otherwise((F.col("c_acctbal") - F.col("balance")).cast(AMOUNT))
                    .alias("debits"),
                    F.coalesce("confirmed_total", zero).alias("confirmed_total"),
                    F.coalesce("revenue", zero).alias("revenue"), "balance", "credit_limit"))
    agree = ((F.col("debits") == F.col("confirmed_total"))
             & (F.col("confirmed_total") == F.col("revenue")))
    problem = (F.when(~agree, "debits, confirmations and ledger disagree")
               .when(F.col("balance") + F.col("credit_limit") < 0, "over the credit limit"))
    return (rows.withColumn("problem", problem).where(F.col("problem").isNotNull())
            .select("customer_key", "problem", "debits", "confirmed_total", "revenue",
                    "balance", "credit_limit"))


def orphan_objects(listing: DataFrame, named: DataFrame, cutoff: datetime,
                   prefixes: Sequence[str] | None = None) -> DataFrame:
    """Objects of `listing` (key, size, last_modified) that no key of `named` (key) names and
    last modified before `cutoff`: key, size, last_modified. With `prefixes`, only the
    service's own keys (`domain.context.is_artifact_key` under them) can be orphans: an
    object of anyone else sharing the bucket is none of the audit's business. The anti join
    needs no `distinct` of `named` (a key named twice excludes its object once): one
    aggregation of every named key less, a quarter of the time at 10M keys."""
    from pyspark.sql import functions as F

    old = listing.where(F.col("last_modified") < F.lit(cutoff))
    if prefixes is not None:
        old = old.where(F.col("key").rlike(artifact_key_pattern(prefixes)))
    return old.join(named.select("key"), "key", "left_anti")


def missing_objects(orders: DataFrame, listing: DataFrame) -> DataFrame:
    """Invoice keys of order states with no object in `listing`: key, order_key."""
    from pyspark.sql import functions as F

    invoices = orders.where(F.col("invoice_key").isNotNull()).select(
        F.col("invoice_key").alias("key"), "order_key")
    return invoices.join(listing.select("key"), "key", "left_anti")


class _Clock:
    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.stages: list[Stage] = []

    def run(self, name: str, action: Callable[[], int], rows: Callable[[int], int] | None = None
            ) -> int:
        self.progress(name)
        started = time.perf_counter()
        result = action()
        self.stages.append(Stage(name, time.perf_counter() - started,
                                 rows(result) if rows else result))
        return result


def _parquet_source(path: Path) -> str:
    """`read_parquet('<path>/*.parquet')` with the path as an escaped SQL string literal."""
    return f"read_parquet({_literal((path / '*.parquet').as_posix())})"


def _identifier(name: str) -> str:
    """`name` as a quoted SQL identifier (embedded quotes doubled): a column name read from
    a file must never become SQL (the security review ran `COPY ... TO` through one)."""
    return '"' + name.replace('"', '""') + '"'


def count_rows(path: Path) -> int:
    """Rows of the Parquet dataset Spark wrote to directory `path` (from the files' footers,
    through DuckDB: no Spark job)."""
    import duckdb

    if not any(path.glob("*.parquet")):
        return 0
    with duckdb.connect() as con:
        found = con.execute(f"SELECT count(*) FROM {_parquet_source(path)}").fetchone()
    return int(found[0]) if found else 0


def read_rows(path: Path, limit: int | None = None,
              columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows of the Parquet dataset in directory `path` as dicts (Decimal, list, datetime
    values), at most `limit` of them (None: all), with `columns` only when given (a fixed
    set: a missing one raises duckdb's BinderException). Column names are quoted, never
    trusted as SQL."""
    import duckdb

    if not any(path.glob("*.parquet")):
        return []
    source = _parquet_source(path)
    with duckdb.connect() as con:
        described = con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
        kinds = {str(name): str(kind) for name, kind, *_ in described}
        wanted = list(columns) if columns is not None else list(kinds)
        # instants as naive UTC (DuckDB needs pytz for aware ones), made aware below
        aware = {n for n in wanted if "WITH TIME ZONE" in kinds.get(n, "")}
        selected = ", ".join(
            f"timezone('UTC', {_identifier(n)}) AS {_identifier(n)}" if n in aware
            else _identifier(n) for n in wanted)
        query = f"SELECT {selected} FROM {source}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        cursor = con.execute(query)
        names = [d[0] for d in cursor.description or ()]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for row in rows:
        for name in aware:
            if row[name] is not None:
                row[name] = row[name].replace(tzinfo=UTC)
    return rows


def run_audit(
    spark: SparkSession,
    config: AuditConfig,
    tables: InputTables,
    listing: DataFrame,
    output: Path,
    dead_letters: Mapping[str, int | None] | None = None,
    progress: Callable[[str], None] = lambda _stage: None,
    sample_rows: int = 10,
) -> AuditResult:
    """Run every check and write each finding to `output/<finding>` (Parquet, overwritten).

    `listing` is the bucket's objects (listing.LISTING_SCHEMA); `dead_letters` the depth of
    each endpoint's dead-letter queue, if counted. `progress` is called with each stage's
    name as it starts. Raises pyspark's errors (e.g. an unreachable database) unchanged.
    """
    from pyspark.sql import functions as F

    output.mkdir(parents=True, exist_ok=True)
    # readable by any Parquet reader (the default, INT96, is Spark's legacy encoding)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    clock = _Clock(progress)
    cutoff = config.cutoff
    db, parts = config.database, config.partitions

    def query(sql: str) -> DataFrame:
        return read_query(spark, db, sql, "partition_key", parts)

    orders = typed_orders(query(orders_query())).cache()
    expected = expected_totals(tables.lineitem).cache()
    ledgers = typed_ledgers(query(ledgers_query(config.ledger_stream))).cache()
    accounts = query(accounts_query())
    lines = clock.run("read the input's line items", tables.lineitem.count)
    clock.run("read order states (JDBC)", orders.count)
    clock.run("oracle from the input", expected.count, lambda _n: lines)
    clock.run("read ledger states (JDBC)", ledgers.count)
    blob_records = read_query(
        spark, db, "SELECT key FROM eo_side_effect_record WHERE kind = 'blob' UNION ALL "
                   "SELECT key FROM eo_deferred_cleanup WHERE kind = 'blob'", "key", parts)
    named = orders.where(F.col("invoice_key").isNotNull()).select(
        F.col("invoice_key").alias("key")).unionByName(blob_records)
    listing = listing.cache()
    objects = clock.run("list the bucket", listing.count)
    stamp = _literal(cutoff.isoformat()) + "::timestamptz"
    tokens = read_query(
        spark, config.tokens,
        "SELECT message_id::text AS message_id, type, created_at FROM eo_token "
        f"WHERE created_at < {stamp}", "message_id", parts)
    unfinished = read_query(
        spark, db,
        "SELECT endpoint, partition_key, message_id::text AS message_id, "
        "attempt_id::text AS attempt_id, version, committed_at FROM eo_transaction_record "
        f"WHERE message_id IS NOT NULL AND committed_at < {stamp}", "partition_key", parts)
    findings = {
        "orders": (order_findings(orders, tables.lineitem), "compare order states with the oracle",
                   lambda _n: lines),
        "outcomes": (outcome_findings(orders, expected, ledgers),
                     "count confirmations and rejections", lambda _n: 0),
        "customers": (customer_findings(tables, orders, ledgers, accounts),
                      "reconcile payments, confirmations and ledger", lambda _n: 0),
        "orphans": (orphan_objects(listing, named, cutoff, ARTIFACT_PREFIXES),
                    "find orphan objects",
                    lambda _n: objects),
        "missing_objects": (missing_objects(orders, listing), "find missing invoice objects",
                            lambda _n: 0),
        "stale_tokens": (tokens, "find stale tokens (JDBC)", lambda _n: 0),
        "stale_transactions": (unfinished, "find unfinished transaction records (JDBC)",
                               lambda _n: 0),
    }
    counts: dict[str, int] = {}
    files: dict[str, Path] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for name, (frame, label, rows) in findings.items():
        path = output / name

        def write(frame: DataFrame = frame, path: Path = path) -> int:
            frame.write.mode("overwrite").parquet(str(path))
            return count_rows(path)

        counts[name] = clock.run(label, write, rows)
        files[name] = path
        samples[name] = read_rows(path, sample_rows)
    for frame in (orders, expected, ledgers, listing):
        frame.unpersist()
    return AuditResult(counts, dict(dead_letters or {}), clock.stages, samples, output, cutoff,
                       files)


def write_summary(result: AuditResult) -> Path:
    """`summary.json` in the output directory (AuditResult.summary); returns its path."""
    path = result.output / "summary.json"
    path.write_text(json.dumps(result.summary(), indent=2) + "\n")
    return path
