"""RabbitMQ adapters against a real broker.

Invalid input dead-lettered by the source, publisher confirms, graceful stop, settlement edge
cases, the work queue's delivery limit, supervised consumption. Each test declares an
endpoint's queues of its own (`it-<random>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.delivery import RabbitDelivery
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.rabbitmq.errors import BrokerUnavailable
from adapters.rabbitmq.topology import QueueNames, declare, retry_index
from application.envelope import (
    ATTEMPTS_HEADER,
    BODY_BYTES_HEADER,
    BODY_SHA256_HEADER,
    ENDPOINT_HEADER,
    MAX_HEADER_CHARS,
    REASON_HEADER,
    Envelope,
)
from application.errors import TransientError
from application.observability import (
    DEAD_LETTER_QUEUE_FULL,
    DEAD_LETTER_QUEUE_ROOM,
    CountingSink,
)
from tests.support.processes import broker_user, this_run
from tests.support.services import discover

DELAYS = (0.05, 0.2)


@dataclass
class Rabbit:
    """Two connections (publisher, consumer) and a fresh endpoint's declared queues."""

    publisher: RabbitConnection
    consumer: RabbitConnection
    names: QueueNames

    async def depth(self, queue: str) -> int:
        # a robust channel answers a passive declare from its cache: ask the broker itself
        channel = await self.publisher.channel.get_underlay_channel()
        declared = await channel.queue_declare(queue, passive=True)
        return declared.message_count or 0

    async def drain(self, queue: str, count: int = 1,
                    wait_s: float = 3.0) -> list[AbstractIncomingMessage]:
        """Take up to `count` messages off `queue`, waiting up to `wait_s` for them."""
        found: list[AbstractIncomingMessage] = []
        declared = await self.publisher.channel.declare_queue(queue, passive=True)
        for _ in range(int(wait_s / 0.02)):
            if len(found) >= count:
                break
            message = await declared.get(no_ack=True, fail=False)
            if message is None:
                await asyncio.sleep(0.02)
            else:
                found.append(message)
        return found


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    services = discover(postgres=False)
    yield services.amqp_url
    services.close()


async def open_rabbit(url: str, delivery_limit: int = 5) -> Rabbit:
    publisher = RabbitConnection(url, reconnect_delays_s=(0.1,))
    consumer = RabbitConnection(url, reconnect_delays_s=(0.1,))
    await publisher.start()
    await consumer.start()
    endpoint = f"it-{uuid.uuid4().hex[:12]}"
    names = await declare(publisher, endpoint, DELAYS, delivery_limit)
    return Rabbit(publisher, consumer, names)


async def close_rabbit(rabbit: Rabbit) -> None:
    names = rabbit.names
    for name in (names.work, *names.retries, names.dead_letter):
        await rabbit.publisher.channel.queue_delete(name)
    await rabbit.consumer.close()
    await rabbit.publisher.close()


@pytest.fixture
async def rabbit(amqp_url: str) -> AsyncIterator[Rabbit]:
    opened = await open_rabbit(amqp_url)
    try:
        yield opened
    finally:
        await close_rabbit(opened)


@contextlib.asynccontextmanager
async def pumped(source: RabbitSource, prefetch: int = 4
                 ) -> AsyncIterator[asyncio.Queue[RabbitDelivery]]:
    """Deliveries of `source` collected by a task, so waiting with a timeout is safe."""
    received: asyncio.Queue[RabbitDelivery] = asyncio.Queue()

    async def pump() -> None:
        async for delivery in source.deliveries(prefetch=prefetch):
            received.put_nowait(delivery)

    task = asyncio.create_task(pump())
    try:
        yield received
    finally:
        await source.stop()
        await asyncio.wait_for(task, 2.0)


def valid(**headers: str) -> Envelope:
    return Envelope(uuid.uuid4(), "Add", b'{"counter": "c-1", "amount": 1}', headers)


