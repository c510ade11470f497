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
receives typed columns and only the fields it compares: tools/tpch/audit_states.py); the input
dataset is the TPC-H tables `eo pipeline export-tpch` writes (tools/tpch/audit_input.py); the
findings are computed in tools/tpch/audit_findings.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.pipeline.domain_audit import AuditRun, Finding
from tools.pipeline.sources import InputError
from tools.tpch.audit_findings import (
    customer_findings,
    expected_totals,
    order_findings,
    outcome_findings,
)
from tools.tpch.audit_input import input_paths, read_input
from tools.tpch.audit_states import (
    accounts_query,
    ledgers_query,
    orders_query,
    typed_ledgers,
    typed_orders,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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
