"""The `DeadLetterStore` contract (application.ports), against memory and PostgreSQL: a
message dead-lettered again is one entry with its history (a copy kept twice is not two
reasons), the filters, one hold at a time and marks only when it ends cleanly, the counts
and the purge."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from adapters.memory.dead_letter_store import MemoryDeadLetterStore
from adapters.postgres.dead_letter_store import PostgresDeadLetterStore
from adapters.system.clock import ManualClock
from application.dead_letter_copies import dead_letter_of
from application.envelope import (
    ATTEMPTS_HEADER,
    BODY_BYTES_HEADER,
    BODY_SHA256_HEADER,
    ORIGIN_ID_HEADER,
    REASON_HEADER,
    TOKEN_HEADER,
)
from application.ports import DeadLetterQuery
from application.records import DeadLetter, DeadLetterStatus
from tests.contract.adapters import postgres_pool


class DeadLetterStoreContract:
    """The contract; an adapter's class gives `make` (a store on `clock`, for endpoints of
    the test's own: `self.endpoint`)."""

    def make(self, clock: ManualClock) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @pytest.fixture
    async def store_and_clock(self) -> AsyncIterator[tuple[Any, ManualClock]]:
        self.endpoint = f"dl-{uuid.uuid4().hex[:10]}"
        clock = ManualClock()
        async with self.make(clock) as store:
            yield store, clock

    def letter(self, clock: ManualClock, reason: str = "rejected by handler: no",
               message_id: uuid.UUID | None = None, body: bytes = b'{"n": 1}',
               endpoint: str | None = None, **headers: str) -> DeadLetter:
        raw = str(message_id or uuid.uuid4())
        return dead_letter_of(endpoint or self.endpoint, raw, "Add", body,
                              {TOKEN_HEADER: "1", REASON_HEADER: reason,
                               ATTEMPTS_HEADER: "3", **headers}, "billing", clock.now())

    async def test_a_message_dead_lettered_again_is_one_entry_with_its_history(
        self, store_and_clock: tuple[Any, ManualClock]
    ) -> None:
        store, clock = store_and_clock
        m = uuid.uuid4()
        first = self.letter(clock, "retries exhausted", m, **{ORIGIN_ID_HEADER: "origin-1"})
        i = await store.add(first)
        assert await store.add(first) == i  # the same copy kept twice: one reason
        clock.advance(timedelta(minutes=5))
        again = self.letter(clock, "rejected by handler: still", m,
                            **{ORIGIN_ID_HEADER: "origin-1"})
        assert await store.add(again) == i
        (kept,) = await store.find(DeadLetterQuery(endpoints=(self.endpoint,)))
        assert [r.reason for r in kept.reasons] == ["retries exhausted",
                                                     "rejected by handler: still"]
        assert (kept.message_id, kept.producer, kept.origin_id) == (m, "billing", "origin-1")
        assert [r.attempt for r in kept.reasons] == [3, 3]
        assert dict(kept.headers) == {TOKEN_HEADER: "1", ORIGIN_ID_HEADER: "origin-1"}
        assert (kept.first_at, kept.last_at) == (clock.now() - timedelta(minutes=5),
                                                 clock.now())
        other = await store.add(self.letter(clock, "x", m, body=b'{"n": 2}'))  # other body
        assert other != i


    async def test_every_copy_of_one_message_is_one_entry_whatever_its_id_or_body(
        self, store_and_clock: tuple[Any, ManualClock]
    ) -> None:
        """Issue 37: a malformed message delivered twice under one message ID was two
        entries (its clipped body gave it no digest), so an operator replayed or discarded
        it twice. Clipped copies, and copies whose message ID is not a UUID, are one entry
        with both reasons; another body under the same ID stays another entry."""
        store, clock = store_and_clock
        m = uuid.uuid4()
        clipped = {BODY_BYTES_HEADER: "9000", BODY_SHA256_HEADER: "ab" * 32}
        first = self.letter(clock, "malformed Add: body: Invalid JSON", m, **clipped)
        assert not first.replayable
        clock.advance(timedelta(seconds=1))
        again = self.letter(clock, "malformed Add: body: Invalid JSON", m, **clipped)
        assert await store.add(first) == await store.add(again)
        (kept,) = await store.find(DeadLetterQuery(endpoints=(self.endpoint,)))
        assert len(kept.reasons) == 2
        other = self.letter(clock, "malformed", m, **{**clipped, BODY_SHA256_HEADER: "cd" * 32})
        assert await store.add(other) != kept.dead_letter_id
        raw = [dead_letter_of(self.endpoint, "order-17", "Add", b"{", {REASON_HEADER: "id"},
                              "billing", clock.now() + timedelta(seconds=s)) for s in (0, 1)]
        assert await store.add(raw[0]) == await store.add(raw[1])
        assert len(await store.find(DeadLetterQuery(endpoints=(self.endpoint,)))) == 3

    async def test_what_a_store_cannot_hold_is_kept_escaped_with_its_bytes(
        self, store_and_clock: tuple[Any, ManualClock]
    ) -> None:
        """Issue 37 (N6): a type, message ID or header holding U+0000 or bytes that are not
        UTF-8 (decoded by the transport as lone surrogates) made PostgreSQL refuse the entry
        on every sweep, and the collector stalled behind it. It is kept escaped, its bytes
        in `originals`, and is not replayable."""
        store, clock = store_and_clock
        bad = "\udcff"
        letter = dead_letter_of(self.endpoint, f"id{bad}\x00", f"Add{bad}", b"\x00{",
                                {REASON_HEADER: "type 'Add\\xff' holds U+0000",
                                 f"eo-{bad}": f"v\x00{bad}", ATTEMPTS_HEADER: "1"},
                                f"p{bad}", clock.now())
        i = await store.add(letter)
        assert await store.add(letter) == i
        (kept,) = await store.find(DeadLetterQuery(endpoints=(self.endpoint,)))
        assert (kept.raw_message_id, kept.type, kept.producer) == (
            "id\\xff\\x00", "Add\\xff", "p\\xff")
        assert dict(kept.headers) == {"eo-\\xff": "v\\x00\\xff"}
        assert kept.body == b"\x00{"
        assert not kept.replayable
        assert dict(kept.originals) == {
            "message_id": b"id\xff\x00", "type": b"Add\xff", "producer": b"p\xff",
            "header name eo-\\xff": b"eo-\xff", "header eo-\\xff": b"v\x00\xff"}

    async def test_find_filters_by_endpoint_reason_age_status_and_ids(
        self, store_and_clock: tuple[Any, ManualClock]
    ) -> None:
        store, clock = store_and_clock
        other = f"{self.endpoint}-other"
        old = await store.add(self.letter(clock, "retries exhausted: Conflict"))
        clock.advance(timedelta(hours=2))
        new = await store.add(self.letter(clock, "rejected by handler: negative amount"))
        mine = await store.add(self.letter(clock, "rejected", endpoint=other))
        both = (self.endpoint, other)

        async def ids(**filters: Any) -> list[int]:
            found = await store.find(DeadLetterQuery(**{"endpoints": both, **filters}))
            return [d.dead_letter_id for d in found]

        assert await ids() == [old, new, mine]
        assert await ids(endpoints=(other,)) == [mine]
        assert await ids(reason="NEGATIVE") == [new]
        assert await ids(before=clock.now() - timedelta(hours=1)) == [old]
        assert await ids(after=clock.now() - timedelta(hours=1)) == [new, mine]
        assert await ids(ids=(new, 999_999_999)) == [new]
        assert await ids(limit=1) == [old]
        async with store.hold(old) as held:
            await held.discarded("alice", "test")
        assert await ids() == [new, mine]  # `dead` by default
        assert await ids(status=DeadLetterStatus.DISCARDED) == [old]
        assert await ids(status=None) == [old, new, mine]

    async def test_one_hold_at_a_time_and_a_mark_only_when_it_ends_cleanly(
        self, store_and_clock: tuple[Any, ManualClock]
    ) -> None:
        store, clock = store_and_clock
        i = await store.add(self.letter(clock))
        async with store.hold(i) as first:
            assert first is not None
            async with store.hold(i) as second:
                assert second is None  # another operator holds it: not waited for
            await first.replayed("alice")
        (kept,) = await store.find(DeadLetterQuery(ids=(i,), status=None))
        assert (kept.status, kept.replays, kept.acted_by, kept.acted_at) == (
            DeadLetterStatus.REPLAYED, 1, "alice", clock.now())

        async def failing_discard() -> None:
            async with store.hold(i) as held:
                await held.discarded("bob", "why")
                raise RuntimeError("the discard failed half way")

        with pytest.raises(RuntimeError):
            await failing_discard()
        (kept,) = await store.find(DeadLetterQuery(ids=(i,), status=None))
        assert kept.status is DeadLetterStatus.REPLAYED  # nothing marked
        async with store.hold(999_999_999) as missing:
            assert missing is None
        await store.add(replace(self.letter(clock), message_id=kept.message_id,
                                digest=kept.digest))  # dead-lettered again after the replay
        (kept,) = await store.find(DeadLetterQuery(ids=(i,), status=None))
        assert kept.status is DeadLetterStatus.DEAD

    async def test_concurrent_holds_of_one_dead_letter_let_one_act(
        self, store_and_clock: tuple[Any, ManualClock]
    ) -> None:
        store, clock = store_and_clock
        i = await store.add(self.letter(clock))
        acted: list[str] = []
        tried: list[str] = []
        every_one_tried = asyncio.Event()

        async def act(name: str) -> None:
            async with store.hold(i) as held:
                tried.append(name)
                if len(tried) == 5:
                    every_one_tried.set()
                if held is not None:  # holds until the others have tried: they overlap
                    await asyncio.wait_for(every_one_tried.wait(), 30)
                    await held.discarded(name, "dup")
                    acted.append(name)

        await asyncio.gather(*(act(f"op{n}") for n in range(5)))
        assert len(acted) == 1

    async def test_counts_waiting_and_purge(
        self, store_and_clock: tuple[Any, ManualClock]
    ) -> None:
        store, clock = store_and_clock
        a = await store.add(self.letter(clock))
        b = await store.add(self.letter(clock))
        no_id = await store.add(replace(self.letter(clock), message_id=None,
                                        raw_message_id="not-a-uuid", digest=None))
        async with store.hold(a) as held:
            await held.replayed("alice")
        counts = await store.counts()
        assert counts[self.endpoint] == {"dead": 2, "replayed": 1}
        waiting = [w for w in await store.waiting() if w[0] == self.endpoint]
        (kept,) = await store.find(DeadLetterQuery(ids=(b,)))
        assert waiting == [(self.endpoint, kept.message_id)]  # no_id has no token to count
        clock.advance(timedelta(days=20))
        assert await store.purge(clock.now() - timedelta(days=14)) >= 1
        left = {d.dead_letter_id for d in await store.find(DeadLetterQuery(
            endpoints=(self.endpoint,), status=None))}
        assert left == {b, no_id}  # `dead` ones are the retention's to discard first


class TestMemoryDeadLetterStore(DeadLetterStoreContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[Any]:
        yield MemoryDeadLetterStore(clock)


class TestPostgresDeadLetterStore(DeadLetterStoreContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[Any]:
        async with postgres_pool() as pool:
            try:
                yield PostgresDeadLetterStore(pool, clock)
            finally:
                await pool.execute("DELETE FROM eo_dead_letter WHERE endpoint LIKE $1",
                                   f"{self.endpoint}%")