def publish_without_message_id(url: str, queue: str) -> None:
    """aiormq gives every message a random ID, so a message without one needs another client
    (pika, installed with testcontainers[rabbitmq])."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().basic_publish("", queue, b"{}", pika.BasicProperties(
            type="Add", delivery_mode=2))
    finally:
        connection.close()


def raw(body: bytes = b"{}", message_id: str | None = None, type: str | None = None,
        headers: dict[str, Any] | None = None) -> aio_pika.Message:
    return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                            message_id=message_id, type=type, headers=headers)


async def test_invalid_messages_are_dead_lettered_and_consumption_goes_on(
    rabbit: Rabbit, amqp_url: str,
) -> None:
    work = rabbit.names.work
    await asyncio.to_thread(publish_without_message_id, amqp_url, work)
    await rabbit.publisher.publish(work, raw(message_id="not-a-uuid", type="Add"))
    await rabbit.publisher.publish(work, raw(message_id=str(uuid.uuid4())))
    await rabbit.publisher.publish(work, raw(b"x" * 65, message_id=str(uuid.uuid4()),
                                             type="Add"))
    good = valid()
    await RabbitDispatcher(rabbit.publisher).dispatch(work, good)
    source = RabbitSource(rabbit.consumer, work, DELAYS, max_body_bytes=64)
    async with pumped(source) as received:
        delivery = await asyncio.wait_for(received.get(), 3.0)
        assert delivery.envelope.message_id == good.message_id
        await delivery.ack()
    assert source.dead_lettered == 4
    dead = await rabbit.drain(rabbit.names.dead_letter, count=4)
    reasons = [str(m.headers[REASON_HEADER]) for m in dead]
    assert reasons[0] == "no message_id"
    assert "is not a UUID" in reasons[1]
    assert reasons[2] == "no type"
    assert "65 bytes exceeds the limit of 64" in reasons[3]
    assert all(m.headers[ENDPOINT_HEADER] == work for m in dead)
    assert all(m.headers[ATTEMPTS_HEADER] == "1" for m in dead)
    assert dead[1].message_id == "not-a-uuid"  # the copy keeps what it had, for inspection


async def test_kept_header_values_become_strings_and_the_rest_is_dropped(rabbit: Rabbit) -> None:
    message_id = uuid.uuid4()
    await rabbit.publisher.publish(rabbit.names.work, raw(
        message_id=str(message_id), type="Add",
        headers={"b": bytearray(b"bytes"), "n": 5, "s": "text", "other": "dropped"}))
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS,
                          kept_headers=("b", "n", "s"))
    async with pumped(source) as received:
        delivery = await asyncio.wait_for(received.get(), 3.0)
        await delivery.ack()
    assert dict(delivery.envelope.headers) == {"b": "bytes", "n": "5", "s": "text"}


async def test_an_oversize_messages_dead_letter_is_clipped_and_its_foreign_headers_dropped(
    rabbit: Rabbit,
) -> None:
    """The security review measured a dead letter 6x its message: every foreign header was
    copied, and the body whole. Now: at most `dead_letter_body_bytes` of the body, with its
    size and SHA-256, and only the protocol's headers, each capped."""
    body = b'{"pad": "' + b"x" * 200_000 + b'"}'
    foreign = {f"h{i}": "y" * 10_000 for i in range(8)}  # within one frame (128 KiB)
    await rabbit.publisher.publish(rabbit.names.work, raw(
        body, message_id=str(uuid.uuid4()), type="Add",
        headers={**foreign, "eo-attempts": "9" * 5000}))
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS,
                          max_body_bytes=65_536, dead_letter_body_bytes=1024)
    async with pumped(source):
        for _ in range(150):
            if source.dead_lettered:
                break
            await asyncio.sleep(0.02)
    assert source.dead_lettered == 1
    (dead,) = await rabbit.drain(rabbit.names.dead_letter)
    headers = dead.headers or {}
    assert dead.body == body[:1024]
    assert headers[BODY_BYTES_HEADER] == str(len(body))
    assert headers[BODY_SHA256_HEADER] == hashlib.sha256(body).hexdigest()
    assert not [k for k in headers if not k.startswith(("eo-", "x-"))]  # x-: the broker's
    assert all(len(str(v)) <= MAX_HEADER_CHARS for v in headers.values())
    sent = len(body) + sum(len(k) + len(v) for k, v in foreign.items()) + 5000
    kept = len(dead.body) + sum(len(str(k)) + len(str(v)) for k, v in headers.items())
    print(f"\nmessage {sent} bytes, its dead letter {kept} bytes")
    assert kept < 4096


