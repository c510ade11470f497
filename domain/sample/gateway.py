"""The sample's boundary gateway: outside producers' order commands, relayed to orders."""

from __future__ import annotations

from domain.gateway import gateway_for
from domain.sample.messages import AddItem, PlaceOrder, RemoveItem, SubmitOrder
from domain.sample.orders import ORDERS

#: The commands outside producers may send (the follow-up `PaymentResult` is internal).
COMMANDS: dict[str, type] = {
    "PlaceOrder": PlaceOrder, "AddItem": AddItem, "RemoveItem": RemoveItem,
    "SubmitOrder": SubmitOrder,
}

GATEWAY = gateway_for(ORDERS, COMMANDS)
