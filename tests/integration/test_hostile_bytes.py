"""Any bytes a producer can put in a message, on a real broker and a real PostgreSQL (issue
37): AMQP short strings (`type`, `message_id`, header names) and header values holding bytes
that are not UTF-8 or U+0000 never take a channel down, are dead-lettered with a reason, and
reach the dead-letter store, which never stalls on one entry.

Each test declares an endpoint's queues of its own (`hb-<random>`) on this module's virtual
host, and reads and writes this module's own database (`where_for`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pika
import pytest

from adapters.postgres.dead_letter_store import PostgresDeadLetterStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.dead_letter_queue import DeadLetterCollector
from adapters.rabbitmq.delivery import RabbitDelivery
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.rabbitmq.topology import QueueNames, declare
from adapters.system.clock import SystemClock
from application.envelope import REASON_HEADER, Envelope
from application.errors import PermanentError
from application.observability import DEAD_LETTER_UNSTORABLE, CountingSink
from application.ports import DeadLetterQuery, DeadLetterStore
from application.records import DeadLetter
from tests.support.processes import Where, where_for

DELAYS = (0.05, 0.2)


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_hostile_bytes", "eo-hostile-bytes") as found:
        yield found


@dataclass
class Broker:
    """A publishing and a consuming connection, and a fresh endpoint's declared queues."""

    url: str
    publisher: RabbitConnection
    consumer: RabbitConnection
    names: QueueNames

    def publish_raw(self, queue: str, body: bytes = b"{}", **properties: Any) -> None:
        """Publish with pika, whose short strings may be `bytes`: any octets, as a hostile
        producer's client writes them (blocking: run it in a thread)."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            connection.channel().basic_publish("", queue, body, pika.BasicProperties(
                delivery_mode=2, **properties))
        finally:
            connection.close()

    async def depth(self, queue: str) -> int:
        channel = await self.publisher.channel.get_underlay_channel()
        return (await channel.queue_declare(queue, passive=True)).message_count or 0


@pytest.fixture
async def broker(where: Where) -> AsyncIterator[Broker]:
    publisher = RabbitConnection(where.amqp_url, reconnect_delays_s=(0.1,))
    consumer = RabbitConnection(where.amqp_url, reconnect_delays_s=(0.1,))
    await publisher.start()
    await consumer.start()
    names = await declare(publisher, f"hb-{uuid.uuid4().hex[:12]}", DELAYS, 5)
    try:
        yield Broker(where.amqp_url, publisher, consumer, names)
    finally:
        for name in (names.work, *names.retries, names.dead_letter):
            await publisher.channel.queue_delete(name)
        await consumer.close()
        await publisher.close()


@pytest.fixture
async def store(pool: asyncpg.Pool) -> AsyncIterator[PostgresDeadLetterStore]:
    """The dead-letter store on this module's database (`pool`: tests/integration/conftest.py),
    emptied afterwards."""
    yield PostgresDeadLetterStore(pool, SystemClock())
    await pool.execute("DELETE FROM eo_dead_letter")


#: A type, message ID and kept header values of every hostile kind (pika's bytes): bytes
#: that are not UTF-8, U+0000, both, in each place the broker carries octets and the service
#: reads: each is dead-lettered.
HOSTILE: tuple[dict[str, Any], ...] = (
    {"type": b"\xffAdd", "message_id": str(uuid.uuid4())},
    {"type": b"Add\x00", "message_id": str(uuid.uuid4())},
    {"type": b"Add", "message_id": b"\xff" + str(uuid.uuid4()).encode()[1:]},
    {"type": b"Add", "message_id": b"\x00not-a-uuid"},
    {"type": b"Add", "message_id": str(uuid.uuid4()), "headers": {"eo-attempts": "1\x00"}},
    {"type": b"Add", "message_id": str(uuid.uuid4()),
     "headers": {"eo-origin-id": b"\xfe\xff"}},
)
#: Hostile bytes only where the service reads nothing (the content type, a header it does
#: not keep, name and value): each is processed like any valid message.
HARMLESS: tuple[dict[str, Any], ...] = (
    {"type": b"Add", "content_type": b"\xff\x00/json"},
    {"type": b"Add", "headers": {b"x-\xff\x00": b"\xff", b"h\xfe": "\x00"}},
)


async def test_bytes_that_are_not_utf8_never_take_the_channel_down(broker: Broker) -> None:
    """N12: a `type` or `message_id` with byte 0xff could not be decoded by the client
    (pamqp), which closed the connection on every delivery; the valid message requeued with
    it passed the delivery limit and was dead-lettered by the broker, never processed. Now
    each hostile delivery is dead-lettered by the source with a reason, once, and the valid
    one is delivered, with no consumer lost."""
    work = broker.names.work
    for properties in HOSTILE:
        await asyncio.to_thread(broker.publish_raw, work, **properties)
    harmless = [str(uuid.uuid4()) for _ in HARMLESS]
    for message_id, properties in zip(harmless, HARMLESS, strict=True):
        await asyncio.to_thread(broker.publish_raw, work, message_id=message_id, **properties)
    good = Envelope(uuid.uuid4(), "Add", b'{"counter": "c-1", "amount": 1}')
    await RabbitDispatcher(broker.publisher).dispatch(work, good)
    source = RabbitSource(broker.consumer, work, DELAYS)
    received: asyncio.Queue[RabbitDelivery] = asyncio.Queue()

    async def pump() -> None:
        async for delivery in source.deliveries(prefetch=4):
            received.put_nowait(delivery)
            await delivery.ack()

    task = asyncio.create_task(pump())
    try:
        for _ in range(200):
            if source.dead_lettered == len(HOSTILE) and received.qsize() == 3:
                break
            await asyncio.sleep(0.05)
    finally:
        await source.stop()
        await asyncio.wait_for(task, 5.0)
    delivered = [received.get_nowait().envelope for _ in range(received.qsize())]
    assert {str(e.message_id) for e in delivered} == {*harmless, str(good.message_id)}
    assert all(e.type == "Add" and dict(e.headers) == {} for e in delivered)
    assert (source.restarts, source.dead_lettered) == (0, len(HOSTILE))
    assert await broker.depth(work) == 0
    assert await broker.depth(broker.names.dead_letter) == len(HOSTILE)


async def test_every_hostile_dead_letter_reaches_the_store_with_its_reason(
    broker: Broker, store: PostgresDeadLetterStore,
) -> None:
    """N6: a dead letter whose type, message ID or header held U+0000 (or bytes that are not
    UTF-8) was refused by PostgreSQL on every sweep and stayed at the head of the queue:
    nothing behind it was collected. Now each is stored, escaped, with its bytes kept, and
    the legitimate dead letters behind them too; the queue is empty."""
    dlq = broker.names.dead_letter
    for properties in HOSTILE:  # as a source dead-letters them: the producer's bytes
        headers = {**properties.get("headers", {}), REASON_HEADER: f"hostile {properties}"}
        await asyncio.to_thread(broker.publish_raw, dlq, b"\x00{", **{
            **properties, "headers": headers})
    plain = [str(uuid.uuid4()) for _ in range(3)]
    for message_id in plain:
        await asyncio.to_thread(broker.publish_raw, dlq, b"{}", type="Add",
                                message_id=message_id, headers={REASON_HEADER: "plain"})
    events = CountingSink()
    collector = DeadLetterCollector(broker.publisher, broker.names.work, store, events=events)
    assert await asyncio.wait_for(collector.drain(), 30) == len(HOSTILE) + len(plain)
    assert await broker.depth(dlq) == 0
    kept = await store.find(DeadLetterQuery(endpoints=(broker.names.work,)))
    assert len(kept) == len(HOSTILE) + len(plain)
    assert all(d.reason for d in kept)
    assert {d.message_id and str(d.message_id) for d in kept if d.reason == "plain"} == set(plain)
    hostile = [d for d in kept if d.reason != "plain"]
    assert all(d.originals and not d.replayable for d in hostile), hostile
    assert events.total(DEAD_LETTER_UNSTORABLE) == 0  # escaped, not put aside


class _Refusing(DeadLetterStore):
    """A store that refuses, for good, the dead letter of one message ID as it came (a
    constraint the entry breaks, a bug): its plainest form is kept."""

    def __init__(self, inner: DeadLetterStore, refused: str) -> None:
        self.inner, self.refused = inner, refused

    async def add(self, letter: DeadLetter) -> int:
        if (str(letter.message_id or letter.raw_message_id) == self.refused
                and not letter.reason.startswith("kept in its plainest form")):
            raise PermanentError("this store refuses that entry")
        return await self.inner.add(letter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_an_entry_the_store_refuses_goes_aside_and_the_rest_is_collected(
    broker: Broker, store: PostgresDeadLetterStore,
) -> None:
    """Whatever one entry does (the store refuses it for good, or it cannot be read: a
    forged `x-death` of the wrong shape), it is kept in its plainest form with a
    `dead_letter.unstorable` event, and the entries behind it are collected."""
    dlq = broker.names.dead_letter
    refused, unreadable, after = (str(uuid.uuid4()) for _ in range(3))
    await asyncio.to_thread(broker.publish_raw, dlq, b"{}", type="Add", message_id=refused,
                            headers={REASON_HEADER: "refused by the store"})
    await asyncio.to_thread(broker.publish_raw, dlq, b"{}", type="Add",
                            message_id=unreadable, headers={"x-death": 5})
    await asyncio.to_thread(broker.publish_raw, dlq, b"{}", type="Add", message_id=after,
                            headers={REASON_HEADER: "behind them"})
    events = CountingSink()
    collector = DeadLetterCollector(broker.publisher, broker.names.work,
                                    _Refusing(store, refused), events=events)
    assert await asyncio.wait_for(collector.drain(), 30) == 3
    assert await broker.depth(dlq) == 0
    assert events.total(DEAD_LETTER_UNSTORABLE) == 2
    kept = {str(d.message_id): d for d in await store.find(DeadLetterQuery(
        endpoints=(broker.names.work,)))}
    assert set(kept) == {refused, unreadable, after}
    assert kept[after].reason == "behind them"
    for message_id in (refused, unreadable):
        assert kept[message_id].reason.startswith("kept in its plainest form"), kept[message_id]
        assert not kept[message_id].replayable