async def test_a_full_dead_letter_queue_holds_the_dead_letter_and_pauses_the_source(
    amqp_url: str,
) -> None:
    """A dead-letter queue declared with a byte bound refuses (reject-publish) past it. The
    dead letter then waits, held (never parked elsewhere: 200 refused copies of 900 KB
    cycled through a retry queue before, 174.6 MB of it, issue 24), the source takes no new
    delivery and says so (`dead_letters_blocked`, `dead_letter_queue.full`); once there is
    room the copy goes, the source goes on (`dead_letter_queue.room`), and nothing is lost.
    An invalid message the source refuses itself waits the same way."""
    publisher = RabbitConnection(amqp_url, reconnect_delays_s=(0.1,))
    consumer = RabbitConnection(amqp_url, reconnect_delays_s=(0.1,))
    await publisher.start()
    await consumer.start()
    endpoint = f"it-{uuid.uuid4().hex[:12]}"
    names = await declare(publisher, endpoint, DELAYS, 5, dead_letter_max_bytes=300)
    assert await declare(publisher, endpoint, DELAYS, 5, None) == names  # kept as it is
    rabbit = Rabbit(publisher, consumer, names)
    events = CountingSink()
    try:
        # the queue refuses once it holds more than its bound: the first takes it past
        first, second, third = (Envelope(uuid.uuid4(), "Add", b"{" + b" " * 400 + b"}"),
                                valid(), valid())
        dispatcher = RabbitDispatcher(publisher)
        for envelope in (first, second):
            await dispatcher.dispatch(names.work, envelope)
        source = RabbitSource(consumer, names.work, DELAYS, events=events,
                              dead_letter_body_bytes=10_000, dead_letter_wait_s=0.05)
        async with pumped(source, prefetch=4) as received:
            one = await asyncio.wait_for(received.get(), 3.0)
            await one.dead_letter("refused by the handler", names.work)
            two = await asyncio.wait_for(received.get(), 3.0)
            waiting = asyncio.create_task(two.dead_letter("refused by the handler",
                                                          names.work))
            for _ in range(100):
                if source.dead_letters_blocked:
                    break
                await asyncio.sleep(0.02)
            assert source.dead_letters_blocked
            assert events.total(DEAD_LETTER_QUEUE_FULL) == 1
            await dispatcher.dispatch(names.work, third)  # within the prefetch, yet...
            await asyncio.sleep(0.3)
            assert received.empty()  # ...paused: the third is not taken meanwhile
            assert not waiting.done()
            assert await rabbit.depth(names.dead_letter) == 1
            (drained,) = await rabbit.drain(names.dead_letter)  # an operator makes room
            assert drained.message_id == str(first.message_id)
            await asyncio.wait_for(waiting, 3.0)
            assert not source.dead_letters_blocked
            assert events.total(DEAD_LETTER_QUEUE_ROOM) == 1
            three = await asyncio.wait_for(received.get(), 3.0)  # goes on
            assert three.envelope.message_id == third.message_id
            await three.ack()
            # the source's own refusals wait the same way: the first takes the queue past
            # its bound, the second waits
            await publisher.publish(names.work, raw(b"x" * 400, message_id="not-a-uuid",
                                                    type="Add"))
            await publisher.publish(names.work, raw(b"{}", message_id="neither", type="Add"))
            for _ in range(150):
                if events.total(DEAD_LETTER_QUEUE_FULL) == 2:
                    break
                await asyncio.sleep(0.02)
            assert source.dead_letters_blocked
            assert source.dead_lettered == 1
            await rabbit.drain(names.dead_letter, count=2, wait_s=0.5)
            for _ in range(150):
                if source.dead_lettered == 2:
                    break
                await asyncio.sleep(0.02)
        assert source.dead_lettered == 2
        assert await rabbit.depth(names.work) == 0
        assert [await rabbit.depth(q) for q in names.retries] == [0] * len(DELAYS)  # no parking
    finally:
        await close_rabbit(rabbit)


