"""Per-partition locks inside one process, so its own deliveries don't conflict needlessly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager


class PartitionLocks:
    """One `asyncio.Lock` per partition key, dropped when nobody holds or awaits it.

    Only an optimisation (protocol 3.2): correctness across processes comes from the
    transaction record's optimistic concurrency, never from this lock.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, partition: str) -> AsyncIterator[None]:
        """Hold the lock of `partition` for the duration of the block."""
        lock, users = self._locks.get(partition, (asyncio.Lock(), 0))
        self._locks[partition] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[partition]
            if users == 1:
                del self._locks[partition]
            else:
                self._locks[partition] = (lock, users - 1)

    @asynccontextmanager
    async def hold_many(self, partitions: Iterable[str]) -> AsyncIterator[None]:
        """Hold the locks of all `partitions`, taken in sorted order: two holders of several
        locks never wait for each other in a cycle, and a holder of one never waits."""
        async with AsyncExitStack() as stack:
            for partition in sorted(set(partitions)):
                await stack.enter_async_context(self.hold(partition))
            yield

    def __len__(self) -> int:
        return len(self._locks)
