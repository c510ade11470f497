"""Bounded dead letters (security review, finding 4), on the memory broker: a malformed body's
dead letter carries a prefix with the body's size and SHA-256, copies keep only known headers
(each capped), and a full dead-letter queue holds the dead letter until there is room."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from types import MappingProxyType

import pytest

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from application.codec import encode
from application.envelope import (
    BODY_BYTES_HEADER,
    BODY_SHA256_HEADER,
    MAX_HEADER_CHARS,
    REASON_HEADER,
    RETRY_REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
    admitted,
)
from application.observability import MESSAGE_DEAD_LETTERED
from application.outcome import Outcome
from application.settlement import Consumer
from tests.support.counter import COUNTER
from tests.support.counters import endpoints as counters
from tests.support.world import World

QUEUE = "counter"
LIMIT = 64


async def _take(broker: MemoryBroker) -> MemoryDelivery:
    deliveries = broker.consume(QUEUE, "c1")
    try:
        return await asyncio.wait_for(anext(deliveries), 2.0)
    finally:
        await deliveries.aclose()


def _consumer(world: World) -> Consumer:
    return Consumer(world.processor(), max_attempts=5, retry_delays=(0.001, 0.002),
                    dead_letter_body_bytes=LIMIT)


async def _sent(world: World, broker: MemoryBroker, type_: str, body: bytes) -> Envelope:
    envelope = Envelope(uuid.uuid4(), type_, body, MappingProxyType({TOKEN_HEADER: "1"}))
    await world.tokens.create(world.endpoint.name, [envelope])
    await broker.dispatch(QUEUE, envelope)
    return envelope


async def test_a_malformed_bodys_dead_letter_is_clipped_with_its_size_and_digest() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    body = b'{"partition": "p", "amount": "' + b"9" * 10_000 + b'x"}'
    await _sent(world, broker, "Add", body)
    assert await _consumer(world).settle(await _take(broker)) is Outcome.DEAD_LETTERED
    (dead,) = broker.dead_letters[QUEUE]
    assert dead.body == body[:LIMIT]
    assert dead.headers[BODY_BYTES_HEADER] == str(len(body))
    assert dead.headers[BODY_SHA256_HEADER] == hashlib.sha256(body).hexdigest()
    assert dead.headers[REASON_HEADER].startswith("malformed Add")
    assert len(dead.headers[REASON_HEADER]) <= MAX_HEADER_CHARS


async def test_a_rejected_message_keeps_its_whole_body_for_a_replay() -> None:
    world, broker = World(counters.COUNTER), MemoryBroker()
    body = encode(counters.Add("c" * 500, -1))  # valid, refused by the handler
    await _sent(world, broker, "Add", body)
    assert await _consumer(world).settle(await _take(broker)) is Outcome.DEAD_LETTERED
    (dead,) = broker.dead_letters[QUEUE]
    assert dead.body == body
    assert BODY_BYTES_HEADER not in dead.headers


async def test_a_full_dead_letter_queue_holds_the_dead_letter_until_there_is_room() -> None:
    """Nothing is parked in a retry queue any more (issue 24: refused copies cycled there for
    ever): the dead letter waits, held, and its queue delivers nothing new meanwhile."""
    world, broker = World(COUNTER), MemoryBroker(dead_letter_max_bytes=LIMIT)
    await _sent(world, broker, "Add", b"not json")
    await _sent(world, broker, "Add", b'{"also": "not an Add", "pad": "' + b"x" * 40 + b'"}')
    third = await _sent(world, broker, "Add", b"neither")
    consumer = _consumer(world)
    assert await consumer.settle(await _take(broker)) is Outcome.DEAD_LETTERED
    waiting = asyncio.create_task(consumer.settle(await _take(broker)))  # refused: full
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert broker.blocked(QUEUE)
    with pytest.raises(TimeoutError):  # the third is not delivered while the second waits
        await asyncio.wait_for(anext(broker.consume(QUEUE, "c2")), 0.1)
    assert len(broker.dead_letters[QUEUE]) == 1
    broker.dead_letters[QUEUE].clear()  # an operator drained the dead-letter queue
    assert await asyncio.wait_for(waiting, 2.0) is Outcome.DEAD_LETTERED
    assert not broker.blocked(QUEUE)
    later = await _take(broker)
    assert later.envelope.message_id == third.message_id
    broker.dead_letters[QUEUE].clear()  # (the second's copy fills the queue again)
    assert await consumer.settle(later) is Outcome.DEAD_LETTERED
    assert world.events.total(MESSAGE_DEAD_LETTERED) == 3
    assert broker.idle()


def test_a_delivery_keeps_only_the_protocols_and_the_kept_headers_each_capped() -> None:
    foreign = {f"x-producer-{i}": "y" * 10_000 for i in range(50)}
    headers = {**foreign, TOKEN_HEADER: "1", "traceparent": "00-abc-def-01",
               RETRY_REASON_HEADER: "r" * 5000, "eo-unknown": "dropped"}
    envelope = admitted(str(uuid.uuid4()), "Add", b"{}", headers, 1024,
                        kept_headers=("traceparent",))
    assert set(envelope.headers) == {TOKEN_HEADER, "traceparent", RETRY_REASON_HEADER}
    assert len(envelope.headers[RETRY_REASON_HEADER]) == MAX_HEADER_CHARS
    assert envelope.headers[RETRY_REASON_HEADER].endswith("\u2026")
    sent = sum(len(k) + len(v) for k, v in headers.items())
    kept = sum(len(k) + len(v) for k, v in envelope.headers.items())
    assert kept < 2 * MAX_HEADER_CHARS < sent / 100  # no growth from what producers add