async def test_dispatch_returns_once_the_broker_confirmed(rabbit: Rabbit) -> None:
    dispatcher = RabbitDispatcher(rabbit.publisher)
    await dispatcher.dispatch(rabbit.names.work, valid())
    assert await rabbit.depth(rabbit.names.work) == 1
    assert dispatcher.published == 1
    with pytest.raises(TransientError, match="unroutable"):
        await dispatcher.dispatch(f"{rabbit.names.work}-missing", valid())
    assert dispatcher.published == 1


async def test_concurrent_publishes_of_one_message_id_keep_their_own_outcomes(
        rabbit: Rabbit) -> None:
    # aiormq matches a returned (unroutable) message to its publish by message ID: the
    # connection lets one publish of an ID at a time in flight, so a routable copy is
    # confirmed and an unroutable one refused, however they interleave
    dispatcher = RabbitDispatcher(rabbit.publisher)
    envelope = valid()
    missing = f"{rabbit.names.work}-missing"
    outcomes = await asyncio.gather(
        *(dispatcher.dispatch(queue, envelope) for _ in range(10)
          for queue in (rabbit.names.work, missing)), return_exceptions=True)
    assert outcomes[0::2] == [None] * 10
    assert all(isinstance(o, TransientError) and "unroutable" in str(o)
               for o in outcomes[1::2])
    assert await rabbit.depth(rabbit.names.work) == 10
    assert rabbit.publisher.publisher.waiting == {}  # nothing kept per message ID afterwards


async def test_a_publish_cancelled_while_waiting_its_turn_leaves_nothing_behind(
        rabbit: Rabbit) -> None:
    dispatcher = RabbitDispatcher(rabbit.publisher)
    envelope = valid()
    first = asyncio.create_task(dispatcher.dispatch(rabbit.names.work, envelope))
    second = asyncio.create_task(dispatcher.dispatch(rabbit.names.work, envelope))
    await asyncio.sleep(0)  # both started: the second waits for the first's confirm
    second.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await second
    assert rabbit.publisher.publisher.waiting == {}
    await dispatcher.dispatch(rabbit.names.work, envelope)  # the ID is free again
    assert await rabbit.depth(rabbit.names.work) == 2


async def test_stop_ends_the_iterator_and_in_flight_deliveries_stay_settleable(
    rabbit: Rabbit,
) -> None:
    await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, valid())
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS)
    deliveries = source.deliveries(prefetch=4)
    delivery = await asyncio.wait_for(anext(deliveries), 3.0)
    rest = asyncio.create_task(anext(deliveries, None))
    await source.stop()
    assert await asyncio.wait_for(rest, 2.0) is None
    await delivery.ack()
    await asyncio.sleep(0.1)  # an ack has no reply: give the broker a moment
    assert await rabbit.depth(rabbit.names.work) == 0


async def test_settling_twice_is_a_no_op(rabbit: Rabbit) -> None:
    await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, valid())
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS)
    async with pumped(source) as received:
        delivery = await asyncio.wait_for(received.get(), 3.0)
        await delivery.ack()
        await delivery.ack()
        await delivery.retry(0.0, "again")
        await delivery.dead_letter("again", rabbit.names.work)
    assert [await rabbit.depth(q) for q in rabbit.names.retries] == [0, 0]
    assert await rabbit.depth(rabbit.names.dead_letter) == 0


async def test_settling_on_a_lost_channel_raises_transient_and_the_broker_redelivers(
    rabbit: Rabbit,
) -> None:
    sent = valid()
    await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, sent)
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS)
    async with pumped(source) as received:
        lost = await asyncio.wait_for(received.get(), 3.0)
        await rabbit.consumer.drop()
        with pytest.raises(TransientError):
            await lost.ack()
        again = await asyncio.wait_for(received.get(), 5.0)
        assert (again.envelope.message_id, again.attempt) == (sent.message_id, 1)
        await again.ack()


