"""Unit tests of the orders handler: out-of-order assembly, finalisation and payment."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from domain.context import Context, HttpResponse
from domain.decisions import CallApi, Decision, Outgoing
from domain.documents import Document
from domain.errors import Rejected
from domain.sample.messages import (
    AddItem,
    OrderConfirmed,
    OrderRejected,
    PaymentResult,
    PlaceOrder,
    RemoveItem,
    ShipmentBooked,
    SubmitOrder,
)
from domain.sample.orders import MAX_LINES, ORDERS, Order, handle

CTX = Context(uuid.UUID(int=1), uuid.UUID(int=2), datetime(2024, 1, 1, tzinfo=UTC))
K = 7


def place(line_count: int, customer: int = 42) -> PlaceOrder:
    return PlaceOrder(K, customer, date(1996, 1, 2), "5-LOW", line_count)


def add(n: int, price: str = "100.00", discount: str = "0.00", tax: str = "0.00") -> AddItem:
    return AddItem(K, n, 1000 + n, Decimal("1.00"), Decimal(price), Decimal(discount), Decimal(tax))


def run(*messages: object, state: Order | None = None) -> Decision[Order]:
    decision = None
    for message in messages:
        decision = handle(state, message, CTX)
        state = decision.state
    assert decision is not None
    return decision


def finalised(line_count: int = 2) -> Order:
    lines = [add(n) for n in range(1, line_count + 1)]
    return run(place(line_count), *lines, SubmitOrder(K, 0)).state


def paid(status: int, body: dict[str, Any]) -> Context:
    return Context(CTX.message_id, CTX.attempt_id, CTX.now, HttpResponse(status, body))


def test_add_item_for_unknown_order_opens_it() -> None:
    order = run(add(2)).state
    assert order.order_key == K
    assert (order.placed, order.customer_key, order.status) == (False, None, "open")
    assert [line.line_number for line in order.lines] == [2]


def test_place_order_fills_a_lazily_opened_order() -> None:
    order = run(add(1), place(3)).state
    assert (order.placed, order.customer_key, order.line_count) == (True, 42, 3)
    assert order.order_date == date(1996, 1, 2)
    assert len(order.lines) == 1


def test_lines_are_kept_sorted() -> None:
    order = run(add(3), add(1), add(2)).state
    assert [line.line_number for line in order.lines] == [1, 2, 3]


def test_remove_before_add_leaves_a_tombstone() -> None:
    first = run(RemoveItem(K, 2))
    assert first.state.removed == (2,)
    again = handle(first.state, add(2), CTX)
    assert again.state is first.state
    assert again.state.lines == ()


def test_remove_after_add_drops_the_line_and_records_it() -> None:
    order = run(add(1), add(2), RemoveItem(K, 1)).state
    assert [line.line_number for line in order.lines] == [2]
    assert order.removed == (1,)


def test_repeated_add_or_remove_changes_nothing() -> None:
    order = run(add(1), RemoveItem(K, 2)).state
    assert handle(order, add(1), CTX).state is order
    assert handle(order, add(1, price="5.00"), CTX).state is order
    assert handle(order, RemoveItem(K, 2), CTX).state is order


def test_readiness_waits_for_the_announced_removals() -> None:
    decision = run(place(2), add(1, "10.00"), add(2, "20.00"), SubmitOrder(K, 1))
    assert decision.state.status == "open"
    assert decision.http_call is None
    done = handle(decision.state, RemoveItem(K, 2), CTX)
    assert done.state.status == "awaiting_payment"
    assert done.state.total == Decimal("10.00")


@pytest.mark.parametrize("missing", ["place", "submit", "line"])
def test_readiness_needs_place_submit_and_every_line(missing: str) -> None:
    messages: dict[str, object] = {"place": place(2), "submit": SubmitOrder(K, 0), "line": add(2)}
    last = messages.pop(missing)
    before = run(add(1), *messages.values())
    assert before.state.status == "open"
    assert handle(before.state, last, CTX).state.status == "awaiting_payment"


def test_finalising_computes_total_invoice_and_payment_call() -> None:
    decision = run(
        place(2), add(1, "17954.55", "0.04", "0.02"), add(2, "100.00"), SubmitOrder(K, 0)
    )
    order = decision.state
    # 17954.55 * 0.96 * 1.02 = 17581.09536; + 100.00 = 17681.09536 -> 17681.10
    assert order.total == Decimal("17681.10")
    assert order.status == "awaiting_payment"
    key = CTX.artifact_key("invoices")
    assert order.invoice_key == key
    (blob,) = decision.blobs
    assert (blob.key, blob.media_type) == (key, "application/pdf")
    invoice = blob.content
    assert isinstance(invoice, Document)
    assert ("Order", "7") in invoice.fields
    assert ("Customer", "42") in invoice.fields
    assert ("Order date", "1996-01-02") in invoice.fields
    assert ("Total", "17681.10") in invoice.totals
    assert len(invoice.rows) == 2
    call = decision.http_call
    assert call is not None
    assert call.service == "payments"
    assert call.body == {"order_key": K, "customer_key": 42, "amount": "17681.10"}
    assert call.follow_up == PaymentResult(K)
    assert decision.outgoing == ()


@pytest.mark.parametrize(
    ("price", "expected"),
    [("0.25", "0.12"), ("0.75", "0.38"), ("0.45", "0.22"), ("0.47", "0.24")],
)
def test_total_rounds_half_even_to_cents(price: str, expected: str) -> None:
    order = run(place(1), add(1, price, "0.50"), SubmitOrder(K, 0)).state
    assert order.total == Decimal(expected)


def test_order_with_every_line_removed_totals_zero() -> None:
    order = run(place(1), add(1), RemoveItem(K, 1), SubmitOrder(K, 1)).state
    assert order.status == "awaiting_payment"
    assert order.total == Decimal("0.00")
    assert str(order.total) == "0.00"


def test_payment_200_confirms_tells_the_ledger_and_books_the_shipment() -> None:
    order = finalised()
    decision = handle(order, PaymentResult(K), paid(200, {"status": "approved"}))
    assert decision.state.status == "confirmed"
    invoice = CTX.artifact_key("invoices")
    event = OrderConfirmed(K, 42, Decimal("200.00"), invoice)
    assert decision.outgoing == (Outgoing("ledger", event),)
    assert decision.api_call == CallApi("carrier", "POST", "/v1/shipments", {
        "order_key": K, "customer_key": 42, "invoice_key": invoice},
        follow_up=ShipmentBooked(K))
    assert decision.state.shipment_status is None


@pytest.mark.parametrize(("status", "shipment"), [(201, "s-1"), (400, None)])
def test_the_carriers_answer_is_kept_a_refusal_included(status: int, shipment: str | None
                                                        ) -> None:
    confirmed = handle(finalised(), PaymentResult(K), paid(200, {})).state
    booked = handle(confirmed, ShipmentBooked(K), paid(status, {"id": "s-1"})).state
    assert (booked.status, booked.shipment_status, booked.shipment_id) == (
        "confirmed", status, shipment)
    with pytest.raises(Rejected):  # once only
        handle(booked, ShipmentBooked(K), paid(status, {"id": "s-1"}))
    with pytest.raises(Rejected):  # not before the confirmation
        handle(finalised(), ShipmentBooked(K), paid(201, {"id": "s-1"}))


def test_payment_409_rejects_with_the_reason() -> None:
    order = finalised()
    decision = handle(order, PaymentResult(K), paid(409, {"reason": "insufficient funds"}))
    assert decision.state.status == "rejected"
    event = OrderRejected(K, 42, Decimal("200.00"), "insufficient funds")
    assert decision.outgoing == (Outgoing("ledger", event),)
    plain = handle(order, PaymentResult(K), paid(409, {}))
    assert plain.outgoing[0].message.reason == "refused"


@pytest.mark.parametrize(
    ("state", "context"),
    [
        (None, CTX),
        (Order(order_key=K), paid(200, {})),
        ("finalised", CTX),
        ("finalised", paid(500, {})),
        ("confirmed", paid(200, {})),
    ],
)
def test_payment_result_rejected_unless_awaited_with_200_or_409(
    state: Order | str | None, context: Context
) -> None:
    if state == "finalised":
        state = finalised()
    elif state == "confirmed":
        state = handle(finalised(), PaymentResult(K), paid(200, {})).state
    assert not isinstance(state, str)
    with pytest.raises(Rejected):
        handle(state, PaymentResult(K), context)


def test_changes_after_finalisation_are_rejected() -> None:
    order = finalised(2)
    with pytest.raises(Rejected):
        handle(order, RemoveItem(K, 1), CTX)
    with pytest.raises(Rejected):
        handle(order, add(3), CTX)
    with pytest.raises(Rejected):
        handle(order, place(2, customer=43), CTX)
    with pytest.raises(Rejected):
        handle(order, SubmitOrder(K, 1), CTX)


def test_exact_repeats_after_finalisation_change_nothing() -> None:
    order = finalised(2)
    for message in (place(2), add(1), SubmitOrder(K, 0)):
        assert handle(order, message, CTX) == Decision(state=order)


def test_conflicting_place_order_is_rejected_while_open() -> None:
    order = run(place(2)).state
    assert handle(order, place(2), CTX).state is order
    with pytest.raises(Rejected):
        handle(order, place(3), CTX)


@pytest.mark.parametrize(
    "messages",
    [
        (place(2), add(3)),
        (add(0),),
        (add(3), place(2)),
        (SubmitOrder(K, 1), RemoveItem(K, 1), RemoveItem(K, 2)),
        (RemoveItem(K, 1), RemoveItem(K, 2), SubmitOrder(K, 1)),
        (SubmitOrder(K, 3), place(2)),
        (SubmitOrder(K, 0), SubmitOrder(K, 1)),
        (OrderConfirmed(K, 1, Decimal(1), "x"),),
    ],
)
def test_impossible_commands_are_rejected(messages: tuple[object, ...]) -> None:
    with pytest.raises(Rejected):
        run(*messages)


def test_message_for_another_order_is_rejected() -> None:
    with pytest.raises(Rejected):
        handle(Order(order_key=K), AddItem(8, 1, 1, *[Decimal(1)] * 4), CTX)


def test_endpoint_definition() -> None:
    assert ORDERS.name == "orders"
    assert ORDERS.outputs == ("ledger",)
    assert ORDERS.state_type is Order
    assert ORDERS.partition_of(add(1)) == "7"
    assert ORDERS.partition_of(PaymentResult(11)) == "11"
    assert ORDERS.type_name(SubmitOrder(K, 0)) == "SubmitOrder"
    assert set(ORDERS.messages) == {
        "PlaceOrder",
        "AddItem",
        "RemoveItem",
        "SubmitOrder",
        "PaymentResult",
        "ShipmentBooked",
    }


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (place(MAX_LINES + 1), f"line_count {MAX_LINES + 1} above the limit of {MAX_LINES}"),
        (place(5_000_000), f"line_count 5000000 above the limit of {MAX_LINES}"),
        (SubmitOrder(K, 5_000_000), f"removal_count 5000000 above the limit of {MAX_LINES}"),
        (add(MAX_LINES + 1), f"line {MAX_LINES + 1} outside 1..{MAX_LINES}"),
        (RemoveItem(K, 5_000_000), f"line 5000000 outside 1..{MAX_LINES}"),
    ],
)
def test_an_order_is_bounded_and_a_larger_one_rejected_with_the_limit(
    message: object, reason: str
) -> None:
    """The security review's unbounded work: every message of an order announcing 5e6 lines
    built a list of 5e6 numbers (205 MiB, 0.26 s per message). Now refused on arrival."""
    with pytest.raises(Rejected, match=reason):
        run(message)


def test_an_order_of_the_most_lines_allowed_is_finalised() -> None:
    order = finalised(MAX_LINES)
    assert order.status == "awaiting_payment"
    assert len(order.lines) == MAX_LINES


def test_readiness_counts_received_lines_and_removals() -> None:
    open_order = run(place(3), add(3), RemoveItem(K, 1), SubmitOrder(K, 1)).state
    assert open_order.status == "open"  # line 2 is missing
    assert run(add(2), state=open_order).state.status == "awaiting_payment"
    waiting = run(place(3), add(1), add(2), SubmitOrder(K, 1)).state
    assert waiting.status == "open"  # the announced removal has not arrived
    assert run(RemoveItem(K, 3), state=waiting).state.status == "awaiting_payment"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (PlaceOrder(K, 42, date(1996, 1, 2), "x" * 1_000_000, 1), "priority 'xxxx"),
        (PlaceOrder(K, 42, date(1996, 1, 2), "4-NOT SPECIFIED!", 1),
         "longer than 15 characters"),
        (add(1, price="9" * 1_000_000), "extended_price 9999"),
        (add(1, price="1." + "1" * 30), "extended_price 1.111"),
        (add(1, tax="NaN"), "tax NaN is not an amount"),
        (add(1, discount="Infinity"), "discount Infinity is not an amount"),
    ],
)
def test_an_order_bounds_its_fields(message: object, reason: str) -> None:
    """Issue 24: 60 AddItems of 1 MB each grew one order's state to 44 MB, and a normal
    order sent after it took 6 minutes. The sample bounds what it keeps (TPC-H's
    DECIMAL(15,2)-sized amounts and its CHAR(15) priorities), so a producer cannot grow
    it."""
    with pytest.raises(Rejected, match=reason):
        run(message)
    assert run(add(1, price="12345678901.2345")).state.lines[0].extended_price == Decimal(
        "12345678901.2345")  # 15 digits, 4 after the point: kept
