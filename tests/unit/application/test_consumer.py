"""Outcome of deliveries (protocol 7) on the memory broker: ack, retry, dead-letter."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from types import MappingProxyType
from typing import NoReturn

import pytest

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from application.codec import encode
from application.envelope import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
)
from application.errors import PermanentError, TransientError
from application.observability import MESSAGE_DEAD_LETTERED, MESSAGE_RETRIED, CountingSink
from application.outcome import Outcome
from application.settlement import Settler, batches_in_flight
from domain.errors import Rejected
from tests.support.counter import COUNTER, PLAIN_COUNTER, Add
from tests.support.invariants import check
from tests.support.world import World

QUEUE = "counter"
M1, M2 = uuid.UUID(int=1), uuid.UUID(int=2)
FAST = (0.001, 0.002)


async def _take(broker: MemoryBroker, consumer: str = "c1") -> MemoryDelivery:
    """The next delivery of the counter queue for `consumer`, left unsettled."""
    deliveries = broker.consume(QUEUE, consumer)
    try:
        return await asyncio.wait_for(anext(deliveries), 2.0)
    finally:
        await deliveries.aclose()


async def _deliver(broker: MemoryBroker, envelope: Envelope) -> None:
    await broker.dispatch(QUEUE, envelope)


def _consumer(world: World, failpoints: str | None = None, max_attempts: int = 5) -> Settler:
    return Settler(world.processor(failpoints), max_attempts=max_attempts, retry_delays=FAST)


async def _settle_until_done(consumer: Settler, broker: MemoryBroker) -> list[Outcome]:
    """Take and settle deliveries until one is not retried (what a live consumer does)."""
    settlements = []
    while True:
        settlement = await consumer.settle(await _take(broker))
        settlements.append(settlement)
        if settlement is not Outcome.RETRIED:
            return settlements


async def test_processed_delivery_is_acked() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    await _deliver(broker, await world.send(Add("p", 1), M1))
    consumer = _consumer(world)
    assert not broker.idle()
    assert await consumer.settle(await _take(broker)) is Outcome.PROCESSED
    assert broker.idle()
    assert broker.depth(QUEUE) == 0
    assert not broker.dead_letters[QUEUE]
    assert consumer.counts == {Outcome.PROCESSED: 1}


async def test_duplicate_delivery_is_acked() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    envelope = await world.send(Add("p", 1), M1)
    await _deliver(broker, envelope)
    await _deliver(broker, envelope)
    consumer = _consumer(world)
    assert await consumer.settle(await _take(broker)) is Outcome.PROCESSED
    assert await consumer.settle(await _take(broker)) is Outcome.DUPLICATE
    assert broker.idle()
    assert consumer.counts == {Outcome.PROCESSED: 1, Outcome.DUPLICATE: 1}
    assert check(world, {M1}) == []


def _bad(kind: str) -> Envelope:
    token = MappingProxyType({TOKEN_HEADER: "1"})
    if kind == "malformed body":
        return Envelope(M1, "Add", b'{"partition": "p", "amount": "many"}', token)
    if kind == "not json":
        return Envelope(M1, "Add", b"\xff not json", token)
    if kind == "unknown type":
        return Envelope(M1, "Subtract", encode(Add("p", 1)), token)
    return Envelope(M1, "Add", encode(Add("p", 1)), MappingProxyType({}))  # no token header


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("malformed body", "malformed Add: amount"),
        ("not json", "malformed Add"),
        ("unknown type", "unknown message type 'Subtract'"),
        ("missing token header", "no token header"),
    ],
)
async def test_permanent_errors_are_dead_lettered_with_reason_endpoint_and_attempts(
    kind: str, reason: str
) -> None:
    world, broker = World(COUNTER), MemoryBroker()
    envelope = _bad(kind)
    # the sender created the token (claim check)
    await world.tokens.create(world.endpoint.name, [envelope])
    await _deliver(broker, envelope)
    consumer = _consumer(world)
    assert await consumer.settle(await _take(broker)) is Outcome.DEAD_LETTERED
    (dead,) = broker.dead_letters[QUEUE]
    assert dead.message_id == envelope.message_id
    assert dead.body == envelope.body
    assert reason in dead.headers[REASON_HEADER]
    assert dead.headers[ENDPOINT_HEADER] == "counter"
    assert dead.headers[ATTEMPTS_HEADER] == "1"
    # the token stays: a replay is processed normally
    assert await world.tokens.exists(world.endpoint.name, M1)
    assert broker.idle()
    assert consumer.counts == {Outcome.DEAD_LETTERED: 1}
    assert world.events.total(MESSAGE_DEAD_LETTERED) == 1


async def test_a_replayed_dead_letter_is_processed_normally() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    envelope = await world.send(Add("p", 1), M1)
    await _deliver(broker, envelope)
    assert (
        await _consumer(world, "after_handler=raise", max_attempts=1).settle(await _take(broker))
        is Outcome.DEAD_LETTERED
    )
    (dead,) = broker.dead_letters[QUEUE]
    await _deliver(broker, dead)  # replay from the dead-letter queue
    assert await _consumer(world).settle(await _take(broker)) is Outcome.PROCESSED
    assert world.store.partitions["p"].state.total == 1


def _refuse(state: object, message: object, context: object) -> NoReturn:
    raise Rejected("the counter is closed")


def _explode(state: object, message: object, context: object) -> NoReturn:
    raise ZeroDivisionError("division by zero")


@pytest.mark.parametrize(
    ("handle", "reason"),
    [
        (_refuse, "rejected by handler: the counter is closed"),
        (_explode, "handler failed: ZeroDivisionError: division by zero"),
    ],
)
async def test_a_handler_rejection_or_failure_is_dead_lettered_at_once(
    handle: Callable[..., NoReturn], reason: str
) -> None:
    world = World(replace(COUNTER, handle=handle))
    broker = MemoryBroker()
    envelope = await world.send(Add("p", 1), M1)
    await _deliver(broker, envelope)
    consumer = _consumer(world)
    assert await consumer.settle(await _take(broker)) is Outcome.DEAD_LETTERED
    (dead,) = broker.dead_letters[QUEUE]
    assert dead.headers[REASON_HEADER] == reason
    assert dead.headers[ATTEMPTS_HEADER] == "1"
    assert await world.tokens.exists(world.endpoint.name, M1)
    assert world.store.record_count() == 0


async def test_transient_error_is_retried_later_then_processed() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    await _deliver(broker, await world.send(Add("p", 1), M1))
    consumer = _consumer(world, "before_commit=raise@1")
    first = await _take(broker)
    assert first.attempt == 1
    assert await consumer.settle(first) is Outcome.RETRIED
    assert broker.depth(QUEUE) == 0  # not at once: through the delayed-retry queue
    assert not broker.idle()  # a delayed retry is pending
    second = await _take(broker)
    same = ("message_id", "type", "body")
    assert [getattr(second.envelope, f) for f in same] == [getattr(first.envelope, f) for f in same]
    assert second.attempt == 2
    assert second.envelope.header("eo-retry-reason") == "TransientError: failpoint before_commit"
    assert await consumer.settle(second) is Outcome.PROCESSED
    assert broker.idle()
    assert consumer.counts == {Outcome.RETRIED: 1, Outcome.PROCESSED: 1}
    assert world.events.total(MESSAGE_RETRIED) == 1
    await world.quiesce()
    assert check(world, {M1}) == []


class _Recorder:
    """An inner event sink keeping every event with its fields."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def emit(self, event: str, **fields: object) -> None:
        self.events.append((event, fields))


