"""The sample's own audit findings (a `DomainAudit` of tools/pipeline/domain_audit.py): the TPC-H
oracle of docs/sample-domain.md, computed by Spark from the input dataset, against what the
endpoints committed.

- `orders`: an order whose state differs from the oracle (`missing order`, `unexpected
  order`, `unreadable state`, `missing line`, `doubled line`, `unexpected line`, `wrong
  total`, `not settled`, `no invoice`);
- `outcomes`: an order the ledger recorded other than exactly once, or with another outcome
  than the order's status;
- `customers`: payments debits, confirmed totals and ledger revenue that disagree, or an
  account over its credit limit.

States are read through JDBC projected by PostgreSQL (jsonb is parsed there already, so Spark
receives typed columns and only the fields it compares); the input dataset is the TPC-H
tables `eo pipeline export-tpch` writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.pipeline.domain_audit import AuditRun, Finding
from tools.pipeline.named_keys import states_source
from tools.pipeline.sources import InputError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: Exact line amounts have at most 6 decimals (three factors of 2 each); totals are cents.
EXACT = "decimal(38,6)"
AMOUNT = "decimal(38,10)"
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


class TpchAudit:
    """The sample's `DomainAudit`: the input dataset under `input_dir` (read_input) against
    the orders', ledger's and payments' states. Raises InputError for a bad dataset."""

    names: tuple[str, ...] = ("orders", "outcomes", "customers")

    def __init__(self, input_dir: Path | None) -> None:
        """Raises InputError (naming `--input`) when the tables are not there: before Spark
        starts."""
        if input_dir is None:
            raise InputError("--input: the TPC-H tables the oracle is computed from (`eo "
                             "pipeline export-tpch --output DIR` writes them)")
        input_paths(input_dir)
        self.input_dir = input_dir
        self._cached: list[DataFrame] = []

    def findings(self, run: AuditRun) -> dict[str, Finding]:
        tables = read_input(run.spark, self.input_dir)
        orders = typed_orders(run.query(orders_query("orders" in run.config.streams))).cache()
        expected = expected_totals(tables.lineitem).cache()
        ledgers = typed_ledgers(run.query(ledgers_query("ledger" in run.config.streams))).cache()
        accounts = run.query(accounts_query())
        self._cached = [orders, expected, ledgers]
        timer = run.timer
        lines = timer.run("read the input's line items", tables.lineitem.count)
        timer.run("read order states (JDBC)", orders.count)
        timer.run("oracle from the input", expected.count, lambda _n: lines)
        timer.run("read ledger states (JDBC)", ledgers.count)
        return {
            "orders": Finding(order_findings(orders, tables.lineitem),
                              "compare order states with the oracle", lambda _n: lines,
                              "order states that differ from the oracle (line missing, "
                              "doubled or unexpected, wrong total, not settled)"),
            "outcomes": Finding(outcome_findings(orders, expected, ledgers),
                                "count confirmations and rejections",
                                meaning="orders the ledger recorded other than exactly once, "
                                        "or against the order's status"),
            "customers": Finding(customer_findings(tables, orders, ledgers, accounts),
                                 "reconcile payments, confirmations and ledger",
                                 meaning="customers whose payments debits, confirmed totals "
                                         "and ledger revenue disagree, or over the credit "
                                         "limit"),
        }

    def finished(self) -> None:
        """Release what `findings` cached."""
        for frame in self._cached:
            frame.unpersist()
        self._cached = []
