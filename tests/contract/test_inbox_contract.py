"""The `Inbox` contract (application/ports/messaging.py), against memory and PostgreSQL: natural IDs
deduplicate adds, claims are disjoint and mark only when they end cleanly, the retention
purge deletes relayed rows only."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from adapters.memory.inbox import MemoryInbox
from adapters.postgres.inbox import PostgresInbox
from adapters.system.clock import ManualClock
from application.envelope import Envelope
from tests.contract.adapters import postgres_pool


def _env(n: int, body: bytes | None = None) -> Envelope:
    return Envelope(uuid.UUID(int=n), "AddItem", body or f'{{"n":{n}}}'.encode())


class InboxContract:
    """The `Inbox` contract. An adapter's test class subclasses it and gives `make`, the
    factory hook: the adapter on `clock`, torn down when the context ends."""

    def make(self, clock: ManualClock) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @pytest.fixture
    async def inbox_and_clock(self) -> AsyncIterator[tuple[Any, ManualClock]]:
        clock = ManualClock()
        async with self.make(clock) as inbox:
            yield inbox, clock

    async def test_add_keeps_one_row_per_natural_id(self, inbox_and_clock: tuple[Any, ManualClock]
                                                    ) -> None:
        inbox, _ = inbox_and_clock
        assert await inbox.add([_env(1), _env(2), _env(2)]) == 2  # a copy inside one add, too
        assert await inbox.add([_env(2), _env(3)]) == 1
        assert await inbox.add([_env(1, b'{"other":1}')]) == 0  # the first body stays
        assert await inbox.add([]) == 0
        assert await inbox.count_pending() == 3
        async with inbox.claim(10) as claim:
            got = {e.message_id: e for e in claim.envelopes}
        assert set(got) == {uuid.UUID(int=n) for n in (1, 2, 3)}
        first = got[uuid.UUID(int=1)]
        assert (first.type, first.body, dict(first.headers)) == ("AddItem", b'{"n":1}', {})

    async def test_claims_oldest_first_and_marks_when_the_claim_ends(
        self,
        inbox_and_clock: tuple[Any, ManualClock],
    ) -> None:
        inbox, clock = inbox_and_clock
        await inbox.add([_env(n) for n in range(1, 4)])
        clock.advance(timedelta(seconds=1))
        await inbox.add([_env(n) for n in range(4, 6)])
        async with inbox.claim(3) as claim:
            assert {e.message_id.int for e in claim.envelopes} == {1, 2, 3}
            await claim.mark_relayed([e for e in claim.envelopes if e.message_id.int < 3])
        assert await inbox.count_pending() == 3
        async with inbox.claim(10) as claim:
            assert {e.message_id.int for e in claim.envelopes} == {3, 4, 5}
        assert await inbox.add([_env(1)]) == 0  # relayed rows still deduplicate a re-run

    async def test_a_claim_ending_with_an_error_marks_nothing(
        self,
        inbox_and_clock: tuple[Any, ManualClock],
    ) -> None:
        inbox, _ = inbox_and_clock
        await inbox.add([_env(1), _env(2)])

        async def crash_before_the_claim_ends() -> None:
            async with inbox.claim(10) as claim:
                await claim.mark_relayed(claim.envelopes)
                raise RuntimeError("crash between publish and the claim's end")

        with pytest.raises(RuntimeError, match="crash"):
            await crash_before_the_claim_ends()
        assert await inbox.count_pending() == 2
        async with inbox.claim(10) as claim:
            assert len(claim.envelopes) == 2

    async def test_concurrent_claims_get_disjoint_rows(
        self, inbox_and_clock: tuple[Any, ManualClock]
                                                       ) -> None:
        inbox, _ = inbox_and_clock
        await inbox.add([_env(n) for n in range(1, 6)])
        async with inbox.claim(2) as first:
            async with inbox.claim(10) as second:
                a = {e.message_id for e in first.envelopes}
                b = {e.message_id for e in second.envelopes}
                assert len(a) == 2
                assert len(b) == 3
                assert not a & b
                await second.mark_relayed(second.envelopes)
            async with inbox.claim(10) as third:  # the first claim still holds its rows
                assert not third.envelopes
        assert await inbox.count_pending() == 2

    async def test_purge_deletes_only_rows_relayed_before_the_cutoff(
        self,
        inbox_and_clock: tuple[Any, ManualClock],
    ) -> None:
        inbox, clock = inbox_and_clock
        await inbox.add([_env(n) for n in range(1, 5)])
        async with inbox.claim(10) as claim:
            await claim.mark_relayed([e for e in claim.envelopes if e.message_id.int < 3])
        clock.advance(timedelta(days=1))
        async with inbox.claim(10) as claim:
            await claim.mark_relayed([e for e in claim.envelopes if e.message_id.int == 3])
        cutoff = clock.now() - timedelta(hours=1)
        assert await inbox.purge_relayed(cutoff) == 2
        assert await inbox.purge_relayed(cutoff) == 0
        assert await inbox.count_pending() == 1  # row 4: pending rows are never purged
        # outside the retention window a natural ID is new again (protocol 4's stated cost)
        assert await inbox.add([_env(1), _env(3)]) == 1

    async def test_a_claim_needs_a_positive_limit(self, inbox_and_clock: tuple[Any, ManualClock]
                                                 ) -> None:
        inbox, _ = inbox_and_clock
        with pytest.raises(ValueError, match="limit"):
            async with inbox.claim(0):
                pass

    async def test_claims_racing_for_the_same_rows_never_share_one(
        self,
        inbox_and_clock: tuple[Any, ManualClock],
    ) -> None:
        inbox, _ = inbox_and_clock
        await inbox.add([_env(n) for n in range(1, 41)])
        seen: list[uuid.UUID] = []

        async def relay() -> None:
            while True:
                async with inbox.claim(3) as claim:
                    if not claim.envelopes:
                        return
                    seen.extend(e.message_id for e in claim.envelopes)
                    await asyncio.sleep(0)
                    await claim.mark_relayed(claim.envelopes)

        await asyncio.gather(relay(), relay(), relay())
        assert sorted(m.int for m in seen) == list(range(1, 41))
        assert await inbox.count_pending() == 0


class TestMemoryInbox(InboxContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[Any]:
        yield MemoryInbox(clock)

    async def test_rows_are_keyed_by_producer_and_natural_id(
        self, inbox_and_clock: tuple[Any, ManualClock]
    ) -> None:
        """No roles in memory: the envelope's producer is taken as given (embedded
        profile)."""
        inbox, _ = inbox_and_clock
        billing, mallory = replace(_env(1), producer="billing"), replace(_env(1), producer="m")
        assert await inbox.add([mallory, billing, billing]) == 2
        async with inbox.claim(10) as claim:
            assert {e.producer for e in claim.envelopes} == {"billing", "m"}
            await claim.mark_relayed([e for e in claim.envelopes if e.producer == "m"])
        async with inbox.claim(10) as claim:
            assert [e.producer for e in claim.envelopes] == ["billing"]


class TestPostgresInbox(InboxContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[Any]:
        async with postgres_pool() as pool:  # an endpoint of its own: the table is shared
            yield PostgresInbox(pool, f"contract-{uuid.uuid4()}", clock)

    async def test_the_producer_is_the_role_that_added_the_row(
        self, inbox_and_clock: tuple[Any, ManualClock]
    ) -> None:
        """Whatever the envelope claims, a row's producer is the database role that inserted
        it (revision 0010's default): a producer cannot write under another's name."""
        inbox, _ = inbox_and_clock
        assert await inbox.add([replace(_env(1), producer="someone-else")]) == 1
        assert await inbox.add([_env(1)]) == 0  # the same role, the same ID: a re-run
        role = await inbox.pool.fetchval("SELECT current_user")
        async with inbox.claim(10) as claim:
            assert [e.producer for e in claim.envelopes] == [role]
