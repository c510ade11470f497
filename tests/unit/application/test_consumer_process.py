"""One endpoint's consumer process (application/consumer_process.py) on the memory broker's
source: a graceful stop, its upkeep loops, its settlement counts. On RabbitMQ the same object
runs in `eo consume` (tests/integration) and the sources share a contract
(tests/contract/test_broker_contract.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import cast

import pytest

from adapters.memory.broker import MemoryBroker
from adapters.memory.source import MemorySource
from application.consumer_process import ConsumerProcess
from application.envelope import Envelope
from application.outcome import Outcome
from application.processor import Processor
from application.settlement import Settler
from tests.support.counter import COUNTER, Add
from tests.support.world import World

QUEUE = "counter"


class Blocking:
    """A processor whose deliveries wait for `release` (so a stop finds them in flight)."""

    def __init__(self, inner: Processor) -> None:
        self.inner, self.release, self.started = inner, asyncio.Event(), 0
        self.batches = False

    async def process(self, envelope: Envelope) -> Outcome:
        self.started += 1
        await self.release.wait()
        return await self.inner.process(envelope)


async def _until(holds: Callable[[], bool]) -> None:
    """Wait until `holds()` (2 s at most, then fail)."""
    for _ in range(2000):
        if holds():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never held")


async def _sent(world: World, broker: MemoryBroker, count: int) -> None:
    for n in range(count):
        await broker.dispatch(QUEUE, await world.send(Add("p", 1), uuid.UUID(int=n + 1)))


async def test_a_stop_lets_the_deliveries_in_flight_finish_and_leaves_the_rest() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    blocking = Blocking(world.processor())
    process = ConsumerProcess(QUEUE, Settler(cast(Processor, blocking)),
                              MemorySource(broker, QUEUE, "c1"), 2)
    await _sent(world, broker, 5)
    running = asyncio.create_task(process.run())
    await _until(lambda: blocking.started == 2)  # the prefetch: two in flight
    await process.stop()
    await asyncio.sleep(0.01)
    assert not running.done()  # it waits for those in flight
    blocking.release.set()
    await asyncio.wait_for(running, 2.0)
    # the two in flight and the one the settler took for the next free slot
    assert process.settled() == {Outcome.PROCESSED: 3}
    assert broker.depth(QUEUE) == 2  # the rest stayed in the queue, for the next consumer
    again = ConsumerProcess(QUEUE, Settler(world.processor()),
                            MemorySource(broker, QUEUE, "c2"), 8)
    serving = asyncio.create_task(again.run())
    await _until(broker.idle)
    await again.stop()
    await asyncio.wait_for(serving, 2.0)
    assert again.settled() == {Outcome.PROCESSED: 2}


async def test_the_upkeep_runs_beside_the_consumer_and_ends_with_it() -> None:
    world, broker = World(COUNTER), MemoryBroker()
    rounds, ended = 0, asyncio.Event()

    async def upkeep() -> None:
        nonlocal rounds
        try:
            while True:
                rounds += 1
                await asyncio.sleep(0.001)
        finally:
            ended.set()

    process = ConsumerProcess(QUEUE, Settler(world.processor()),
                              MemorySource(broker, QUEUE, "c1"), 8, [upkeep])
    running = asyncio.create_task(process.run())
    await _until(lambda: rounds >= 3)
    assert not ended.is_set()
    await process.stop()
    await asyncio.wait_for(running, 2.0)
    assert ended.is_set()


async def test_what_the_source_dead_lettered_is_counted_as_dead_lettered() -> None:
    world = World(COUNTER)

    class Rejecting:  # a source that dead-lettered two messages it could not read
        dead_lettered = 2

        async def start(self, prefetch: int) -> None:
            pass

        async def deliveries(self, prefetch: int) -> AsyncIterator[object]:
            return
            yield

        async def stop(self) -> None:
            pass

    process = ConsumerProcess(QUEUE, Settler(world.processor()), Rejecting(), 8)
    await process.run()
    assert process.settled() == {Outcome.DEAD_LETTERED: 2}


async def test_a_stopped_consumer_takes_nothing_and_another_takes_what_comes() -> None:
    """Two consumers of one memory queue, both waiting: the stopped one ends without
    taking the message published next, the other takes it."""
    world, broker = World(COUNTER), MemoryBroker()
    first = ConsumerProcess(QUEUE, Settler(world.processor()),
                            MemorySource(broker, QUEUE, "c1"), 8)
    second = ConsumerProcess(QUEUE, Settler(world.processor()),
                             MemorySource(broker, QUEUE, "c2"), 8)
    tasks = [asyncio.create_task(p.run()) for p in (first, second)]
    await asyncio.sleep(0.01)
    await first.stop()
    await _sent(world, broker, 1)
    await asyncio.wait_for(tasks[0], 2.0)
    await _until(broker.idle)
    await second.stop()
    await asyncio.wait_for(tasks[1], 2.0)
    assert (first.settled(), second.settled()) == ({}, {Outcome.PROCESSED: 1})


def test_a_prefetch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="prefetch 0"):
        ConsumerProcess(QUEUE, Settler(World(COUNTER).processor()),
                        MemorySource(MemoryBroker(), QUEUE, "c1"), 0)
