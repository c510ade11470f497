"""The sample's `eo chaos` workload (tools/chaos/workload.py): a few random TPC-H orders per
run, their boundary commands as an outside producer sends them to the gateway, the payments
accounts opened before them, and the sample's oracle as the domain check.

`eo chaos` without `--messages` or `--workload` runs the engine (tools/chaos/engine.py) on it
when the sample is there: the same processes, faults and protocol checks as for any service,
plus the oracle (tools/tpch/oracle.py) on the run's orders: each order equal to the oracle,
confirmed or rejected once, payments debits = confirmed totals = ledger revenue per
customer, one invoice per order, each confirmed order's shipment booked once by the carrier.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from decimal import Decimal

from application.codec import encode
from application.registry import Registry
from domain.sample.payments import Account, open_account
from tools.chaos.workload import OutsideMessage, RunOutcome
from tools.tpch.data import TpchSample, generate
from tools.tpch.oracle import check_oracle, require_sample

#: Payments accounts open with TPC-H c_acctbal plus this: low enough that about one order in
#: five of a run is refused.
CAMPAIGN_CREDIT_LIMIT = Decimal("120000")
#: The sample's gateway: the queue the outside producer publishes its commands to.
GATEWAY = "gateway"


@dataclass(frozen=True)
class TpchWorkload:
    """`size` orders of `sample` per run (drawn from the campaign's seed), every command of
    each: PlaceOrder, its AddItems and RemoveItems, SubmitOrder; shuffled by the campaign
    (the domain takes them in any order)."""

    sample: TpchSample
    credit_limit: Decimal = CAMPAIGN_CREDIT_LIMIT
    shuffle: bool = True

    def orders(self, rng: random.Random, size: int) -> list[int]:
        """The order keys of a run: `size` of the sample's, drawn from `rng`, sorted."""
        return sorted(rng.sample(sorted(self.sample.expected), min(size, len(
            self.sample.expected))))

    def draw(self, rng: random.Random, size: int) -> list[OutsideMessage]:
        """The commands of `orders(rng, size)`, in the sample's order."""
        run = self.sample.subset(self.orders(rng, size))
        return [OutsideMessage(GATEWAY, str(c.message_id), type(c.message).__name__,
                               encode(c.message)) for c in run.commands]

    def seed_states(self, messages: list[OutsideMessage]) -> dict[str, dict[str, Account]]:
        """Every customer's payments account (TPC-H c_acctbal plus the credit limit)."""
        return {"payments": {str(c): open_account(c, b, self.credit_limit)
                             for c, b in self.sample.customers}}

    def check(self, outcome: RunOutcome) -> list[str]:
        """The sample's oracle on the run's orders (their states, the ledger's, the
        accounts', the bucket, the carrier's executions)."""
        keys = {json.loads(m.body)["order_key"] for m in outcome.messages}
        states = outcome.states
        oracle = check_oracle(self.sample.subset(keys), dict(states.get("orders", {})),
                              dict(states.get("ledger", {})), dict(states.get("payments", {})),
                              list(outcome.blobs), self.credit_limit,
                              outcome.api_executions.get("carrier"))
        return list(oracle.violations)


def default_workload(registry: Registry) -> TpchWorkload:
    """`eo chaos`'s workload when none is given (tools/chaos/cli.py `DEFAULT_WORKLOAD`): the
    TPC-H orders of sf=0.001, generated with DuckDB. Raises `SettingsError` naming
    `EO_SERVICE` when `registry` does not register the sample's endpoints."""
    require_sample(registry)
    return TpchWorkload(generate(0.001))