async def test_retry_delays_follow_the_attempt_and_the_last_one_repeats() -> None:
    recorder = _Recorder()
    world, broker = World(COUNTER, events=CountingSink(recorder)), MemoryBroker()
    await _deliver(broker, await world.send(Add("p", 1), M1))
    consumer = Settler(world.processor("before_commit=raise"), 4, retry_delays=(0.001, 0.002))
    settlements = await _settle_until_done(consumer, broker)
    assert settlements[-1] is Outcome.DEAD_LETTERED
    retried = [fields for event, fields in recorder.events if event == MESSAGE_RETRIED]
    assert [(f["attempt"], f["delay_s"]) for f in retried] == [(1, 0.001), (2, 0.002), (3, 0.002)]
    assert all(str(f["reason"]).startswith("TransientError") for f in retried)


@pytest.mark.parametrize("max_attempts", [1, 3])
async def test_transient_on_every_attempt_is_dead_lettered_after_max_attempts(
    max_attempts: int,
) -> None:
    world, broker = World(COUNTER), MemoryBroker()
    await _deliver(broker, await world.send(Add("p", 1), M1))
    consumer = _consumer(world, "before_commit=raise", max_attempts=max_attempts)
    settlements = await _settle_until_done(consumer, broker)
    assert settlements == [Outcome.RETRIED] * (max_attempts - 1) + [Outcome.DEAD_LETTERED]
    (dead,) = broker.dead_letters[QUEUE]
    assert dead.headers[REASON_HEADER].startswith("retries exhausted")
    assert "TransientError: failpoint before_commit" in dead.headers[REASON_HEADER]
    assert dead.headers[ATTEMPTS_HEADER] == str(max_attempts)
    assert await world.tokens.exists(world.endpoint.name, M1)
    assert broker.idle()
    assert sum(consumer.counts.values()) == max_attempts
    assert world.store.partitions["p"].state is None


