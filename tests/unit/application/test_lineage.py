"""Lineage headers (protocol 9): every message an endpoint sends names the producer's message
that started its chain (`eo-origin-id`, `eo-origin-producer`) and the message that caused it
(`eo-causation-id`), through the gateway, a token endpoint and an HTTP follow-up, on the
counters service. A producer cannot write them: the gateway starts the chain itself."""

from __future__ import annotations

import uuid
from dataclasses import replace
from types import MappingProxyType

from application.envelope import (
    CAUSATION_ID_HEADER,
    ORIGIN_ID_HEADER,
    ORIGIN_PRODUCER_HEADER,
    Envelope,
)
from application.outcome import Outcome
from tests.support.counters.endpoints import Add, Spend
from tests.support.counters.harness import counters, outside_envelope, take


async def test_the_origin_travels_from_the_gateway_through_a_follow_up_to_the_audit() -> None:
    system = counters()
    system.open_account("c1", 500)
    command = uuid.uuid4()
    forged = {ORIGIN_ID_HEADER: str(uuid.uuid4()), ORIGIN_PRODUCER_HEADER: "someone",
              CAUSATION_ID_HEADER: str(uuid.uuid4())}
    sent = replace(outside_envelope(Spend("c1", 100), command), producer="billing",
                   headers=MappingProxyType(forged))
    assert await system.processor("front").process(sent) is Outcome.PROCESSED
    relayed = (await take(system.broker, "counter")).envelope
    assert _lineage(relayed) == (str(command), "billing", str(command))  # not the forgery
    assert await system.processor("counter").process(relayed) is Outcome.PROCESSED
    follow_up = (await take(system.broker, "counter")).envelope
    assert _lineage(follow_up) == (str(command), "billing", str(relayed.message_id))
    assert await system.processor("counter").process(follow_up) is Outcome.PROCESSED
    report = (await take(system.broker, "audit")).envelope
    assert _lineage(report) == (str(command), "billing", str(follow_up.message_id))


async def test_an_anonymous_producers_chain_names_no_producer() -> None:
    system = counters()
    command = uuid.uuid4()
    assert await system.processor("front").process(
        outside_envelope(Add("c1", 1), command)) is Outcome.PROCESSED
    relayed = (await take(system.broker, "counter")).envelope
    assert _lineage(relayed) == (str(command), None, str(command))


def _lineage(envelope: Envelope) -> tuple[str | None, str | None, str | None]:
    return (envelope.header(ORIGIN_ID_HEADER), envelope.header(ORIGIN_PRODUCER_HEADER),
            envelope.header(CAUSATION_ID_HEADER))
