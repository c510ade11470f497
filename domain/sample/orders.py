"""The orders endpoint: assembles an order from messages in any order, then bills and pays
it, and books its shipment with the carrier once paid."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date
from decimal import Decimal

from domain.context import Context
from domain.decisions import CallApi, CallHttp, CreateBlob, Decision, Endpoint, Outgoing
from domain.errors import Rejected
from domain.sample.billing import Line, invoice_document, order_total
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

OPEN, AWAITING_PAYMENT, CONFIRMED, REJECTED = "open", "awaiting_payment", "confirmed", "rejected"
INVOICE_MEDIA_TYPE = "application/pdf"
#: The most lines an order may have (TPC-H orders have 1 to 7). The state and the work of
#: every message of an order grow with its lines, so an order announcing more is rejected.
MAX_LINES = 1000
#: The longest order priority (TPC-H's O_ORDERPRIORITY is CHAR(15), e.g. "4-NOT SPECIFIED").
MAX_PRIORITY_CHARS = 15
#: The most digits of a line's amounts, and of their fraction (TPC-H: DECIMAL(15,2)): an
#: order's state stays small whatever a producer sends.
MAX_DIGITS, MAX_FRACTION_DIGITS = 15, 4
OrderMessage = PlaceOrder | AddItem | RemoveItem | SubmitOrder | PaymentResult | ShipmentBooked
#: The carrier's third-party API (declared in service/sample.py) and where shipments go.
CARRIER, SHIPMENTS_PATH = "carrier", "/v1/shipments"
_BUILDING = (PlaceOrder, AddItem, RemoveItem, SubmitOrder)


@dataclass(frozen=True)
class Order:
    """State of one order (partition = str(order_key)).

    Header fields are None until PlaceOrder; `lines` sorted by line number, `removed` the sorted
    tombstoned line numbers; `status` is one of "open", "awaiting_payment", "confirmed",
    "rejected"; `total` (Decimal, cents) and `invoice_key` are set when the order is finalised;
    a confirmed order's shipment is booked with the carrier: `shipment_status` is the
    carrier's answer's HTTP status and `shipment_id` its shipment's ID (2xx only).
    """

    order_key: int
    customer_key: int | None = None
    order_date: date | None = None
    priority: str | None = None
    placed: bool = False
    line_count: int | None = None
    submitted: bool = False
    removal_count: int | None = None
    lines: tuple[Line, ...] = ()
    removed: tuple[int, ...] = ()
    status: str = OPEN
    total: Decimal | None = None
    invoice_key: str | None = None
    shipment_status: int | None = None
    shipment_id: str | None = None


def _reject(order: Order, reason: str) -> Rejected:
    return Rejected(f"order {order.order_key}: {reason}")


def _check_line_number(order: Order, line_number: int) -> None:
    last = order.line_count if order.line_count is not None else MAX_LINES
    if not 1 <= line_number <= last:
        raise _reject(order, f"line {line_number} outside 1..{last}")


def _check_amount(order: Order, name: str, value: Decimal) -> None:
    _, digits, exponent = value.as_tuple()
    if (not value.is_finite() or not isinstance(exponent, int) or len(digits) > MAX_DIGITS
            or -exponent > MAX_FRACTION_DIGITS):
        raise _reject(order, f"{name} {str(value)[:40]} is not an amount of at most "
                             f"{MAX_DIGITS} digits, {MAX_FRACTION_DIGITS} after the point")


def _place(order: Order, m: PlaceOrder) -> Order:
    if len(m.priority) > MAX_PRIORITY_CHARS:
        raise _reject(order, f"priority {m.priority[:20]!r}... longer than "
                             f"{MAX_PRIORITY_CHARS} characters")
    header = (m.customer_key, m.order_date, m.priority, m.line_count)
    if order.placed:
        if (order.customer_key, order.order_date, order.priority, order.line_count) == header:
            return order
        raise _reject(order, "PlaceOrder conflicts with the order already placed")
    if m.line_count > MAX_LINES:
        raise _reject(order, f"line_count {m.line_count} above the limit of {MAX_LINES}")
    known = [line.line_number for line in order.lines] + list(order.removed)
    if m.line_count < 0 or max(known, default=0) > m.line_count:
        raise _reject(order, f"line_count {m.line_count} below a line already received")
    if order.removal_count is not None and order.removal_count > m.line_count:
        raise _reject(order, f"line_count {m.line_count} below removal_count")
    return replace(
        order,
        customer_key=m.customer_key,
        order_date=m.order_date,
        priority=m.priority,
        placed=True,
        line_count=m.line_count,
    )


def _add(order: Order, m: AddItem) -> Order:
    if m.line_number in order.removed or any(x.line_number == m.line_number for x in order.lines):
        return order
    if order.status != OPEN:
        raise _reject(order, f"AddItem for line {m.line_number} after the order was finalised")
    _check_line_number(order, m.line_number)
    for name in ("quantity", "extended_price", "discount", "tax"):
        _check_amount(order, name, getattr(m, name))
    line = Line(m.line_number, m.part_key, m.quantity, m.extended_price, m.discount, m.tax)
    lines = sorted((*order.lines, line), key=lambda x: x.line_number)
    return replace(order, lines=tuple(lines))


def _remove(order: Order, m: RemoveItem) -> Order:
    if m.line_number in order.removed:
        return order
    if order.status != OPEN:
        raise _reject(order, f"RemoveItem for line {m.line_number} after the order was finalised")
    _check_line_number(order, m.line_number)
    if order.removal_count is not None and len(order.removed) >= order.removal_count:
        raise _reject(order, f"more than the announced {order.removal_count} removals")
    lines = tuple(x for x in order.lines if x.line_number != m.line_number)
    return replace(order, lines=lines, removed=tuple(sorted((*order.removed, m.line_number))))


def _submit(order: Order, m: SubmitOrder) -> Order:
    if order.submitted:
        if order.removal_count == m.removal_count:
            return order
        raise _reject(order, "SubmitOrder conflicts with the one already received")
    if m.removal_count > MAX_LINES:
        raise _reject(order, f"removal_count {m.removal_count} above the limit of {MAX_LINES}")
    if m.removal_count < len(order.removed):
        raise _reject(order, f"removal_count {m.removal_count} below the removals received")
    if order.line_count is not None and m.removal_count > order.line_count:
        raise _reject(order, f"removal_count {m.removal_count} above line_count")
    return replace(order, submitted=True, removal_count=m.removal_count)


def _is_ready(order: Order) -> bool:
    """Every line 1..line_count added or removed, and the announced removals all in. Work in
    the lines received, not in `line_count`: they are distinct (a line is added or removed
    once) and each within 1..line_count (checked on arrival, or by PlaceOrder for those that
    came first), so counting them is enough."""
    if not (order.placed and order.submitted) or order.line_count is None:
        return False
    complete = len(order.lines) + len(order.removed) == order.line_count
    return complete and len(order.removed) == order.removal_count


def _finalise(order: Order, context: Context) -> Decision[Order]:
    total = order_total(order.lines)
    invoice_key = context.artifact_key("invoices")
    header = (order.order_key, order.customer_key, order.order_date, order.priority)
    content = invoice_document(*header, order.lines, order.removed, total)
    body = {"order_key": order.order_key, "customer_key": order.customer_key, "amount": str(total)}
    return Decision(
        state=replace(order, status=AWAITING_PAYMENT, total=total, invoice_key=invoice_key),
        blobs=(CreateBlob(key=invoice_key, content=content, media_type=INVOICE_MEDIA_TYPE),),
        http_call=CallHttp("payments", body, follow_up=PaymentResult(order_key=order.order_key)),
    )


def _pay(order: Order | None, m: PaymentResult, context: Context) -> Decision[Order]:
    if order is None or order.status != AWAITING_PAYMENT:
        status = "unknown" if order is None else order.status
        raise Rejected(f"order {m.order_key}: PaymentResult while {status}, not awaiting_payment")
    response = context.http_response
    if response is None:
        raise _reject(order, "PaymentResult without an HTTP response")
    customer_key, total, invoice_key = order.customer_key, order.total, order.invoice_key
    if customer_key is None or total is None or invoice_key is None:
        raise _reject(order, "awaiting payment without customer, total or invoice")
    if response.status == 200:
        event = OrderConfirmed(order.order_key, customer_key, total, invoice_key)
        booking = {"order_key": order.order_key, "customer_key": customer_key,
                   "invoice_key": invoice_key}
        return Decision(replace(order, status=CONFIRMED), outgoing=(Outgoing("ledger", event),),
                        api_call=CallApi(CARRIER, "POST", SHIPMENTS_PATH, booking,
                                         follow_up=ShipmentBooked(order.order_key)))
    if response.status == 409:
        reason = str(response.body.get("reason", "refused"))
        refusal = OrderRejected(order.order_key, customer_key, total, reason)
        return Decision(replace(order, status=REJECTED), outgoing=(Outgoing("ledger", refusal),))
    raise _reject(order, f"unexpected payment response status {response.status}")


def _shipped(order: Order | None, m: ShipmentBooked, context: Context) -> Decision[Order]:
    if order is None or order.status != CONFIRMED or order.shipment_status is not None:
        status = "unknown" if order is None else order.status
        raise Rejected(f"order {m.order_key}: ShipmentBooked while {status}, not confirmed "
                       "and awaiting its shipment")
    response = context.http_response
    if response is None:
        raise _reject(order, "ShipmentBooked without the carrier's answer")
    shipment_id = str(response.body.get("id")) if 200 <= response.status < 300 else None
    return Decision(replace(order, shipment_status=response.status, shipment_id=shipment_id))


def handle(state: Order | None, message: object, context: Context) -> Decision[Order]:
    """Apply one orders message (PlaceOrder, AddItem, RemoveItem, SubmitOrder, PaymentResult,
    ShipmentBooked).

    Deterministic. Opens unknown orders lazily; finalises (total, invoice blob, payment call)
    in the decision that makes the order ready; books the shipment (a carrier API call) in
    the one that confirms it, and keeps the carrier's answer; raises Rejected for a
    conflicting or late change, a PaymentResult not awaited or without response/with another
    status than 200/409, a ShipmentBooked not awaited.
    """
    if isinstance(message, PaymentResult):
        return _pay(state, message, context)
    if isinstance(message, ShipmentBooked):
        return _shipped(state, message, context)
    if not isinstance(message, _BUILDING):
        raise Rejected(f"orders does not handle {type(message).__name__}")
    order = state if state is not None else Order(order_key=message.order_key)
    if message.order_key != order.order_key:
        raise _reject(order, f"message for order {message.order_key} in the wrong partition")
    if isinstance(message, PlaceOrder):
        changed = _place(order, message)
    elif isinstance(message, AddItem):
        changed = _add(order, message)
    elif isinstance(message, RemoveItem):
        changed = _remove(order, message)
    else:
        changed = _submit(order, message)
    if changed is not order and changed.status == OPEN and _is_ready(changed):
        return _finalise(changed, context)
    return Decision(state=changed)


def order_partition(message: OrderMessage) -> str:
    """The partition key of an orders message: str(order_key)."""
    return str(message.order_key)


ORDERS: Endpoint[Order] = Endpoint(
    name="orders",
    messages={cls.__name__: cls for cls in (*_BUILDING, PaymentResult, ShipmentBooked)},
    partition_of=order_partition,
    handle=handle,
    state_type=Order,
    outputs=("ledger",),
)
