"""The sample domain: TPC-H orders, payments and a revenue ledger (see docs/sample/index.md)."""

from domain.sample.ledger import LEDGER
from domain.sample.messages import (
    NAMESPACE,
    AddItem,
    OrderConfirmed,
    OrderRejected,
    PaymentRequest,
    PaymentResult,
    PlaceOrder,
    RemoveItem,
    SubmitOrder,
    natural_id,
)
from domain.sample.orders import ORDERS
from domain.sample.payments import PAYMENTS

__all__ = [
    "LEDGER",
    "NAMESPACE",
    "ORDERS",
    "PAYMENTS",
    "AddItem",
    "OrderConfirmed",
    "OrderRejected",
    "PaymentRequest",
    "PaymentResult",
    "PlaceOrder",
    "RemoveItem",
    "SubmitOrder",
    "natural_id",
]
