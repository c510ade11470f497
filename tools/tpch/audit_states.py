"""What the sample's endpoints committed, as its audit (tools/tpch/audit.py) reads it: the
orders', ledger's and payments' states projected by PostgreSQL (jsonb is parsed there, so
Spark receives typed columns and only the fields it compares), then typed by Spark."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.pipeline.named_keys import states_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The type the audit compares amounts in (states' totals and revenue, the oracle's totals).
AMOUNT = "decimal(38,10)"


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


def typed_ledgers(raw: DataFrame) -> DataFrame:
    """Rows of `ledgers_query` -> customer_key, revenue (decimal(38,10)), confirmed,
    rejected (bigint arrays, empty when absent)."""
    from pyspark.sql import functions as F

    empty = F.array().cast("array<bigint>")
    return raw.select("customer_key", F.col("revenue").try_cast(AMOUNT).alias("revenue"),
                      F.coalesce("confirmed", empty).alias("confirmed"),
                      F.coalesce("rejected", empty).alias("rejected"))
