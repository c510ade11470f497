"""Per-partition locks of one process (`application.locks.PartitionLocks`): exclusion, no
deadlock between holders of several, and nothing kept once nobody holds or waits."""

from __future__ import annotations

import asyncio

import pytest

from application.locks import PartitionLocks


async def test_a_held_partition_waits_and_the_locks_are_dropped_afterwards() -> None:
    locks, order = PartitionLocks(), []

    async def batch(name: str, partitions: list[str]) -> None:
        async with locks.hold_many(partitions):
            order.append(f"{name} in")
            await asyncio.sleep(0.01)
            order.append(f"{name} out")

    async def single(name: str, partition: str) -> None:
        async with locks.hold(partition):
            order.append(f"{name} in")
            order.append(f"{name} out")

    await asyncio.gather(batch("a", ["p2", "p1", "p1"]), batch("b", ["p1", "p3"]),
                         single("c", "p3"), single("d", "p4"))
    assert order.index("a out") < order.index("b in")  # p1 is shared
    assert order.index("d in") < order.index("a out")  # p4 is not
    assert len(locks) == 0


async def test_holders_of_several_locks_in_opposite_orders_do_not_deadlock() -> None:
    locks = PartitionLocks()

    async def batch(partitions: list[str]) -> None:
        async with locks.hold_many(partitions):
            await asyncio.sleep(0)

    await asyncio.wait_for(asyncio.gather(*(batch(["x", "y", "z"][::step])
                                            for step in (1, -1) * 10)), 2.0)
    assert len(locks) == 0


async def test_cancelled_while_waiting_releases_what_it_took() -> None:
    locks = PartitionLocks()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("b"):
            await release.wait()

    holding = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(locks.hold_many(["a", "b", "c"]).__aenter__())
    await asyncio.sleep(0.01)  # it holds "a" and waits for "b"
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    async with locks.hold_many(["a", "c"]):  # "a" was released
        pass
    release.set()
    await holding
    assert len(locks) == 0
