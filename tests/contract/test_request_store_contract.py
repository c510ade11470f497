"""One contract suite for the HTTP callee's `RequestStore` (protocol 6), run against the memory
adapter and PostgreSQL: create-only PUT, tombstones, a stored request as a token while it is
unanswered, and PUT racing DELETE."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

import pytest

from adapters.memory.request_store import MemoryRequestStore
from adapters.postgres.request_store import PostgresRequestStore
from application.envelope import TOKEN_HEADER, Envelope
from application.ports import PutResult, RequestStore
from tests.contract.adapters import postgres_pool

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def request(request_id: uuid.UUID, body: bytes = b'{"amount": "1.00"}') -> Envelope:
    return Envelope(request_id, "PaymentRequest", body, MappingProxyType({TOKEN_HEADER: "1"}))


class RequestStoreContract:
    """The `RequestStore` contract. An adapter's test class subclasses it and gives `make`,
    the factory hook: a fresh store (a callee endpoint of its own), torn down at the end."""

    def make(self) -> AbstractAsyncContextManager[RequestStore]:
        raise NotImplementedError

    @pytest.fixture
    async def requests(self) -> AsyncIterator[RequestStore]:
        async with self.make() as store:
            yield store

    async def test_put_is_create_only(self, requests: RequestStore) -> None:
        rid = uuid.uuid4()
        assert await requests.put(rid, request(rid)) is PutResult.CREATED
        assert await requests.put(rid, request(rid)) is PutResult.SAME
        assert await requests.put(rid, request(rid, b'{"amount": "2.00"}')) is PutResult.DIFFERENT
        stored = await requests.get(rid)
        assert stored is not None
        assert (stored.message_id, stored.type, stored.body, dict(stored.headers)) == (
            rid, "PaymentRequest", b'{"amount": "1.00"}', {TOKEN_HEADER: "1"})
        assert await requests.count() == 1

    async def test_a_removed_request_is_gone_for_good(self, requests: RequestStore) -> None:
        rid = uuid.uuid4()
        await requests.put(rid, request(rid))
        await requests.remove(rid, T0)
        assert not await requests.known(rid)
        assert await requests.get(rid) is None
        assert await requests.count() == 0
        for body in (b'{"amount": "1.00"}', b'{"amount": "2.00"}'):  # same body or not: 410
            assert await requests.put(rid, request(rid, body)) is PutResult.GONE
        assert not await requests.known(rid)
        await requests.remove(rid, T0 + timedelta(seconds=1))  # idempotent
        assert await requests.put(rid, request(rid)) is PutResult.GONE

    async def test_removing_an_unknown_id_leaves_a_tombstone(self, requests: RequestStore) -> None:
        rid = uuid.uuid4()
        await requests.remove(rid, T0)
        assert await requests.put(rid, request(rid)) is PutResult.GONE
        assert not await requests.known(rid)
        assert await requests.count() == 0

    async def test_a_request_is_a_token_only_while_unanswered(self, requests: RequestStore) -> None:
        rid, other = uuid.uuid4(), uuid.uuid4()
        assert await requests.get(rid) is None
        assert not await requests.exists(rid)
        assert not await requests.known(rid)
        await requests.put(rid, request(rid))
        await requests.put(other, request(other))
        for stored in (rid, other):
            assert await requests.exists(stored)
            assert await requests.known(stored)
            assert (await requests.get(stored)) == request(stored)
        await requests.delete(rid)  # the callee's consume step: mark answered
        assert await requests.get(rid) is None
        assert not await requests.exists(rid)
        assert await requests.known(rid)  # still stored until the caller's DELETE
        assert await requests.exists(other)
        assert await requests.count() == 2
        await requests.delete(rid)  # idempotent
        await requests.delete(uuid.uuid4())  # unknown: no-op
        assert await requests.count() == 2
        assert await requests.put(rid, request(rid)) is PutResult.SAME  # a late PUT retry: 200
        assert await requests.get(rid) is None  # ... and it does not re-open the request

    async def test_count_counts_stored_requests_answered_or_not(
        self, requests: RequestStore) -> None:
        ids = [uuid.uuid4() for _ in range(5)]
        for rid in ids:
            await requests.put(rid, request(rid))
        assert await requests.count() == 5
        await requests.delete(ids[0])
        await requests.delete(ids[1])
        assert await requests.count() == 5
        await requests.remove(ids[0], T0)  # answered, then deleted by the caller
        await requests.remove(ids[2], T0)  # deleted unanswered
        await requests.remove(uuid.uuid4(), T0)  # a tombstone only
        assert await requests.count() == 3
        assert [await requests.known(rid) for rid in ids] == [False, True, False, True, True]

    async def test_purge_drops_old_tombstones_only(self, requests: RequestStore) -> None:
        old, edge, young = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        await requests.remove(old, T0)
        await requests.remove(edge, T0 + timedelta(hours=1))
        await requests.remove(young, T0 + timedelta(hours=2))
        live = uuid.uuid4()
        await requests.put(live, request(live))
        assert await requests.purge_tombstones(T0 + timedelta(hours=1)) == 1  # strictly before
        assert await requests.put(old, request(old)) is PutResult.CREATED  # its window is over
        assert await requests.put(edge, request(edge)) is PutResult.GONE
        assert await requests.put(young, request(young)) is PutResult.GONE
        assert await requests.purge_tombstones(T0 + timedelta(hours=1)) == 0
        assert await requests.purge_tombstones(T0 + timedelta(days=1)) == 2
        assert await requests.known(live)  # requests are not tombstones
        assert await requests.count() == 2

    async def test_concurrent_put_and_remove_never_leave_a_request_behind_a_tombstone(
        self,
        requests: RequestStore,
    ) -> None:
        for round_ in range(40):
            ids = [uuid.uuid4() for _ in range(6)]
            calls = []
            for i, rid in enumerate(ids):
                put, remove = requests.put(rid, request(rid)), requests.remove(rid, T0)
                calls += [put, remove] if (i + round_) % 2 else [remove, put]
            results = await asyncio.gather(*calls)
            puts = [r for r in results if r is not None]
            assert set(puts) <= {PutResult.CREATED, PutResult.GONE}
            for rid in ids:
                # whichever came first, the tombstone wins: no request survives, none comes back
                assert not await requests.known(rid), f"round {round_}: {rid} behind a tombstone"
                assert await requests.get(rid) is None
                assert await requests.put(rid, request(rid)) is PutResult.GONE
        assert await requests.count() == 0


class TestMemoryRequestStore(RequestStoreContract):
    @asynccontextmanager
    async def make(self) -> AsyncIterator[RequestStore]:
        yield MemoryRequestStore()


class TestPostgresRequestStore(RequestStoreContract):
    @asynccontextmanager
    async def make(self) -> AsyncIterator[RequestStore]:
        async with postgres_pool() as pool:  # counts and tombstones are per endpoint
            yield PostgresRequestStore(pool, f"contract-{uuid.uuid4()}")
