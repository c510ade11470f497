"""The ledger endpoint: per-customer revenue and the confirmed and rejected order keys."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal

from domain.context import Context
from domain.decisions import Decision, Endpoint
from domain.errors import Rejected
from domain.sample.messages import OrderConfirmed, OrderRejected

LedgerMessage = OrderConfirmed | OrderRejected


@dataclass(frozen=True)
class CustomerLedger:
    """State of one customer (partition = str(customer_key)).

    `revenue` is the Decimal sum of confirmed totals; `confirmed` and `rejected` are the sorted
    order keys, one entry per event handled (never deduplicated: a doubled event stays visible).
    """

    customer_key: int
    revenue: Decimal = Decimal("0.00")
    confirmed: tuple[int, ...] = ()
    rejected: tuple[int, ...] = ()


def handle(
    state: CustomerLedger | None, message: object, context: Context
) -> Decision[CustomerLedger]:
    """Record an OrderConfirmed (revenue += total) or an OrderRejected. Deterministic.

    Opens the customer's ledger on its first event; raises Rejected for any other message or
    an event of another customer than the partition's.
    """
    if not isinstance(message, OrderConfirmed | OrderRejected):
        raise Rejected(f"ledger does not handle {type(message).__name__}")
    ledger = state if state is not None else CustomerLedger(customer_key=message.customer_key)
    if ledger.customer_key != message.customer_key:
        raise Rejected(f"ledger {ledger.customer_key}: event for customer {message.customer_key}")
    if isinstance(message, OrderConfirmed):
        confirmed = tuple(sorted((*ledger.confirmed, message.order_key)))
        revenue = ledger.revenue + message.total
        return Decision(state=replace(ledger, revenue=revenue, confirmed=confirmed))
    rejected = tuple(sorted((*ledger.rejected, message.order_key)))
    return Decision(state=replace(ledger, rejected=rejected))


def ledger_partition(message: LedgerMessage) -> str:
    """The partition key of a ledger event: str(customer_key)."""
    return str(message.customer_key)


LEDGER: Endpoint[CustomerLedger] = Endpoint(
    name="ledger",
    messages={"OrderConfirmed": OrderConfirmed, "OrderRejected": OrderRejected},
    partition_of=ledger_partition,
    handle=handle,
    state_type=CustomerLedger,
    outputs=(),
)