async def test_consuming_a_missing_queue_raises_transient(rabbit: Rabbit) -> None:
    source = RabbitSource(rabbit.consumer, f"{rabbit.names.work}-missing", DELAYS)
    with pytest.raises(TransientError, match="consuming"):
        await anext(source.deliveries())
    await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, valid())  # still usable


def test_retry_uses_the_shortest_queue_that_is_long_enough() -> None:
    assert [retry_index((0.05, 0.2, 1.0), d) for d in (0.0, 0.05, 0.1, 0.2, 0.5, 7.0)] == [
        0, 0, 1, 1, 2, 2]
    assert retry_index((1.0, 0.05), 0.5) == 0
    with pytest.raises(ValueError, match="no retry delays"):
        retry_index((), 1.0)


async def test_a_message_that_keeps_killing_consumers_is_dead_lettered_by_the_broker(
    amqp_url: str,
) -> None:
    rabbit = await open_rabbit(amqp_url, delivery_limit=1)
    try:
        sent = valid()
        await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, sent)
        source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS)
        async with pumped(source) as received:
            for _ in range(4):  # delivered, lost; redelivered, lost; then over the limit
                try:
                    await asyncio.wait_for(received.get(), 1.0)
                except TimeoutError:
                    break
                await rabbit.consumer.drop()
        [dead] = await rabbit.drain(rabbit.names.dead_letter)
        assert dead.message_id == str(sent.message_id)
    finally:
        await close_rabbit(rabbit)


# ---------------------------------------------------------------------------------------------
# supervised consumption (issue 15): the source re-creates what the broker or a library lost


async def _underlay_consumers(source: RabbitSource) -> dict[str, Any]:
    assert source.subscription.channel is not None  # the channel the source consumes on now
    underlay: Any = await source.subscription.channel.get_underlay_channel()
    return underlay.consumers  # type: ignore[no-any-return]


async def test_watchdog_recreates_a_consumer_the_broker_no_longer_lists(rabbit: Rabbit) -> None:
    """The consumer vanishes on the broker's side without any notice to the source (cancelled
    from the client's side, behind its back): the watchdog sees the broker list no consumer,
    re-creates it, and the next message is delivered."""
    events = CountingSink()
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS, events=events,
                          watchdog_s=0.5, watchdog_interval_s=0.1)
    await source.start(4)
    async with pumped(source) as received:
        underlay: Any = await source.subscription.channel.get_underlay_channel()  # type: ignore[union-attr]
        await underlay.basic_cancel(source.subscription.tag)
        sent = valid()
        await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, sent)
        delivery = await asyncio.wait_for(received.get(), 5.0)
        assert delivery.envelope.message_id == sent.message_id
        await delivery.ack()
    assert source.restarts == 1
    assert events.counts[(rabbit.names.work, "consumer.restarted")] == 1


async def test_watchdog_recreates_a_consumer_that_receives_but_never_yields(
    rabbit: Rabbit,
) -> None:
    """The failure class of aio-pika issue #231: the broker lists the consumer and delivers to
    it, but nothing reaches the iterator. With one slot, the swallowed delivery stays unacked
    and the next message waits, ready. The watchdog sees ready messages, a free slot and no
    delivery for `watchdog_s`: it closes the channel (the broker requeues the swallowed
    delivery) and consumes again; both messages are delivered."""
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS,
                          watchdog_s=0.5, watchdog_interval_s=0.1)
    received: asyncio.Queue[RabbitDelivery] = asyncio.Queue()

    async def pump() -> None:
        async for delivery in source.deliveries(prefetch=1):
            received.put_nowait(delivery)

    await source.start(1)
    task = asyncio.create_task(pump())
    try:
        consumers = await _underlay_consumers(source)

        async def swallow(_message: Any) -> None:
            return None

        assert source.subscription.tag is not None
        consumers[source.subscription.tag] = swallow  # deliveries vanish inside the client library
        sent = [valid(), valid()]
        for envelope in sent:
            await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, envelope)
        got = []
        for _ in sent:
            delivery = await asyncio.wait_for(received.get(), 5.0)
            got.append(delivery.envelope.message_id)
            await delivery.ack()
        assert sorted(got) == sorted(e.message_id for e in sent)
        assert source.restarts == 1
    finally:
        await source.stop()
        await asyncio.wait_for(task, 2.0)


