"""Unit tests of the ledger handler: revenue and order keys per customer."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from domain.context import Context
from domain.errors import Rejected
from domain.sample.ledger import LEDGER, CustomerLedger, handle
from domain.sample.messages import OrderConfirmed, OrderRejected, PlaceOrder

CTX = Context(uuid.UUID(int=1), uuid.UUID(int=2), datetime(2024, 1, 1, tzinfo=UTC))


def confirmed(order_key: int, total: str, customer: int = 5) -> OrderConfirmed:
    return OrderConfirmed(order_key, customer, Decimal(total), f"invoices/{order_key}")


def test_first_event_opens_the_customer_ledger() -> None:
    decision = handle(None, confirmed(3, "10.50"), CTX)
    assert decision.state == CustomerLedger(5, Decimal("10.50"), (3,), ())
    assert (decision.outgoing, decision.blobs, decision.http_call, decision.reply) == (
        (),
        (),
        None,
        None,
    )


def test_confirmed_adds_revenue_and_keeps_keys_sorted() -> None:
    state = handle(None, confirmed(9, "1.10"), CTX).state
    state = handle(state, confirmed(2, "2.20"), CTX).state
    assert state.revenue == Decimal("3.30")
    assert state.confirmed == (2, 9)


def test_doubled_event_stays_visible() -> None:
    state = handle(None, confirmed(4, "1.00"), CTX).state
    state = handle(state, confirmed(4, "1.00"), CTX).state
    assert state.confirmed == (4, 4)
    assert state.revenue == Decimal("2.00")


def test_rejected_is_recorded_without_revenue() -> None:
    state = handle(None, OrderRejected(8, 5, Decimal("9.99"), "insufficient funds"), CTX).state
    state = handle(state, OrderRejected(1, 5, Decimal("1.00"), "refused"), CTX).state
    assert state == CustomerLedger(5, Decimal("0.00"), (), (1, 8))


def test_other_messages_and_customers_are_rejected() -> None:
    state = handle(None, confirmed(1, "1.00"), CTX).state
    with pytest.raises(Rejected):
        handle(state, confirmed(2, "1.00", customer=6), CTX)
    with pytest.raises(Rejected):
        handle(state, PlaceOrder(1, 5, datetime(2024, 1, 1).date(), "1-URGENT", 1), CTX)


def test_endpoint_definition() -> None:
    assert LEDGER.name == "ledger"
    assert LEDGER.state_type is CustomerLedger
    assert LEDGER.partition_of(confirmed(1, "1.00", customer=77)) == "77"
    assert LEDGER.type_name(OrderRejected(1, 2, Decimal(0), "x")) == "OrderRejected"
    assert set(LEDGER.messages) == {"OrderConfirmed", "OrderRejected"}