async def test_an_unexpected_adapter_error_is_retried_not_lost() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    await _deliver(broker, await world.send(Add("p", 1), M1))
    consumer = _consumer(world)
    real_get = world.tokens.get
    calls = 0

    async def flaky_get(endpoint: str, message_id: uuid.UUID) -> Envelope | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("connection reset by peer")
        return await real_get(endpoint, message_id)

    world.tokens.get = flaky_get  # type: ignore[method-assign]
    assert await _settle_until_done(consumer, broker) == [
        Outcome.RETRIED,
        Outcome.PROCESSED,
    ]


async def test_counts_add_up_to_the_deliveries() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    good = [await world.send(Add(f"p{i % 2}", i), uuid.UUID(int=10 + i)) for i in range(4)]
    deliveries = [*good, good[0], good[3], _bad("unknown type")]
    await world.tokens.create(world.endpoint.name, [deliveries[-1]])
    for envelope in deliveries:
        await _deliver(broker, envelope)
    consumer = _consumer(world, "before_commit=raise@2")
    settled = 0
    while not broker.idle():
        await consumer.settle(await _take(broker))
        settled += 1
    assert settled == len(deliveries) + 1  # one retry
    assert sum(consumer.counts.values()) == settled
    assert consumer.counts == {
        Outcome.PROCESSED: 4,
        Outcome.DUPLICATE: 2,
        Outcome.RETRIED: 1,
        Outcome.DEAD_LETTERED: 1,
    }


async def _first(
    n: int, deliveries: AsyncIterator[MemoryDelivery]
) -> AsyncIterator[MemoryDelivery]:
    """The first `n` deliveries of an endless consume iterator, then the end of the stream."""
    try:
        for _ in range(n):
            yield await anext(deliveries)
    finally:
        await deliveries.aclose()


async def test_serve_with_prefetch_settles_everything_and_bounds_concurrency() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    envelopes = [await world.send(Add(f"p{i % 3}", i), uuid.UUID(int=100 + i)) for i in range(12)]
    deliveries = [*envelopes, *envelopes[:4]]  # four duplicates
    for envelope in deliveries:
        await _deliver(broker, envelope)
    consumer = _consumer(world)
    real_process = consumer.processor.process
    in_flight, peak = 0, 0

    async def process(envelope: Envelope) -> Outcome:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.002)
            return await real_process(envelope)
        finally:
            in_flight -= 1

    consumer.processor.process = process  # type: ignore[method-assign]
    stream = _first(len(deliveries), broker.consume(QUEUE, "server"))
    await asyncio.wait_for(consumer.serve(stream, prefetch=3), 5.0)
    assert broker.idle()  # serve waited for the deliveries in flight before returning
    assert consumer.counts == {Outcome.PROCESSED: 12, Outcome.DUPLICATE: 4}
    assert 1 < peak <= 3
    await world.quiesce()
    assert check(world, {e.message_id for e in envelopes}) == []


async def test_serve_raises_the_source_error_after_the_deliveries_in_flight_settled() -> None:
    """A source that fails for good (the broker is gone) ends `serve` with its error, but only
    once every delivery already taken has been settled: nothing is left half-done."""
    world, broker = World(COUNTER), MemoryBroker()
    for i in range(3):
        await _deliver(broker, await world.send(Add("p", i), uuid.UUID(int=200 + i)))
    consumer = _consumer(world)
    real_process = consumer.processor.process

    async def slow(envelope: Envelope) -> Outcome:
        await asyncio.sleep(0.05)
        return await real_process(envelope)

    consumer.processor.process = slow  # type: ignore[method-assign]

    class Gone(TransientError):
        pass

    async def failing() -> AsyncIterator[MemoryDelivery]:
        async for delivery in _first(3, broker.consume(QUEUE, "server")):
            yield delivery
        raise Gone("the broker stayed away")

    with pytest.raises(Gone):
        await asyncio.wait_for(consumer.serve(failing(), prefetch=3), 5.0)
    assert consumer.counts == {Outcome.PROCESSED: 3}
    assert broker.idle()


# --- the memory broker's own semantics -----------------------------------------------------