async def test_a_source_that_cannot_consume_again_raises_broker_unavailable(
    rabbit: Rabbit,
) -> None:
    """The work queue is deleted for good: the source retries, then gives up after the
    connection's give-up time and `deliveries` raises `BrokerUnavailable`."""
    rabbit.consumer.give_up_after_s = 1.0
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS)
    await source.start(1)

    async def first() -> RabbitDelivery:
        return await anext(source.deliveries())

    pending = asyncio.create_task(first())
    await rabbit.publisher.channel.queue_delete(rabbit.names.work)
    with pytest.raises(BrokerUnavailable, match="no consumer"):
        await asyncio.wait_for(pending, 10.0)
    await declare(rabbit.publisher, rabbit.names.work, DELAYS, 5)  # for the teardown


class BuggyChannels(RabbitConnection):
    """A connection whose channels after the first fail with a programming error."""

    opened = 0

    async def open_channel(self, prefetch: int | None = None) -> Any:
        self.opened += 1
        if self.opened > 1:
            raise RuntimeError("a bug opening a channel")
        return await super().open_channel(prefetch)


async def test_a_bug_while_consuming_again_ends_the_deliveries_with_it(
    rabbit: Rabbit, amqp_url: str,
) -> None:
    """A programming error while the source consumes again is not the broker away: it is
    not retried for the connection's give-up time, the deliveries end and raise it."""
    connection = BuggyChannels(amqp_url, reconnect_delays_s=(0.1,), give_up_after_s=60.0)
    await connection.start()
    try:
        source = RabbitSource(connection, rabbit.names.work, DELAYS)
        await source.start(1)

        async def first() -> RabbitDelivery:
            return await anext(source.deliveries())

        pending = asyncio.create_task(first())
        await asyncio.sleep(0.1)
        assert source.subscription.channel is not None
        loop = asyncio.get_running_loop()
        closed = loop.time()
        await source.subscription.channel.close()
        with pytest.raises(RuntimeError, match="a bug opening a channel"):
            await asyncio.wait_for(pending, 5.0)
        assert loop.time() - closed < 2.0  # at once: not when the wait gave up
        assert source.restarts == 0
    finally:
        await connection.close()


async def test_a_delivery_of_a_closed_channel_publishes_no_copy(rabbit: Rabbit) -> None:
    """Retrying or dead-lettering a delivery whose channel closed would publish a copy
    beside the broker's own redelivery: it raises at once and publishes nothing."""
    await RabbitDispatcher(rabbit.publisher).dispatch(rabbit.names.work, valid())
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS)
    async with pumped(source) as received:
        lost = await asyncio.wait_for(received.get(), 3.0)
        await rabbit.consumer.drop()
        with pytest.raises(TransientError, match="channel is closed"):
            await lost.dead_letter("bad", rabbit.names.work)
        again = await asyncio.wait_for(received.get(), 5.0)
        await again.ack()
    assert await rabbit.depth(rabbit.names.dead_letter) == 0


