"""Driving one sample order through its steps: envelopes with tokens, readiness, deliveries."""

from __future__ import annotations

import asyncio
from datetime import date
from decimal import Decimal
from types import MappingProxyType

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from application.processor import Outcome
from domain.sample.messages import AddItem, PlaceOrder, SubmitOrder, natural_id
from entrypoints.embedded import SampleSystem

CUSTOMER = 7
ORDER = 1


def token_envelope(message: object, *parts: object) -> Envelope:
    """What a token-based sender sends: a natural ID from `parts` and the token header."""
    name = type(message).__name__
    return Envelope(natural_id(name, *parts), name, encode(message),
                    MappingProxyType({TOKEN_HEADER: "1"}))


async def ready_order(system: SampleSystem, price: str = "100.00") -> Envelope:
    """Place a one-line order (customer `CUSTOMER`, order `ORDER`); returns the SubmitOrder,
    its token created, whose processing finalises the order."""
    processor = system.processor("orders")
    place = token_envelope(PlaceOrder(ORDER, CUSTOMER, date(1996, 1, 2), "1-URGENT", 1), ORDER)
    item = token_envelope(
        AddItem(ORDER, 1, 155, Decimal(1), Decimal(price), Decimal(0), Decimal(0)), ORDER, 1)
    submit = token_envelope(SubmitOrder(ORDER, 0), ORDER)
    await system.tokens.create([place, item, submit])
    for envelope in (place, item):
        if await processor.process(envelope) is not Outcome.PROCESSED:
            raise AssertionError(f"{envelope.type} was not processed")
    return submit


async def take(broker: MemoryBroker, queue: str, consumer: str = "test",
               timeout_s: float = 2.0) -> MemoryDelivery:
    """The next delivery of `queue` for `consumer`, left unsettled."""
    deliveries = broker.consume(queue, consumer)
    try:
        return await asyncio.wait_for(anext(deliveries), timeout_s)
    finally:
        await deliveries.aclose()
