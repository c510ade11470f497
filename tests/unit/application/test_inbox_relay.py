"""The inbox relay (application/inbox_relay.py) on memory adapters: rows published once per
round under their natural IDs and marked; a crash between publish and mark re-publishes,
and the gateway's outbox deduplication (protocol 4) absorbs the copy; retention purge."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta

import pytest

from adapters.memory.broker import MemoryBroker
from adapters.memory.inbox import MemoryInbox
from adapters.system.clock import ManualClock
from application.envelope import Envelope
from application.errors import Crash, TransientError
from application.inbox_relay import InboxRelay
from application.observability import (
    INBOX_DEAD_LETTERED,
    INBOX_RELAY_FAILED,
    INBOX_RELAYED,
    TRANSACTION_COMMITTED,
    CountingSink,
)
from application.ports import InboxClaim
from tests.support.counters.endpoints import Add
from tests.support.counters.harness import Counters, counters, outside_envelope


def _commands(counts: int) -> list[Envelope]:
    """Three boundary commands (`Add`, distinct powers of two) per counter, under the
    outside producer's own message IDs."""
    out: list[Envelope] = []
    for c in range(counts):
        for i in range(3):
            message_id = uuid.uuid5(uuid.NAMESPACE_URL, f"producer/add/{c}/{i}")
            out.append(outside_envelope(Add(f"c{c}", 2 ** (3 * c + i)), message_id))
    return out


class _CrashingInbox:
    """An inbox whose claims crash right after the relay marked them (before the claim's
    end commits the marks): the relay published, the marks are lost."""

    def __init__(self, inner: MemoryInbox) -> None:
        self.inner = inner

    def claim(self, limit: int) -> AbstractAsyncContextManager[InboxClaim]:
        @asynccontextmanager
        async def crashing() -> AsyncIterator[InboxClaim]:
            async with self.inner.claim(limit) as claim:
                outer = self

                class Marking:
                    envelopes = claim.envelopes

                    async def mark_relayed(self, rows: Sequence[Envelope]) -> None:
                        await claim.mark_relayed(rows)
                        raise Crash(f"relay of {outer.inner} killed before its commit")

                yield Marking()  # type: ignore[misc]

        return crashing()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def _system() -> tuple[Counters, MemoryBroker, CountingSink, ManualClock]:
    system = counters(inbox_batch=4)
    return system, system.broker, system.events, system.clock


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if await condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not reached within {timeout_s} s")


async def _run_gateway(system: Counters, broker: MemoryBroker) -> None:
    """A gateway consumer until every delivery in its queue now is settled."""
    deliveries = broker.depth("front")
    consumer = system.consumer("front")
    task = asyncio.create_task(consumer.serve(broker.consume("front", "gw-0"), 4))

    async def settled() -> bool:
        return sum(consumer.counts.values()) >= deliveries

    await _until(settled)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_relay_publishes_each_pending_row_once_under_its_natural_id() -> None:
    system, broker, events, _ = _system()
    commands = _commands(3)
    assert await system.inbox.add(commands) == 9
    relay = system.system.relay("front")
    assert await relay.drain() == 9  # three rounds of at most 4
    assert await relay.drain() == 0
    assert broker.depth("front") == 9
    assert await system.inbox.count_pending() == 0
    assert events.total(INBOX_RELAYED) == 9
    await _run_gateway(system, broker)
    assert broker.depth("counter") == 9
    # the gateway received them under the producer's IDs: its processed-message rows
    assert {m for _, m in system.store("front").processed_rows} == {c.message_id for c in commands}
    assert await system.tokens.count() == 9
    assert events.total(TRANSACTION_COMMITTED) == 9


async def test_a_crash_between_publish_and_mark_republishes_and_the_gateway_drops_the_copy(
) -> None:
    system, broker, events, _ = _system()
    commands = _commands(2)
    await system.inbox.add(commands)
    crashing = InboxRelay("front", _CrashingInbox(system.inbox), system.broker,
                          events, batch_size=100)  # type: ignore[arg-type]
    with pytest.raises(Crash):
        await crashing.relay_once()
    assert broker.depth("front") == 6  # published, confirmed ...
    assert await system.inbox.count_pending() == 6  # ... and not marked
    await _run_gateway(system, broker)  # the gateway processes the first copies
    # the restarted relay publishes them again
    assert await system.system.relay("front").drain() == 6
    await _run_gateway(system, broker)
    assert events.total(TRANSACTION_COMMITTED) == 6  # one gateway transaction per command
    assert await system.tokens.count() == 6  # one token per command, for the counter
    relayed = broker.depth("counter")
    assert relayed == 12  # a duplicate re-publishes the stored, identical copy (protocol 4)
    copies: dict[uuid.UUID, set[bytes]] = {}
    while broker.depth("counter"):
        delivery = await anext(broker.consume("counter", "probe"))
        copies.setdefault(delivery.envelope.message_id, set()).add(delivery.envelope.body)
        await delivery.ack()
    assert len(copies) == 6
    assert all(len(bodies) == 1 for bodies in copies.values())  # I2: copies identical
    assert sorted(b for (b,) in copies.values()) == sorted(c.body for c in commands)


