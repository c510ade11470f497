"""Per-partition locks inside one process, so its own deliveries don't conflict needlessly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager


class PartitionLocks:
    """One `asyncio.Lock` per partition key, dropped when nobody holds or awaits it.

    Only an optimisation (protocol 3.2): correctness across processes comes from the
    transaction record's optimistic concurrency, never from this lock.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def _enter(self, partition: str) -> asyncio.Lock:
        """The lock of `partition`, counted as used until `_leave`."""
        lock, users = self._locks.get(partition) or (asyncio.Lock(), 0)
        self._locks[partition] = (lock, users + 1)
        return lock

    def _leave(self, partition: str) -> None:
        lock, users = self._locks[partition]
        if users == 1:
            del self._locks[partition]
        else:
            self._locks[partition] = (lock, users - 1)

    def hold(self, partition: str) -> _Held:
        """Hold the lock of `partition` for the duration of the (async) block."""
        return _Held(self, partition)

    @asynccontextmanager
    async def hold_many(self, partitions: Iterable[str]) -> AsyncIterator[None]:
        """Hold the locks of all `partitions`, taken in sorted order: two holders of several
        locks never wait for each other in a cycle, and a holder of one never waits."""
        used: list[tuple[str, asyncio.Lock]] = []
        held = 0
        try:
            for partition in sorted(set(partitions)):
                lock = self._enter(partition)
                used.append((partition, lock))
                await lock.acquire()
                held += 1
            yield
        finally:  # cancelled while waiting for one: the ones before it are released
            for i, (partition, lock) in enumerate(used):
                if i < held:
                    lock.release()
                self._leave(partition)

    def __len__(self) -> int:
        return len(self._locks)


class _Held:
    """The block of `PartitionLocks.hold` (a class, not a generator: one per attempt)."""

    __slots__ = ("_lock", "_locks", "_partition")

    def __init__(self, locks: PartitionLocks, partition: str) -> None:
        self._locks, self._partition = locks, partition

    async def __aenter__(self) -> None:
        self._lock = lock = self._locks._enter(self._partition)
        try:
            await lock.acquire()
        except BaseException:  # cancelled while waiting: not held, no longer waiting
            self._locks._leave(self._partition)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._locks._leave(self._partition)
