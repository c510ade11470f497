"""The sample's oracle (sample-domain.md) checked against the stores at quiescence."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from adapters.memory.apis import SandboxApis
from adapters.routed_apis import RoutedApis
from application.registry import Registry
from domain.sample.ledger import CustomerLedger
from domain.sample.orders import CONFIRMED, REJECTED, Order
from domain.sample.payments import Account
from entrypoints.settings import SettingsError
from tools.tpch.data import TpchSample


@dataclass
class OracleResult:
    """Violations found (empty when the oracle holds) and the outcome counts."""

    violations: list[str] = field(default_factory=list)
    confirmed: int = 0
    rejected: int = 0
    #: the carrier's executions in all (protocol 12), when the caller could read them
    bookings: int | None = None

    def fail(self, message: str) -> None:
        """Record a violation (at most 20 are kept, then a count)."""
        if len(self.violations) < 20:
            self.violations.append(message)
        elif len(self.violations) == 20:
            self.violations.append("... more violations")


def check_oracle(
    sample: TpchSample,
    orders: dict[str, Order],
    ledgers: dict[str, CustomerLedger],
    accounts: dict[str, Account],
    blob_keys: list[str],
    credit_limit: Decimal,
    carrier: Mapping[str, int] | None = None,
) -> OracleResult:
    """Every order equals the oracle, is confirmed or rejected exactly once, payments debits
    = confirmed totals = ledger revenue per customer, exactly one invoice per order and no
    other object; every confirmed order's shipment booked (a 2xx from the carrier and its
    shipment ID), no rejected order's. `carrier`: the carrier's executions per idempotency
    key, when the caller can read them: each key executed once, one key per confirmed
    order. Checks of leftovers (tokens, TRs, requests) are the caller's."""
    r = OracleResult()
    confirmed_total: dict[int, Decimal] = defaultdict(Decimal)
    for order_key, expected in sample.expected.items():
        order = orders.get(str(order_key))
        if order is None:
            r.fail(f"order {order_key} missing")
            continue
        lines = tuple(line.line_number for line in order.lines)
        if lines != expected.lines or order.total != expected.total:
            r.fail(f"order {order_key}: lines {lines} total {order.total}, "
                   f"expected {expected.lines} {expected.total}")
        if order.status == CONFIRMED:
            r.confirmed += 1
            confirmed_total[sample.order_customers[order_key]] += order.total or Decimal(0)
            status = order.shipment_status
            if status is None or not 200 <= status < 300 or order.shipment_id is None:
                r.fail(f"order {order_key} confirmed, its shipment not booked (carrier "
                       f"status {status}, shipment {order.shipment_id})")
        elif order.status == REJECTED:
            r.rejected += 1
            if order.shipment_status is not None:
                r.fail(f"order {order_key} rejected, yet a shipment was booked")
        else:
            r.fail(f"order {order_key} is {order.status}, neither confirmed nor rejected")
    outcomes = Counter[int]()
    for ledger in ledgers.values():
        outcomes.update(ledger.confirmed)
        outcomes.update(ledger.rejected)
    for order_key in sample.expected:
        if outcomes[order_key] != 1:
            r.fail(f"order {order_key} recorded {outcomes[order_key]} times by the ledger")
    opening = dict(sample.customers)
    for customer, balance in opening.items():
        account = accounts.get(str(customer))
        debits = balance - account.balance if account else Decimal(0)
        book = ledgers.get(str(customer))
        revenue = book.revenue if book else Decimal(0)
        if not debits == confirmed_total[customer] == revenue:
            r.fail(f"customer {customer}: debits {debits}, confirmed {confirmed_total[customer]}"
                   f", ledger revenue {revenue}")
        if account and account.balance + credit_limit < 0:
            r.fail(f"customer {customer} over the credit limit")
    invoices = {o.invoice_key for o in orders.values() if o.invoice_key}
    if len(invoices) != len(sample.expected) or set(blob_keys) != invoices:
        r.fail(f"{len(blob_keys)} objects for {len(invoices)} invoices of "
               f"{len(sample.expected)} orders; unexpected: "
               f"{sorted(set(blob_keys) - invoices)[:3]}, missing: "
               f"{sorted(invoices - set(blob_keys))[:3]}")
    if carrier is not None:
        r.bookings = sum(carrier.values())
        twice = {key: n for key, n in carrier.items() if n != 1}
        if twice:
            r.fail(f"the carrier executed {len(twice)} bookings more than once: "
                   f"{sorted(twice.items())[:3]}")
        if len(carrier) != r.confirmed:
            r.fail(f"the carrier executed {len(carrier)} bookings for {r.confirmed} confirmed "
                   "orders")
    return r


def sandbox_executions(apis: object, api: str = "carrier") -> dict[str, int] | None:
    """The executions per idempotency key of `api`'s in-process sandbox in `apis` (a
    `Workers.apis`), or None when `api` is not served by one."""
    route = apis.routes.get(api) if isinstance(apis, RoutedApis) else None
    return dict(route.provider.executions) if isinstance(route, SandboxApis) else None


#: The sample's endpoints: what the demo, the campaign and the pipeline drive.
SAMPLE_ENDPOINTS = ("gateway", "orders", "ledger", "payments")


def require_sample(registry: Registry) -> None:
    """Raise `SettingsError` naming `EO_SERVICE` when `registry` does not register the
    sample's endpoints (the tools run the sample)."""
    missing = [name for name in SAMPLE_ENDPOINTS if name not in registry]
    if missing:
        raise SettingsError(f"invalid setting EO_SERVICE: the tools drive the sample, but "
                            f"the service {registry.service!r} does not register {missing} "
                            "(service/registry.py)")
