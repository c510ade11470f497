"""The `StateStream` contract (application/ports/stores.py), against memory and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from adapters.memory.state_stream import MemoryStateStream
from adapters.postgres.state_stream import PostgresStateStream
from adapters.system.clock import ManualClock
from application.errors import Conflict, MessageIdReused, OutsideRetention
from tests.contract.adapters import postgres_pool


@dataclass(frozen=True)
class Counted:
    seen: tuple[str, ...] = ()


def _rec(n: int) -> dict[str, str]:
    return {"now": f"2026-01-01T00:00:0{n}+00:00", "attempt_id": str(uuid.UUID(int=100 + n))}


M = [uuid.UUID(int=i) for i in range(10)]


class StateStreamContract:
    """The `StateStream` contract. An adapter's test class subclasses it and gives `make`,
    the factory hook: a stream of an endpoint of its own on `clock`, torn down at the end."""

    def make(self, clock: ManualClock) -> AbstractAsyncContextManager[object]:
        raise NotImplementedError

    @pytest.fixture
    async def stream_and_clock(self) -> AsyncIterator[tuple[object, ManualClock]]:
        clock = ManualClock()
        async with self.make(clock) as stream:
            yield stream, clock

    async def test_an_empty_partition_loads_as_nothing(
        self, stream_and_clock: tuple[object, ManualClock]
                                                       ) -> None:
        stream, _ = stream_and_clock
        assert await stream.load("p", M[1]) == (None, 0, None)  # type: ignore[attr-defined]

    async def test_load_returns_the_newest_state_or_the_state_just_before_the_entry(
        self,
        stream_and_clock: tuple[object, ManualClock],
    ) -> None:
        s: Any
        s, clock = stream_and_clock
        states = [Counted(("1",)), Counted(("1", "2")), Counted(("1", "2", "3"))]
        for i, state in enumerate(states):
            assert await s.append("p", i, M[i + 1], state, _rec(i + 1)) == i + 1
            clock.advance(timedelta(minutes=1))
        assert await s.load("p", M[9]) == (states[2], 3, None)
        state, version, entry = await s.load("p", M[2])
        assert (state, version) == (states[0], 1)  # really stops before m2's entry
        assert (entry.version, entry.message_id, entry.state) == (2, M[2], states[1])
        assert dict(entry.recorded) == _rec(2)
        state, version, entry = await s.load("p", M[1])
        assert (state, version, entry.version) == (None, 0, 1)
        assert await s.load("q", M[1]) == (None, 0, None)  # partitions are separate

    async def test_append_is_optimistic_and_once_per_message(
        self,
        stream_and_clock: tuple[object, ManualClock],
    ) -> None:
        s: Any = stream_and_clock[0]
        await s.append("p", 0, M[1], Counted(("1",)), _rec(1))
        with pytest.raises(Conflict):
            await s.append("p", 0, M[2], Counted(("2",)), _rec(2))  # stale version
        with pytest.raises(Conflict):
            await s.append("p", 1, M[1], Counted(("1", "1")), _rec(1))  # message already there
        assert await s.append("p", 1, M[2], Counted(("1", "2")), _rec(2)) == 2

    async def test_two_concurrent_appends_at_one_version_commit_once(
        self,
        stream_and_clock: tuple[object, ManualClock],
    ) -> None:
        s: Any = stream_and_clock[0]
        results = await asyncio.gather(
            s.append("p", 0, M[1], Counted(("1",)), _rec(1)),
            s.append("p", 0, M[1], Counted(("1",)), _rec(2)),
            s.append("p", 0, M[2], Counted(("2",)), _rec(3)),
            return_exceptions=True)
        assert sum(1 for r in results if r == 1) == 1
        assert sum(1 for r in results if isinstance(r, Conflict)) == 2
        _state, version, _entry = await s.load("p", M[9])
        assert version == 1

    async def test_a_message_id_is_appended_on_one_partition_only(
        self,
        stream_and_clock: tuple[object, ManualClock],
    ) -> None:
        """The entry claims the message ID for the endpoint (I1): the same ID on another
        partition is another body under that ID, refused at once, also when both appends
        race (PostgreSQL: its unique index decides)."""
        s: Any = stream_and_clock[0]
        await s.append("p", 0, M[1], Counted(("1",)), _rec(1))
        with pytest.raises(MessageIdReused):
            await s.append("q", 0, M[1], Counted(("1",)), _rec(1))
        assert await s.load("q", M[1]) == (None, 0, None)
        results = await asyncio.gather(
            *(s.append(f"r{i}", 0, M[2], Counted(("2",)), _rec(2)) for i in range(4)),
            return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["MessageIdReused"] * 3 + ["int"]

    async def test_truncate_keeps_the_latest_snapshot_and_in_window_predecessors(
        self,
        stream_and_clock: tuple[object, ManualClock],
    ) -> None:
        s: Any
        s, clock = stream_and_clock
        start = clock.now()
        for i in range(1, 5):  # v1..v4 at days 0, 10, 20, 30
            await s.append("p", i - 1, M[i], Counted((str(i),)), _rec(i))
            clock.advance(timedelta(days=10))
        await s.append("q", 0, M[9], Counted(("q",)), _rec(9))  # day 40, alone
        assert await s.truncate(start + timedelta(days=25)) == 2  # v1 and v2 (next older)
        state, version, entry = await s.load("p", M[4])  # inside the window: v3 is kept
        assert (state, version, entry.version) == (Counted(("3",)), 3, 4)
        with pytest.raises(OutsideRetention):  # v3 is kept (v4 inside) but v2, before it, is gone
            await s.load("p", M[3])
        assert (await s.load("p", M[8]))[:2] == (Counted(("4",)), 4)
        assert (await s.load("q", M[8]))[:2] == (Counted(("q",)), 1)
        assert await s.truncate(start + timedelta(days=100)) == 1  # v3; v4 and q stay
        assert (await s.load("p", M[8]))[:2] == (Counted(("4",)), 4)
        assert await s.append("p", 4, M[5], Counted(("5",)), _rec(5)) == 5


class TestMemoryStateStream(StateStreamContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[object]:
        yield MemoryStateStream(clock)


class TestPostgresStateStream(StateStreamContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[object]:
        async with postgres_pool() as pool:
            yield PostgresStateStream(pool, f"contract-{uuid.uuid4()}", Counted, clock)
