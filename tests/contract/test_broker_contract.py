"""The broker contract (`MessageDispatcher`, `DeliverySource` + `Delivery`), each adapter a
subclass (the memory broker, RabbitMQ): the at-least-once semantics the consumer and the
protocol rely on, and a consumer process that runs on either."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import MappingProxyType

import pytest

from adapters.memory.broker import MemoryBroker
from adapters.memory.source import MemorySource
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.dispatcher import RabbitDispatcher, envelope_of
from adapters.rabbitmq.topology import QueueNames, declare
from application.envelope import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    REASON_HEADER,
    RETRY_REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
)
from application.ports import Delivery, DeliverySource
from tests.support.services import discover

DELAYS = (0.05, 0.2)
QUIET_S = 0.3  # how long "nothing more arrives" is watched


def envelope(**headers: str) -> Envelope:
    return Envelope(uuid.uuid4(), "OrderPlaced", b'{"order": "o-1", "total": "12.50"}',
                    MappingProxyType({TOKEN_HEADER: "1", **headers}))


class Harness:
    """Drives one broker adapter: publish to the endpoint's work queue, take the next
    delivery (a pump task keeps consuming, so a timeout never breaks the iterator), read the
    dead-letter queue, lose the consumer's connection."""

    endpoint: str
    #: Whether a retried delivery carries the retry reason as a header.

    def __init__(self) -> None:
        self._received: asyncio.Queue[Delivery] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None

    def start_pump(self, source: DeliverySource) -> None:
        """Take `source`'s deliveries into the received queue until it ends."""
        self.source = source

        async def pump() -> None:
            async for delivery in source.deliveries(8):
                self._received.put_nowait(delivery)

        self._pump = asyncio.create_task(pump())

    async def stop(self) -> None:
        """Stop the source; returns once its deliveries ended."""
        await self.source.stop()
        assert self._pump is not None
        await asyncio.wait_for(self._pump, 5.0)

    def new_source(self, tag: str) -> DeliverySource:
        """Another consumer's source on the endpoint's work queue."""
        raise NotImplementedError

    async def receive(self, wait_s: float = 3.0) -> Delivery | None:
        try:
            return await asyncio.wait_for(self._received.get(), wait_s)
        except TimeoutError:
            return None

    async def dead_letters(self, count: int, wait_s: float = 3.0) -> list[Envelope]:
        for _ in range(int(wait_s / 0.02)):
            if len(found := await self.dead_letters_now()) >= count:
                return found
            await asyncio.sleep(0.02)
        return await self.dead_letters_now()

    async def publish(self, env: Envelope) -> None:
        raise NotImplementedError

    async def dead_letters_now(self) -> list[Envelope]:
        raise NotImplementedError

    async def lose_connection(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump


class MemoryHarness(Harness):

    def __init__(self) -> None:
        super().__init__()
        self.endpoint = "orders"
        self.broker = MemoryBroker()
        self.start_pump(self.new_source("c1"))

    def new_source(self, tag: str) -> DeliverySource:
        return MemorySource(self.broker, self.endpoint, tag)

    async def publish(self, env: Envelope) -> None:
        await self.broker.dispatch(self.endpoint, env)

    async def dead_letters_now(self) -> list[Envelope]:
        return list(self.broker.dead_letters[self.endpoint])

    async def lose_connection(self) -> None:
        self.broker.drop_consumer("c1")


class RabbitHarness(Harness):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.endpoint = f"contract-{uuid.uuid4().hex[:12]}"
        self.publisher = RabbitConnection(url, reconnect_delays_s=(0.1,))
        self.consumer = RabbitConnection(url, reconnect_delays_s=(0.1,))
        self.dispatcher = RabbitDispatcher(self.publisher)
        self.names: QueueNames | None = None
        self._dead: list[Envelope] = []

    async def start(self) -> None:
        await self.publisher.start()
        self.names = await declare(self.publisher, self.endpoint, DELAYS, 5)
        await self.consumer.start()
        self.start_pump(self.new_source("c1"))

    def new_source(self, tag: str) -> DeliverySource:
        return RabbitSource(self.consumer, self.endpoint, DELAYS)

    async def publish(self, env: Envelope) -> None:
        await self.dispatcher.dispatch(self.endpoint, env)

    async def dead_letters_now(self) -> list[Envelope]:
        queue = await self.publisher.channel.declare_queue(f"{self.endpoint}.dlq", passive=True)
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            self._dead.append(envelope_of(message, 1 << 20))
        return list(self._dead)

    async def lose_connection(self) -> None:
        await self.consumer.drop()

    async def close(self) -> None:
        await self.source.stop()
        await super().close()
        if self.names is not None:
            for name in (self.names.work, *self.names.retries, self.names.dead_letter):
                await self.publisher.channel.queue_delete(name)
        await self.consumer.close()
        await self.publisher.close()


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    services = discover(postgres=False)
    yield services.amqp_url
    services.close()


class BrokerContract:
    """The broker contract (`MessageDispatcher` and `Delivery`): what the consumer relies
    on. An adapter's test class subclasses it and gives `make`, the factory hook: a started
    `Harness` driving that adapter (built with the test's pytest `request`), closed after."""

    def make(self, request: pytest.FixtureRequest) -> AbstractAsyncContextManager[Harness]:
        raise NotImplementedError

    @pytest.fixture
    async def harness(self, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        async with self.make(request) as built:
            yield built

    async def test_a_dispatched_envelope_arrives_identical(self, harness: Harness) -> None:
        sent = envelope(**{"eo-request-url": "http://callee/requests/1"})
        await harness.publish(sent)
        got = await harness.receive()
        assert got is not None
        assert (got.envelope.message_id, got.envelope.type, got.envelope.body) == (
            sent.message_id, sent.type, sent.body)
        assert dict(got.envelope.headers) == dict(sent.headers)
        assert got.attempt == 1
        await got.ack()

    async def test_ack_removes_the_delivery(self, harness: Harness) -> None:
        await harness.publish(envelope())
        got = await harness.receive()
        assert got is not None
        await got.ack()
        assert await harness.receive(QUIET_S) is None

    async def test_retry_redelivers_after_the_delay_as_the_next_attempt(
        self, harness: Harness) -> None:
        sent = envelope()
        await harness.publish(sent)
        first = await harness.receive()
        assert first is not None
        started = time.monotonic()
        await first.retry(DELAYS[0], "TransientError: store unreachable")
        again = await harness.receive()
        assert again is not None
        assert time.monotonic() - started >= DELAYS[0] * 0.8
        assert (again.envelope.message_id, again.envelope.body) == (sent.message_id, sent.body)
        assert again.attempt == 2
        await again.ack()
        assert await harness.receive(QUIET_S) is None

    async def test_a_retried_delivery_carries_the_reason(self, harness: Harness) -> None:
        await harness.publish(envelope())
        first = await harness.receive()
        assert first is not None
        await first.retry(DELAYS[0], "Conflict: partition busy")
        again = await harness.receive()
        assert again is not None
        await again.ack()
        assert again.envelope.header(RETRY_REASON_HEADER) == "Conflict: partition busy"

    async def test_dead_letter_moves_to_the_dead_letter_queue_with_reason_headers(
        self,
        harness: Harness,
    ) -> None:
        sent = envelope()
        await harness.publish(sent)
        got = await harness.receive()
        assert got is not None
        await got.dead_letter("unknown message type OrderPlaced", harness.endpoint)
        [dead] = await harness.dead_letters(1)
        assert (dead.message_id, dead.type, dead.body) == (sent.message_id, sent.type, sent.body)
        assert dead.header(REASON_HEADER) == "unknown message type OrderPlaced"
        assert dead.header(ENDPOINT_HEADER) == harness.endpoint
        assert dead.header(ATTEMPTS_HEADER) == "1"
        assert dead.header(TOKEN_HEADER) == "1"
        assert await harness.receive(QUIET_S) is None

    async def test_an_unsettled_delivery_of_a_lost_connection_is_delivered_again(
        self,
        harness: Harness,
    ) -> None:
        sent = envelope()
        await harness.publish(sent)
        got = await harness.receive()
        assert got is not None
        await harness.lose_connection()
        again = await harness.receive(5.0)
        assert again is not None
        assert (again.envelope.message_id, again.envelope.body) == (sent.message_id, sent.body)
        assert again.attempt == 1  # a redelivery is not a handler attempt
        await again.ack()
        assert await harness.receive(QUIET_S) is None

    async def test_a_stopped_source_ends_and_leaves_the_rest_in_the_queue(
            self, harness: Harness) -> None:
        held, later = envelope(), envelope()
        await harness.publish(held)
        got = await harness.receive()
        assert got is not None
        await harness.stop()  # ends its deliveries (asserted by `stop`)
        await harness.publish(later)
        assert await harness.receive(QUIET_S) is None  # a stopped source takes nothing new
        await got.ack()  # what it yielded before stopping stays settleable
        harness.start_pump(harness.new_source("c2"))
        again = await harness.receive()
        assert again is not None
        assert again.envelope.message_id == later.message_id
        await again.ack()
        assert await harness.receive(QUIET_S) is None  # the acked one is gone

    async def test_copies_with_one_message_id_are_all_delivered(self, harness: Harness) -> None:
        sent = envelope()
        await harness.publish(sent)
        await harness.publish(sent)
        first, second = await harness.receive(), await harness.receive()
        assert first is not None
        assert second is not None
        assert first.envelope.message_id == second.envelope.message_id == sent.message_id
        await first.ack()
        await second.ack()
        assert await harness.receive(QUIET_S) is None


class TestMemoryBroker(BrokerContract):
    @asynccontextmanager
    async def make(self, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        built = MemoryHarness()
        try:
            yield built
        finally:
            await built.close()


class TestRabbitBroker(BrokerContract):
    @asynccontextmanager
    async def make(self, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        built = RabbitHarness(request.getfixturevalue("amqp_url"))
        await built.start()
        try:
            yield built
        finally:
            await built.close()
