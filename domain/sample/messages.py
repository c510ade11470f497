"""Commands and events of the sample domain (TPC-H orders) and their natural message IDs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

NAMESPACE = uuid.UUID("c05ae653-ec70-582e-ba2d-b28cf8352479")
"""Fixed namespace of natural IDs (uuid5(NAMESPACE_URL, "urn:exactly-once-template:sample"))."""


def natural_id(*parts: object) -> uuid.UUID:
    """The natural message ID of a boundary command: uuid5(NAMESPACE, "/".join(map(str, parts))).

    Example: `natural_id("AddItem", 7, 3)` names "AddItem/7/3". Same parts -> same ID.
    """
    return uuid.uuid5(NAMESPACE, "/".join(str(part) for part in parts))


@dataclass(frozen=True)
class PlaceOrder:
    """An order's header (TPC-H orders row); `line_count` = number of its line items."""

    order_key: int
    customer_key: int
    order_date: date
    priority: str
    line_count: int


@dataclass(frozen=True)
class AddItem:
    """One line item (TPC-H lineitem row). Money in Decimal; discount and tax are fractions."""

    order_key: int
    line_number: int
    part_key: int
    quantity: Decimal
    extended_price: Decimal
    discount: Decimal
    tax: Decimal


@dataclass(frozen=True)
class RemoveItem:
    """Remove line `line_number` of an order (TPC-H line items with l_returnflag = 'R')."""

    order_key: int
    line_number: int


@dataclass(frozen=True)
class SubmitOrder:
    """The producer is done with the order; `removal_count` of its lines are removed."""

    order_key: int
    removal_count: int


@dataclass(frozen=True)
class PaymentResult:
    """Follow-up of the payment HTTP call; the response arrives in `Context.http_response`."""

    order_key: int


@dataclass(frozen=True)
class ShipmentBooked:
    """Follow-up of the carrier API call (protocol 12): the carrier's answer arrives in
    `Context.http_response`."""

    order_key: int


@dataclass(frozen=True)
class OrderConfirmed:
    """Event to the ledger: the order was paid; `total` in Decimal, `invoice_key` a blob key."""

    order_key: int
    customer_key: int
    total: Decimal
    invoice_key: str


@dataclass(frozen=True)
class OrderRejected:
    """Event to the ledger: payments refused the order's `total`, with its `reason`."""

    order_key: int
    customer_key: int
    total: Decimal
    reason: str


@dataclass(frozen=True)
class PaymentRequest:
    """The body the payments callee processes: debit `amount` (Decimal) from the customer."""

    order_key: int
    customer_key: int
    amount: Decimal