class _FailingDispatcher:
    """Confirms every dispatch but those of `fail` (a nack: TransientError)."""

    def __init__(self, fail: set[uuid.UUID]) -> None:
        self.fail, self.sent = fail, list[uuid.UUID]()

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        await asyncio.sleep(0)
        if envelope.message_id in self.fail:
            raise TransientError("nack")
        self.sent.append(envelope.message_id)


async def test_a_failed_dispatch_marks_the_confirmed_rows_and_keeps_the_rest_pending() -> None:
    inbox, events = MemoryInbox(ManualClock()), CountingSink()
    commands = _commands(1)
    await inbox.add(commands)
    failing = _FailingDispatcher({commands[1].message_id})
    relay = InboxRelay("front", inbox, failing, events)
    with pytest.raises(TransientError, match="1 of 3 dispatches failed"):
        await relay.relay_once()
    assert await inbox.count_pending() == 1
    failing.fail.clear()
    assert await relay.relay_once() == 1
    assert failing.sent.count(commands[1].message_id) == 1
    assert len(failing.sent) == 3
    assert relay.relayed == 3


async def test_run_outlives_a_failed_round() -> None:
    inbox, events = MemoryInbox(ManualClock()), CountingSink()
    commands = _commands(1)
    await inbox.add(commands)
    failing = _FailingDispatcher({commands[0].message_id})
    task = asyncio.create_task(InboxRelay("front", inbox, failing, events).run(0.01))

    async def failed() -> bool:
        return events.total(INBOX_RELAY_FAILED) > 0

    async def drained() -> bool:
        return await inbox.count_pending() == 0

    await _until(failed)
    failing.fail.clear()
    await _until(drained)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert sorted(failing.sent) == sorted(c.message_id for c in commands)


async def test_the_gateway_sweeper_purges_relayed_rows_after_the_retention_window() -> None:
    system, _, _, clock = _system()
    await system.inbox.add(_commands(2))
    async with system.inbox.claim(3) as claim:
        await claim.mark_relayed(claim.envelopes)
    clock.advance(system.system.tunables.retention + timedelta(seconds=1))
    report = await system.sweeper("front").sweep()
    assert report.purged_inbox == 3
    assert await system.inbox.count_pending() == 3  # pending rows stay, however old
    assert (await system.sweeper("counter").sweep()).purged_inbox == 0


def test_a_relay_needs_a_positive_batch() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        InboxRelay("front", MemoryInbox(ManualClock()), MemoryBroker(), CountingSink(), 0)


async def test_rows_that_cannot_be_relayed_are_dead_lettered_and_the_rest_go_on() -> None:
    """Issue 24: 200 inbox rows that could not be relayed (a 300-character type) blocked the
    relay for good, a valid row behind them was never relayed, and the failures were logged
    at INFO. Now each is dead-lettered with its reason and marked; the valid row goes."""
    system, broker, events, _ = _system()
    bad = [Envelope(uuid.uuid4(), "T" * 300, b'{"counter": "c", "amount": 1}')
           for _ in range(200)]
    await system.inbox.add(bad)
    (valid,) = _commands(1)[:1]
    await system.inbox.add([valid])
    relay = system.system.relay("front")
    assert await relay.drain() == 201
    assert (relay.relayed, relay.dead_lettered) == (1, 200)
    assert broker.depth("front") == 1
    assert await system.inbox.count_pending() == 0
    letters = broker.dead_letters["front"]
    assert len(letters) == 200
    assert letters[0].header("eo-reason") == "type of 300 bytes exceeds the broker's 255"
    assert letters[0].header("eo-type") == "T" * 300
    assert events.total(INBOX_DEAD_LETTERED) == 200


async def test_a_row_the_broker_refuses_itself_is_dead_lettered_not_retried() -> None:
    system, broker, _, _ = _system()
    await system.inbox.add(_commands(1))

    class Refusing:
        async def dispatch(self, destination: str, envelope: Envelope) -> None:
            if envelope.message_id == refused:
                raise ValueError("the client cannot encode this message")
            await broker.dispatch(destination, envelope)

    refused = _commands(1)[1].message_id
    relay = system.system.relay("front")
    relay.dispatcher = Refusing()
    assert await relay.drain() == 3
    (letter,) = broker.dead_letters["front"]
    assert letter.message_id == refused
    assert letter.header("eo-reason") == ("cannot be relayed: ValueError: the client cannot "
                                          "encode this message")
    assert broker.depth("front") == 2