async def test_unsettled_deliveries_of_a_dropped_consumer_are_redelivered() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    e1, e2 = await world.send(Add("p", 1), M1), await world.send(Add("p", 2), M2)
    await _deliver(broker, e1)
    await _deliver(broker, e2)
    lost = await _take(broker, "a")
    kept = await _take(broker, "b")
    assert broker.depth(QUEUE) == 0
    assert broker.drop_consumer("a") == 1
    assert broker.depth(QUEUE) == 1
    again = await _take(broker, "b")
    assert (again.envelope, again.attempt) == (lost.envelope, 1)
    await lost.ack()  # the dropped consumer's late settlement is ignored
    assert not broker.idle()
    await again.ack()
    await kept.ack()
    assert broker.idle()
    assert broker.drop_consumer("a") == 0


async def test_broker_is_not_idle_while_a_delayed_retry_is_pending() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    await _deliver(broker, await world.send(Add("p", 1), M1))
    delivery = await _take(broker)
    await delivery.retry(0.02, "test")
    assert broker.depth(QUEUE) == 0
    assert not broker.idle()
    await asyncio.sleep(0.05)
    assert broker.depth(QUEUE) == 1
    assert not broker.idle()
    redelivered = await _take(broker)
    assert redelivered.attempt == 2
    await redelivered.ack()
    assert broker.idle()


async def test_a_delivery_is_settled_only_once() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    await _deliver(broker, await world.send(Add("p", 1), M1))
    delivery = await _take(broker)
    await delivery.dead_letter("first", "counter")
    await delivery.retry(0.0, "second")
    await delivery.dead_letter("third", "counter")
    await asyncio.sleep(0.01)
    assert [d.headers[REASON_HEADER] for d in broker.dead_letters[QUEUE]] == ["first"]
    assert broker.depth(QUEUE) == 0
    assert broker.idle()


# --- batches (application/token_batch.py) ---------------------------------------------------


def _batched(world: World, batch_size: int, batch_wait_s: float = 0.0,
             failpoints: str | None = None) -> tuple[Settler, list[int]]:
    """A batching consumer, and the sizes of the batches it hands its processor."""
    consumer = Settler(world.processor(failpoints), retry_delays=FAST, batch_size=batch_size,
                       batch_wait_s=batch_wait_s)
    sizes: list[int] = []
    real = consumer.processor.process_batch

    async def counted(envelopes: list[Envelope]) -> list[Outcome | BaseException]:
        sizes.append(len(envelopes))
        return await real(envelopes)

    consumer.processor.process_batch = counted  # type: ignore[method-assign,assignment]
    return consumer, sizes


async def test_serve_in_batches_settles_each_delivery_by_its_own_outcome() -> None:
    world, broker = World(PLAIN_COUNTER, colocated=True), MemoryBroker()
    good = [await world.send(Add(f"p{i % 3}", i), uuid.UUID(int=300 + i)) for i in range(12)]
    bad = _bad("unknown type")
    await world.tokens.create(world.endpoint.name, [bad])
    deliveries = [*good, *good[:4], bad]
    for envelope in deliveries:
        await _deliver(broker, envelope)
    # the first batch commit fails: that round's messages go singly and are processed
    # there; nothing is retried through the broker
    consumer, sizes = _batched(world, batch_size=5, failpoints="before_commit=raise@1")
    assert consumer.processor.batches
    assert consumer.batches
    assert not Settler(consumer.processor, batch_size=1).batches  # batching turned off
    stream = _first(len(deliveries), broker.consume(QUEUE, "server"))
    await asyncio.wait_for(consumer.serve(stream, prefetch=10), 5.0)
    assert broker.idle()
    assert consumer.counts == {Outcome.PROCESSED: 12, Outcome.DUPLICATE: 4,
                               Outcome.DEAD_LETTERED: 1}
    assert max(sizes) == 5
    assert sum(sizes) == len(deliveries)
    assert [e.message_id for e in broker.dead_letters[QUEUE]] == [bad.message_id]
    world.tokens.discard(world.endpoint.name, bad.message_id)  # a dead letter keeps it
    await world.quiesce()
    assert check(world, {e.message_id for e in good}) == []


@pytest.mark.parametrize(("wait_s", "expected"), [(0.0, [1, 1]), (0.5, [2])])
async def test_a_batch_takes_what_arrives_within_the_batch_wait(
        wait_s: float, expected: list[int]) -> None:
    world, broker = World(PLAIN_COUNTER, colocated=True), MemoryBroker()
    envelopes = [await world.send(Add("p", i), uuid.UUID(int=400 + i)) for i in range(2)]
    for envelope in envelopes:
        await _deliver(broker, envelope)
    consumer, sizes = _batched(world, batch_size=8, batch_wait_s=wait_s)

    async def trickle() -> AsyncIterator[MemoryDelivery]:
        async for delivery in _first(2, broker.consume(QUEUE, "server")):
            yield delivery
            await asyncio.sleep(0.05)  # the second comes 50 ms after the first

    await asyncio.wait_for(consumer.serve(trickle(), prefetch=8), 5.0)
    assert sizes == expected
    assert consumer.counts == {Outcome.PROCESSED: 2}


