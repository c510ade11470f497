"""Bounded dead letters (security review, finding 4), on the memory broker: a malformed body's
dead letter carries a prefix with the body's size and SHA-256, copies keep only known headers
(each capped), and a full dead-letter queue holds the dead letter until there is room."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from datetime import UTC, datetime
from types import MappingProxyType

import pytest

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from application.codec import encode
from application.dead_letter_copies import dead_letter_of
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
from application.errors import MalformedMessage
from application.observability import MESSAGE_DEAD_LETTERED
from application.outcome import Outcome
from application.settlement import Settler
from application.wire_text import clean
from entrypoints.dead_letter_views import letter_json
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


def _consumer(world: World) -> Settler:
    return Settler(world.processor(), max_attempts=5, retry_delays=(0.001, 0.002),
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


#: what a transport hands over for bytes that are not UTF-8 (adapters/rabbitmq/wire.py)
NOT_UTF8 = b"\xff".decode("utf-8", "surrogateescape")


#: a message ID (fixed: parameters are part of the test IDs, the same in every process)
_ID = "0b6f7e2a-5d1c-4c4e-9a57-0d2c0a1e5f30"


@pytest.mark.parametrize(("message_id", "type_", "headers", "what"), [
    (_ID, f"Add{NOT_UTF8}", {}, "type 'Add\\xff'"),
    (_ID, "Add\x00", {}, "type 'Add\\x00'"),
    (f"{NOT_UTF8}{_ID}", "Add", {}, "message_id '\\xff"),
    ("\x00", "Add", {}, "message_id '\\x00'"),
    (_ID, "Add", {TOKEN_HEADER: f"1{NOT_UTF8}"}, "header eo-token '1\\xff'"),
    (_ID, "Add", {"traceparent": "\x00"}, "header traceparent '\\x00'"),
], ids=["type-not-utf8", "type-nul", "id-not-utf8", "id-nul", "token-not-utf8", "kept-nul"])
def test_a_type_message_id_or_kept_header_that_is_not_clean_text_is_malformed(
    message_id: str, type_: str, headers: dict[str, str], what: str,
) -> None:
    """Issue 37: U+0000 or bytes that are not UTF-8 in what a delivery keeps cannot be
    stored (PostgreSQL's text and jsonb refuse them): the delivery is malformed, its reason
    shows the value escaped; in a header the service drops, they do no harm."""
    with pytest.raises(MalformedMessage) as refused:
        admitted(message_id, type_, b"{}", headers, 1024, kept_headers=("traceparent",))
    assert refused.value.reason.startswith(what), refused.value.reason
    assert clean(refused.value.reason)
    envelope = admitted(str(uuid.uuid4()), "Add", b"{}", {f"h{NOT_UTF8}": f"\x00{NOT_UTF8}"},
                        1024)
    assert dict(envelope.headers) == {}


def test_every_text_of_a_dead_letter_is_clean_and_its_bytes_are_kept() -> None:
    """Whatever bytes a dead-letter copy holds, its `DeadLetter` is text every store keeps;
    what was escaped keeps its bytes in `originals` and cannot be replayed."""
    letter = dead_letter_of("gateway", f"{NOT_UTF8}\x00", f"Add{NOT_UTF8}", b"\x00",
                            {f"eo-{NOT_UTF8}": "\x00", REASON_HEADER: f"why\x00{NOT_UTF8}"},
                            "p\x00", datetime.now(UTC))
    texts = [letter.raw_message_id, letter.type, letter.producer, letter.reason,
             *letter.headers, *letter.headers.values()]
    assert all(isinstance(t, str) and clean(t) for t in texts), texts
    assert (letter.raw_message_id, letter.type, letter.reason) == ("\\xff\\x00", "Add\\xff",
                                                                   "why\\x00\\xff")
    assert dict(letter.originals) == {"message_id": b"\xff\x00", "type": b"Add\xff",
                                      "producer": b"p\x00", "header name eo-\\xff": b"eo-\xff",
                                      "header eo-\\xff": b"\x00",
                                      "header eo-reason": b"why\x00\xff"}
    assert not letter.replayable
    assert letter.digest is not None
    shown = json.loads(json.dumps(letter_json(letter)))  # what eo dead-letters and the page show
    assert shown["type"] == "Add\\xff"
    assert {k: base64.b64decode(v) for k, v in shown["originals"].items()} == letter.originals
