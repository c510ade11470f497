"""The sample's audit findings (tools/tpch/audit.py), computed by Spark: the oracle of
docs/sample-domain.md from the input's line items, and the orders, outcomes and customers
that disagree with it or with each other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.tpch.audit_states import AMOUNT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from tools.tpch.audit_input import InputTables

#: Exact line amounts have at most 6 decimals (three factors of 2 each); totals are cents.
EXACT = "decimal(38,6)"


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