async def test_a_batchs_worth_of_the_prefetch_waits_so_the_batches_stay_full() -> None:
    """Prefetch 6, batches of 2: two batches in process, two deliveries waiting. Every batch
    is full, because a batch starts only when one of the two ends, and the deliveries that
    waited make it."""
    world, broker = World(PLAIN_COUNTER, colocated=True), MemoryBroker()
    envelopes = [await world.send(Add(f"p{i}", i), uuid.UUID(int=600 + i)) for i in range(12)]
    for envelope in envelopes:
        await _deliver(broker, envelope)
    consumer, sizes = _batched(world, batch_size=2)
    counted, running, most = consumer.processor.process_batch, 0, 0

    async def watched(batch: list[Envelope]) -> list[Outcome | BaseException]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.01)  # the others pile up meanwhile
            return await counted(batch)
        finally:
            running -= 1

    consumer.processor.process_batch = watched  # type: ignore[method-assign,assignment]
    stream = _first(len(envelopes), broker.consume(QUEUE, "server"))
    await asyncio.wait_for(consumer.serve(stream, prefetch=6), 5.0)
    assert (most, batches_in_flight(6, 2)) == (2, 2)
    assert sizes == [2] * 6
    assert consumer.counts == {Outcome.PROCESSED: 12}
    assert [batches_in_flight(p, 50) for p in (1, 50, 100, 149, 150, 200)] == [1, 1, 1, 1, 2, 3]


async def test_an_endpoint_without_a_batched_path_serves_one_by_one() -> None:
    world, broker = World(COUNTER), MemoryBroker()  # general path: no batches
    envelopes = [await world.send(Add("p", i), uuid.UUID(int=500 + i)) for i in range(3)]
    for envelope in envelopes:
        await _deliver(broker, envelope)
    consumer, sizes = _batched(world, batch_size=8)
    assert not consumer.processor.batches
    assert not consumer.batches  # so its default prefetch is 8 (Settings.prefetch_for)
    await asyncio.wait_for(consumer.serve(_first(3, broker.consume(QUEUE, "server")), 8), 5.0)
    assert sizes == []
    assert consumer.counts == {Outcome.PROCESSED: 3}


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_size 0"):
        Settler(World(COUNTER).processor(), batch_size=0)


class _EventLog:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, object]]] = []

    def emit(self, event: str, **fields: object) -> None:
        self.records.append((event, fields))


class _Processor:
    """Ends every delivery with `result` (an outcome, or an error raised)."""

    endpoint, batches = "counter", False

    def __init__(self, result: Outcome | Exception) -> None:
        self.result, self.events = result, _EventLog()

    async def process(self, envelope: Envelope) -> Outcome:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class _Unreachable:
    """A delivery whose channel is gone: every settlement raises `TransientError`."""

    def __init__(self) -> None:
        self.envelope = Envelope(M1, "Add", b"{}", MappingProxyType({}))
        self.attempt = 1

    async def ack(self) -> None:
        raise TransientError("its channel is closed")

    async def retry(self, delay_s: float, reason: str) -> None:
        raise TransientError("its channel is closed")

    async def dead_letter(self, reason: str, endpoint: str, body_limit: int | None = None
                          ) -> None:
        raise TransientError("its channel is closed")

    async def release(self) -> None:
        raise TransientError("its channel is closed")


@pytest.mark.parametrize(("result", "settlement"), [
    (Outcome.PROCESSED, "ack"),
    (TransientError("PUT: connection refused"), "retry"),
    (PermanentError("no such account"), "dead_letter"),
])
async def test_a_failed_settlement_names_what_failed(result: Outcome | Exception,
                                                     settlement: str) -> None:
    # a retry or dead letter that could not be published ends an attempt all the same
    # (the broker redelivers it): the event says so, unlike a lost ack after a commit
    processor = _Processor(result)
    consumer = Settler(processor, retry_delays=FAST)  # type: ignore[arg-type]

    async def one() -> AsyncIterator[_Unreachable]:
        yield _Unreachable()

    await consumer.serve(one())  # type: ignore[arg-type]
    [(_, fields)] = [r for r in processor.events.records
                         if r[0] == "message.settlement_failed"]
    assert fields["settlement"] == settlement
    assert fields["message_id"] == str(M1)
    assert consumer.counts == {Outcome.UNSETTLED: 1}
