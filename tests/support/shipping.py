"""An endpoint that calls a third-party API (protocol 12), for the framework's tests: `Ship`
books a shipment with the `carrier` API (`CallApi`); its follow-up `Booked` records the
carrier's answer (status and shipment ID) in the order's state."""

from __future__ import annotations

from dataclasses import dataclass

from domain.context import Context
from domain.decisions import CallApi, Decision, Endpoint


@dataclass(frozen=True)
class Ship:
    """Book a shipment of `order` weighing `grams`."""

    order: str
    grams: int


@dataclass(frozen=True)
class Booked:
    """The follow-up of `Ship`: carries the carrier's answer into the handler."""

    order: str


@dataclass(frozen=True)
class Shipment:
    """An order's state: what it asked, and the carrier's answer once it came."""

    grams: int = 0
    status: int | None = None
    shipment_id: str | None = None
    answers: int = 0


def handle(state: Shipment | None, message: Ship | Booked, context: Context
           ) -> Decision[Shipment]:
    """`Ship`: ask the carrier (nothing is sent before the commit); `Booked`: keep its
    answer, whatever the status (a 4xx is the carrier's business answer)."""
    state = state or Shipment()
    if isinstance(message, Ship):
        return Decision(state=Shipment(grams=message.grams), api_call=CallApi(
            "carrier", "POST", "/v1/shipments", {"order": message.order,
                                                 "grams": message.grams},
            follow_up=Booked(message.order)))
    answer = context.http_response
    if answer is None:
        raise ValueError("a Booked follow-up comes with the carrier's answer")
    return Decision(state=Shipment(state.grams, answer.status, str(answer.body.get("id")),
                                   state.answers + 1))


SHIPPING: Endpoint[Shipment] = Endpoint(
    name="shipping",
    messages={"Ship": Ship, "Booked": Booked},
    partition_of=lambda m: m.order,
    handle=handle,
    state_type=Shipment,
)