async def test_acks_settled_together_share_frames_and_none_is_lost_or_doubled(
    rabbit: Rabbit,
) -> None:
    # 40 deliveries in flight, settled in shuffled waves while one in the middle is held:
    # the broker must see every ack once (an ack of an unknown tag would close the channel,
    # 406) and none before its delivery was settled (checked by what stays unacked)
    dispatcher = RabbitDispatcher(rabbit.publisher)
    for _ in range(40):
        await dispatcher.dispatch(rabbit.names.work, valid())
    source = RabbitSource(rabbit.consumer, rabbit.names.work, DELAYS)
    async with pumped(source, prefetch=40) as received:
        deliveries = [await asyncio.wait_for(received.get(), 5.0) for _ in range(40)]
        deliveries.sort(key=lambda d: d._message.delivery_tag)  # 1..40
        held, before, after = deliveries[20], deliveries[:20], deliveries[21:]
        rng = random.Random(7)
        rng.shuffle(before)
        rng.shuffle(after)
        for wave in (before, after):  # each wave's first ack goes at once, alone; the
            await asyncio.gather(*(d.ack() for d in wave))  # rest in one frame, or singly
        await held.ack()
        more = valid()  # the channel is still open and consuming
        await dispatcher.dispatch(rabbit.names.work, more)
        last = await asyncio.wait_for(received.get(), 5.0)
        assert last.envelope.message_id == more.message_id
        await last.ack()
        acks = source.subscription.acks
        assert acks is not None
        assert acks.acked == 41
        assert acks.frames == 2 + (1 + 18) + 1 + 1  # before, after (above 21), 21, the last
    await rabbit.consumer.close()  # anything left unacked would be requeued now
    await asyncio.sleep(0.2)
    assert await rabbit.depth(rabbit.names.work) == 0


# ---------------------------------------------------------------------------------------------
# the producer's identity (issue 24: a gateway's deduplication is scoped to it)


@pytest.fixture
def producer_url(amqp_url: str) -> Iterator[str]:
    """The broker as an outside producer of its own (a user this test run made)."""
    with broker_user(amqp_url, this_run("eo-it-producer", "-")) as url:
        yield url


async def _publish_as(url: str, queue: str, message: aio_pika.Message) -> None:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.default_exchange.publish(message, routing_key=queue)
    finally:
        await connection.close()


def _add(amount: int, **properties: Any) -> aio_pika.Message:
    return aio_pika.Message(f'{{"counter": "c-1", "amount": {amount}}}'.encode(),
                            message_id=str(uuid.uuid4()), type="Add", **properties)


async def test_the_producer_is_the_validated_user_id_and_survives_the_services_copies(
    rabbit: Rabbit, producer_url: str,
) -> None:
    """RabbitMQ checks `user_id` against the publishing connection's user, so a validated
    one names the producer; a producer's own `eo-producer` header names nobody; the
    service's copies (published with its `user_id`) keep the producer they carry."""
    work, producer = rabbit.names.work, urlsplit(producer_url).username
    with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="user_id"):
        await _publish_as(producer_url, work, _add(1, user_id="guest"))  # forged: refused
    await _publish_as(producer_url, work, _add(2, user_id=producer,
                                                headers={"eo-producer": "billing"}))
    await _publish_as(producer_url, work, _add(3, headers={"eo-producer": "billing"}))
    source = RabbitSource(rabbit.consumer, work, DELAYS, service_user="guest")
    async with pumped(source) as received:
        signed = await asyncio.wait_for(received.get(), 3.0)
        anonymous = await asyncio.wait_for(received.get(), 3.0)
        await anonymous.ack()
        assert (signed.envelope.producer, anonymous.envelope.producer) == (producer, "")
        assert "eo-producer" not in signed.envelope.headers  # a claim is not kept
        assert "eo-producer" not in anonymous.envelope.headers
        await signed.retry(0.05, "a transient failure")  # published as the service
        again = await asyncio.wait_for(received.get(), 3.0)
        await again.ack()
    assert (again.envelope.message_id, again.envelope.producer, again.attempt) == (
        signed.envelope.message_id, producer, 2)


async def test_a_gateway_that_requires_producers_dead_letters_an_anonymous_message(
    rabbit: Rabbit, producer_url: str,
) -> None:
    work, producer = rabbit.names.work, urlsplit(producer_url).username
    await _publish_as(producer_url, work, _add(1))
    await _publish_as(producer_url, work, _add(2, user_id=producer))
    source = RabbitSource(rabbit.consumer, work, DELAYS, service_user="guest",
                          require_producer=True)
    async with pumped(source) as received:
        delivery = await asyncio.wait_for(received.get(), 3.0)
        await delivery.ack()
    assert delivery.envelope.producer == producer
    (dead,) = await rabbit.drain(rabbit.names.dead_letter)
    assert str(dead.headers[REASON_HEADER]).startswith("no user_id: this gateway takes "
                                                       "messages of authenticated producers")
