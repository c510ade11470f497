"""The contracts of `TransactionalStore` and `TokenStore`, each adapter (memory, PostgreSQL) a
subclass: the semantics the protocol relies on (ports.py)."""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any

import pytest

from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.postgres.request_store import PostgresRequestStore
from adapters.postgres.sql import batch
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.system.clock import ManualClock
from application.envelope import TOKEN_HEADER, Envelope
from application.errors import Conflict
from application.ports import Clear, CommitRequest
from application.records import Kind, ProcessedMessage, SideEffectRecord
from application.side_effects import message_payload
from domain.decisions import Reply
from tests.contract.adapters import postgres_pool
from tests.support.counter import Tally

M, A, B = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


async def _record_rows(store: Any) -> int:
    """Side-effect record rows stored (the memory store counts without a round trip)."""
    count = store.record_count()
    return int(await count if inspect.isawaitable(count) else count)


def rec(attempt: uuid.UUID, key: str, kind: Kind = Kind.BLOB, seq: int = 0,
        partition: str = "p") -> SideEffectRecord:
    return SideEffectRecord(partition, kind, key, M, attempt, seq,
                            MappingProxyType({"destination": "x"}), None)


class TokenStoreContract:
    """The `TokenStore` contract. An adapter's test class subclasses it and gives `make`,
    the factory hook: the token store, torn down at the end."""

    def make(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @pytest.fixture
    async def token_store(self) -> AsyncIterator[Any]:
        async with self.make() as tokens:
            yield tokens

    async def test_tokens_are_idempotent_claim_checks(self, token_store) -> None:
        tokens = token_store
        before = await tokens.count()
        env = Envelope(uuid.uuid4(), "Add", b'{"a": 1}', MappingProxyType({TOKEN_HEADER: "1"}))
        await tokens.create("ledger", [env])
        await tokens.create("ledger", [Envelope(env.message_id, "Other", b"{}")])  # kept
        got = await tokens.get("ledger", env.message_id)
        assert got is not None
        assert (got.message_id, got.type, got.body, dict(got.headers)) == (
            env.message_id, "Add", b'{"a": 1}', {TOKEN_HEADER: "1"})
        assert await tokens.exists("ledger", env.message_id)
        assert await tokens.count() == before + 1
        await tokens.delete("ledger", env.message_id)
        await tokens.delete("ledger", env.message_id)
        assert await tokens.get("ledger", env.message_id) is None
        assert not await tokens.exists("ledger", env.message_id)
        assert await tokens.count() == before

    async def test_a_token_is_seen_and_consumed_only_by_the_endpoint_it_is_addressed_to(
        self, token_store
    ) -> None:
        """A message ID alone reaches no other endpoint's token: the gateway exploit of the
        security review (a producer's message ID equal to a live ledger token's) finds
        nothing to consume."""
        tokens = token_store
        env = Envelope(uuid.uuid4(), "OrderConfirmed", b"{}", MappingProxyType({TOKEN_HEADER: "1"}))
        await tokens.create("ledger", [env])
        await tokens.create("gateway", [Envelope(env.message_id, "PlaceOrder", b"{}")])  # kept
        assert await tokens.get("gateway", env.message_id) is None
        assert not await tokens.exists("gateway", env.message_id)
        await tokens.delete("gateway", env.message_id)
        got = await tokens.get("ledger", env.message_id)
        assert got is not None
        assert got.type == "OrderConfirmed"
        await tokens.delete("ledger", env.message_id)
        assert not await tokens.exists("ledger", env.message_id)


class TransactionalStoreContract:
    """The `TransactionalStore` contract (the semantics the protocol relies on: ports.py). An
    adapter's test class subclasses it and gives the factory hooks: `make` (a store of an
    endpoint of its own on `clock`) and `make_colocated` (a store holding the token table,
    with that token store: protocol 3.2's fast path), each torn down at the end."""

    def make(self, clock: ManualClock) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    def make_colocated(self, clock: ManualClock) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @pytest.fixture
    async def store_and_clock(self) -> AsyncIterator[tuple[Any, ManualClock]]:
        clock = ManualClock()
        async with self.make(clock) as store:
            yield store, clock

    @pytest.fixture
    async def colocated(self) -> AsyncIterator[tuple[Any, Any, ManualClock]]:
        clock = ManualClock()
        async with self.make_colocated(clock) as (store, tokens):
            yield store, tokens, clock

    async def test_a_new_partition_is_idle_at_version_zero(self, store_and_clock) -> None:
        store, _ = store_and_clock
        tr = await store.load_tr("p")
        assert (tr.message_id, tr.attempt_id, tr.version) == (None, None, 0)
        loaded = await store.load("p")
        assert (loaded.state, loaded.tr.version) == (None, 0)
        assert (await store.load_tr("p")).version == 0

    async def test_register_bumps_the_version_and_fences_stale_attempts(
        self, store_and_clock) -> None:
        store, _ = store_and_clock
        await store.load_tr("p")
        r1 = rec(A, f"a/{uuid.uuid4()}")
        assert await store.register(r1, 0) == 1
        assert await store.registration_valid(r1)
        with pytest.raises(Conflict):
            await store.register(rec(B, f"b/{uuid.uuid4()}"), 0)
        tr, records = await store.load_tr_with_records("p")
        assert tr.version == 1
        assert [(r.key, r.attempt_id, dict(r.payload)) for r in records] == [
            (r1.key, A, {"destination": "x"})]

    async def test_concurrent_registrations_at_one_version_admit_exactly_one(
        self, store_and_clock) -> None:
        store, _ = store_and_clock
        await store.load_tr("p")
        results = await asyncio.gather(*(store.register(rec(uuid.uuid4(), f"k/{i}"), 0)
                                         for i in range(5)), return_exceptions=True)
        assert sum(not isinstance(r, BaseException) for r in results) == 1
        assert all(isinstance(r, Conflict) for r in results if isinstance(r, BaseException))

    async def test_commit_is_atomic_and_optimistic(self, store_and_clock) -> None:
        store, clock = store_and_clock
        await store.load_tr("p")
        registered = rec(A, f"blob/{uuid.uuid4()}")
        v = await store.register(registered, 0)
        extra = rec(A, f"http://x/{uuid.uuid4()}", Kind.HTTP_DELETE, seq=1)
        with pytest.raises(Conflict):
            await store.commit(CommitRequest("p", v - 1, Tally(("m",), 1), M, A, [extra]))
        await store.commit(CommitRequest("p", v, Tally(("m",), 1), M, A, [extra],
                                         Reply(200, {"ok": True})))
        tr, records = await store.load_tr_with_records("p")
        assert (tr.message_id, tr.attempt_id, tr.version) == (M, A, v + 1)
        assert tr.committed_at == clock.now()
        assert {r.key for r in records} == {registered.key, extra.key}
        loaded = await store.load("p")
        assert (loaded.state, loaded.tr.version) == (Tally(("m",), 1), v + 1)
        assert await store.stored_reply(M) == Reply(200, {"ok": True})
        assert not await store.registration_valid(registered)  # the re-check sees the commit
        with pytest.raises(Conflict):  # committed: nothing else may commit or register
            await store.commit(CommitRequest("p", v + 1, Tally(), B, B, []))
        with pytest.raises(Conflict):
            await store.register(rec(B, "late"), v + 1)
        assert await store.unfinished_count() == 1

    async def test_concurrent_commits_admit_exactly_one(self, store_and_clock) -> None:
        store, _ = store_and_clock
        await store.load_tr("p")
        attempts = [uuid.uuid4() for _ in range(5)]
        results = await asyncio.gather(
            *(store.commit(CommitRequest("p", 0, Tally((str(a),)), M, a, []))
              for a in attempts), return_exceptions=True)
        assert sum(not isinstance(r, BaseException) for r in results) == 1
        tr = await store.load_tr("p")
        state = (await store.load("p")).state
        assert state == Tally((str(tr.attempt_id),))

    async def test_clear_is_a_compare_and_clear(self, store_and_clock) -> None:
        store, clock = store_and_clock
        await store.load_tr("p")
        loser = rec(B, f"blob/{uuid.uuid4()}")
        winner = rec(A, f"blob/{uuid.uuid4()}", seq=0)
        v = await store.register(loser, 0)
        await asyncio.sleep(0)
        tr = await store.load_tr("p")
        v = await store.register(winner, tr.version)
        await store.commit(CommitRequest("p", v, Tally(), M, A, []))
        tr, records = await store.load_tr_with_records("p")
        due = clock.now() + timedelta(minutes=30)
        assert not await store.clear(Clear("p", tr.version - 1, records, [loser], due))
        assert await store.clear(Clear("p", tr.version, records, [loser], due))
        tr2, left = await store.load_tr_with_records("p")
        assert (tr2.message_id, tr2.version, left) == (None, tr.version + 1, ())
        # a stale finisher
        assert not await store.clear(Clear("p", tr.version, records, [loser], due))
        assert await store.cleanup_count() == 1
        assert await store.due_cleanups(clock.now()) == []
        due_now = await store.due_cleanups(due)
        assert [(c.kind, c.key) for c in due_now] == [(Kind.BLOB, loser.key)]
        await store.drop_cleanups([c.cleanup_id for c in due_now])
        assert await store.cleanup_count() == 0

    async def test_sweeper_queries(self, store_and_clock) -> None:
        store, clock = store_and_clock
        await store.load_tr("old")
        await store.commit(CommitRequest("old", 0, Tally(), M, A, []))
        clock.advance(timedelta(minutes=1))
        assert [t.partition for t in await store.committed_before(clock.now())] == ["old"]
        assert await store.committed_before(clock.now() - timedelta(minutes=2)) == []
        await store.load_tr("idle")
        stale = rec(B, f"blob/{uuid.uuid4()}", partition="idle")
        stale = SideEffectRecord(**{**stale.__dict__, "registered_at": clock.now()})
        await store.register(stale, 0)
        assert await store.abandoned(clock.now()) == []
        clock.advance(timedelta(hours=1))
        [abandoned] = await store.abandoned(clock.now())
        assert (abandoned.partition, abandoned.version) == ("idle", 1)
        assert [r.key for r in abandoned.records] == [stale.key]
        assert await store.take_over(abandoned, clock.now())
        assert not await store.take_over(abandoned, clock.now())  # version moved
        assert (await store.load_tr_with_records("idle"))[1] == ()
        assert await store.cleanup_count() == 1

    async def test_processed_message_rows(self, store_and_clock) -> None:
        store, clock = store_and_clock
        await store.load_tr("p")
        row = ProcessedMessage(M, "p", (MappingProxyType({"message_id": str(B), "type": "T"}),),
                               clock.now(), "ab" * 32)
        await store.commit(CommitRequest("p", 0, Tally(), M, A, [], processed=row))
        got = await store.processed(M)
        assert got is not None
        assert [dict(o) for o in got.outgoing] == [{"message_id": str(B), "type": "T"}]
        assert got.body_sha256 == "ab" * 32  # a known ID with another body is told apart
        tr = await store.load_tr("p")
        await store.clear(Clear("p", tr.version, [], [], clock.now()))
        with pytest.raises(Conflict):  # positive proof: a message ID is processed once
            await store.commit(CommitRequest("p", tr.version + 1, Tally(), M, B, [], processed=row))
        clock.advance(timedelta(days=8))
        assert await store.purge_processed(clock.now() - timedelta(days=7)) == 1
        assert await store.processed(M) is None

    async def test_a_processed_message_row_claims_the_id_for_its_producer(
        self, store_and_clock
    ) -> None:
        """The claim is (producer, message ID) and keeps the message's digest: another
        producer's row under the same ID is another claim (protocol 4, issue 24)."""
        store, clock = store_and_clock

        def row(partition: str, producer: str) -> ProcessedMessage:
            return ProcessedMessage(M, partition, (), clock.now(), "ab" * 32, "cd" * 32,
                                    producer)

        for partition, producer in (("p", "billing"), ("q", "mallory"), ("r", "")):
            await store.load_tr(partition)
            await store.commit(CommitRequest(partition, 0, Tally(), M, A, [],
                                             processed=row(partition, producer)))
        got = await store.processed(M, "billing")
        assert (got.partition, got.digest, got.producer) == ("p", "cd" * 32, "billing")
        assert (await store.processed(M, "mallory")).partition == "q"
        assert (await store.processed(M)).partition == "r"
        assert await store.processed(M, "nobody") is None
        await store.load_tr("s")
        with pytest.raises(Conflict):  # billing's claim is taken: nothing of it commits
            await store.commit(CommitRequest("s", 0, Tally(("x",)), M, B, [],
                                             processed=row("s", "billing")))
        assert (await store.load_tr("s")).message_id is None

    async def test_commit_returns_what_finish_would_read(self, store_and_clock) -> None:
        store, _ = store_and_clock
        await store.load_tr("p")
        loser = rec(B, f"blob/{uuid.uuid4()}")
        v = await store.register(loser, 0)
        extra = rec(A, f"http://x/{uuid.uuid4()}", Kind.HTTP_DELETE)
        committed = await store.commit(CommitRequest("p", v, Tally(("m",)), M, A, [extra]))
        tr, records = await store.load_tr_with_records("p")
        assert committed.version == tr.version
        assert sorted(r.key for r in committed.records) == sorted(r.key for r in records)
        loaded = await store.load("p")
        assert (loaded.tr, loaded.state, loaded.token_exists) == (tr, Tally(("m",)), None)

    @pytest.mark.parametrize("stood_for", [False, True], ids=["record-row", "in-token"])
    async def test_co_located_tokens_join_the_stores_statements(self, colocated,
                                                                 stood_for: bool) -> None:
        """Protocol 3.2's fast path: the token is checked with the TR, created by the commit and
        consumed by the clear, each atomically with the store's own write; with a record row
        to write and delete, and in the plain case where the token stands for the record
        (PostgreSQL runs leaner statements for that one: the guards are the same)."""
        store, tokens, clock = colocated
        me = store.endpoint
        incoming = Envelope(uuid.uuid4(), "Add", b"{}", MappingProxyType({TOKEN_HEADER: "1"}))
        await tokens.create(me, [incoming])
        loaded = await store.load("p", incoming.message_id)
        assert loaded.token_exists is True
        out = Envelope(uuid.uuid4(), "Added", b'{"x": 1}', MappingProxyType({TOKEN_HEADER: "1"}))
        record = replace(rec(A, str(out.message_id), Kind.MESSAGE), in_token=stood_for)
        with pytest.raises(Conflict):  # a refused commit creates no token
            await store.commit(CommitRequest("p", 7, Tally(), incoming.message_id, A, [record],
                                             tokens=[("audit", out)]))
        assert not await tokens.exists("audit", out.message_id)
        committed = await store.commit(CommitRequest(
            "p", loaded.tr.version, Tally(), incoming.message_id, A, [record],
            tokens=[("audit", out)]))
        assert await tokens.exists("audit", out.message_id)  # addressed to its destination
        assert not await tokens.exists(me, out.message_id)
        assert not await store.clear(Clear("p", committed.version - 1, committed.records, [],
                                     clock.now(), consume=incoming.message_id))
        assert await tokens.exists(me, incoming.message_id)  # a fenced-out clear consumes nothing
        assert await store.clear(Clear("p", committed.version, committed.records, [], clock.now(),
                                 consume=incoming.message_id))
        assert not await tokens.exists(me, incoming.message_id)
        assert (await store.load("p", incoming.message_id)).token_exists is False
        await tokens.delete("audit", out.message_id)

    async def test_co_located_tokens_of_another_endpoint_are_neither_seen_nor_consumed(
        self, colocated
    ) -> None:
        store, tokens, clock = colocated
        theirs = Envelope(uuid.uuid4(), "Add", b"{}", MappingProxyType({TOKEN_HEADER: "1"}))
        await tokens.create("someone-else", [theirs])
        await store.load_tr("p")
        loaded = await store.load("p", theirs.message_id)
        assert loaded.token_exists is False
        committed = await store.commit(CommitRequest("p", loaded.tr.version, Tally(),
                                                     theirs.message_id, A))
        assert await store.clear(Clear("p", committed.version, committed.records, [], clock.now(),
                                 consume=theirs.message_id))
        assert await tokens.exists("someone-else", theirs.message_id)
        await tokens.delete("someone-else", theirs.message_id)


    # --- the batched token path's statements (one per step for many partitions) ----------

    async def test_load_many_is_load_for_each_partition(self, colocated) -> None:
        store, tokens, _ = colocated
        me = store.endpoint
        mine, known = (Envelope(uuid.uuid4(), "Add", f'{{"n": {n}}}'.encode(),
                                MappingProxyType({TOKEN_HEADER: "1"})) for n in (1, 2))
        theirs = Envelope(uuid.uuid4(), "Add", b"{}", MappingProxyType({TOKEN_HEADER: "1"}))
        await tokens.create(me, [mine, known])
        await tokens.create("audit", [theirs])
        await store.load_tr("old")
        await store.load_tr("known")
        await store.commit(CommitRequest("old", 0, Tally(("m",), 1), M, A))
        partitions = ["new", "old", "other", "known", "theirs"]
        loaded = await store.load_many(partitions, [mine.message_id, uuid.uuid4(), None,
                                                    known.message_id, theirs.message_id])
        assert [(x.tr.partition, x.tr.version, x.token_exists) for x in loaded] == [
            ("new", 0, True), ("old", 1, False), ("other", 0, None), ("known", 0, True),
            ("theirs", 0, False)]
        assert (loaded[1].tr.message_id, loaded[1].state) == (M, Tally(("m",), 1))
        assert loaded[0].state is None
        # the claim checks, read with the TRs (only those addressed to this endpoint)
        assert [x.token for x in loaded] == [mine, None, None, known, None]
        assert [x.tr for x in loaded] == [await store.load_tr(p) for p in partitions[:4]] + [
            loaded[4].tr]
        await tokens.delete(me, mine.message_id)
        await tokens.delete(me, known.message_id)
        await tokens.delete("audit", theirs.message_id)

    async def test_concurrent_first_loads_of_new_partitions_each_read_them_all(
        self, colocated
    ) -> None:
        """Batches creating the same partitions at once: whichever inserts a TR, every batch
        reads every partition (a row created by a concurrent statement is read again)."""
        store, _, _ = colocated
        partitions = [f"new-{i}" for i in range(20)]
        loads = await asyncio.gather(*(store.load_many(order, [None] * len(order))
                                       for order in (partitions, partitions[::-1]) * 3))
        for loaded in loads:
            assert sorted((x.tr.partition, x.tr.version, x.tr.message_id) for x in loaded) == [
                (p, 0, None) for p in sorted(partitions)]

    async def test_commit_many_guards_each_partition_on_its_own(self, colocated) -> None:
        store, tokens, _ = colocated
        for p in ("a", "b", "c"):
            await store.load_tr(p)
        await store.commit(CommitRequest("c", 0, Tally(), M, A))  # c has a pending commit
        outs = [Envelope(uuid.uuid4(), "Added", b'{"n": 1}', MappingProxyType({TOKEN_HEADER: "1"}))
                for _ in range(3)]
        loser = rec(B, f"blob/{uuid.uuid4()}", partition="a")
        v = await store.register(loser, 0)
        requests = [
            CommitRequest(p, version, Tally((p,), 1), uuid.uuid4(), A,
                          [rec(A, str(out.message_id), Kind.MESSAGE, partition=p)],
                          tokens=[("audit", out)])
            for p, version, out in (("a", v, outs[0]), ("b", 5, outs[1]), ("c", 1, outs[2]))]
        done = await store.commit_many(requests)
        assert done[1] is None
        assert done[2] is None
        assert done[0] is not None
        tr, records = await store.load_tr_with_records("a")
        assert (tr.message_id, tr.version) == (requests[0].message_id, done[0].version)
        assert sorted(r.key for r in done[0].records) == sorted(r.key for r in records)
        assert {r.key for r in records} == {loser.key, str(outs[0].message_id)}
        assert (await store.load("a")).state == Tally(("a",), 1)
        # the refused partitions wrote nothing: no state, no record, no token
        assert (await store.load("b")).tr.version == 0
        assert (await store.load_tr_with_records("b"))[1] == ()
        assert (await store.load_tr("c")).attempt_id == A
        assert [await tokens.exists("audit", o.message_id) for o in outs] == [True, False, False]
        await tokens.delete("audit", outs[0].message_id)
        assert await store.commit_many([]) == []

    async def test_records_that_outgoing_tokens_stand_for_are_read_back_from_them(
        self, colocated
    ) -> None:
        """A co-located commit writes no row for a record `in_token`: the transaction record
        keeps the message's ID and seq, and the record is read back from its token while the
        transaction is committed and the token exists (a token its receiver consumed was
        delivered: nothing is left to publish)."""
        store, tokens, clock = colocated
        outs = [Envelope(uuid.uuid4(), "Added", f'{{"n": {n}}}'.encode(),
                         MappingProxyType({TOKEN_HEADER: "1"})) for n in range(3)]

        def held(partition: str, seq: int, out: Envelope) -> SideEffectRecord:
            return SideEffectRecord(partition, Kind.MESSAGE, str(out.message_id), M, A, seq,
                                    message_payload("audit", out), clock.now(), in_token=True)

        plain = SideEffectRecord("a", Kind.MESSAGE, str(uuid.uuid4()), M, A, 0,
                                 MappingProxyType({"destination": "ledger"}), clock.now())
        with pytest.raises(ValueError, match="without their token"):
            CommitRequest("a", 0, Tally(), M, A, [held("a", 1, outs[0])])
        await store.load_tr("a")
        await store.load_tr("b")
        committed = await store.commit(CommitRequest(
            "a", 0, Tally(), M, A, [plain, held("a", 1, outs[0]), held("a", 2, outs[1])],
            tokens=[("audit", outs[0]), ("audit", outs[1])]))
        [many] = await store.commit_many([CommitRequest(
            "b", 0, Tally(), M, A, [held("b", 0, outs[2])], tokens=[("audit", outs[2])])])
        assert many is not None
        assert await _record_rows(store) == 1  # the plain one: tokens stand for the others

        def seen(records: Sequence[SideEffectRecord]) -> list[tuple[Any, ...]]:
            return sorted((x.kind, x.key, x.seq, dict(x.payload), x.in_token, x.incoming_id,
                           x.attempt_id) for x in records)

        tr, records = await store.load_tr_with_records("a")
        assert seen(records) == seen(committed.records) == seen(
            [plain, held("a", 1, outs[0]), held("a", 2, outs[1])])
        assert all(x.registered_at == tr.committed_at for x in records if x.in_token)
        assert seen((await store.load_tr_with_records("b"))[1]) == seen([held("b", 0, outs[2])])
        await tokens.delete("audit", outs[0].message_id)  # its receiver consumed it
        assert seen((await store.load_tr_with_records("a"))[1]) == seen(
            [plain, held("a", 2, outs[1])])
        due = clock.now() + timedelta(minutes=30)
        assert await store.clear(Clear("a", committed.version, committed.records, [], due))
        assert (await store.load_tr_with_records("a"))[1] == ()
        assert await _record_rows(store) == 0
        assert await tokens.exists("audit", outs[1].message_id)  # the receiver's now
        for out in outs[1:]:
            await tokens.delete("audit", out.message_id)

    async def test_clear_many_compares_and_clears_each_partition(self, colocated) -> None:
        store, tokens, clock = colocated
        me = store.endpoint
        incoming = [Envelope(uuid.uuid4(), "Add", b"{}", MappingProxyType({TOKEN_HEADER: "1"}))
                    for _ in range(2)]
        await tokens.create(me, incoming)
        committed = []
        for p, env in zip(("a", "b"), incoming, strict=True):
            await store.load_tr(p)
            loser = rec(B, f"blob/{uuid.uuid4()}", partition=p)
            v = await store.register(loser, 0)
            committed.append((await store.commit(CommitRequest(p, v, Tally(), env.message_id,
                                                               A)), loser))
        due = clock.now() + timedelta(minutes=30)
        (ca, loser_a), (cb, loser_b) = committed
        cleared = await store.clear_many([
            Clear("a", ca.version, ca.records, [loser_a], due, incoming[0].message_id),
            Clear("b", cb.version - 1, cb.records, [loser_b], due, incoming[1].message_id)])
        assert cleared == [True, False]  # b: a stale version, fenced out
        assert not await tokens.exists(me, incoming[0].message_id)
        assert await tokens.exists(me, incoming[1].message_id)  # nothing consumed for b
        assert (await store.load_tr_with_records("a"))[1] == ()
        tr_b, records_b = await store.load_tr_with_records("b")
        assert tr_b.message_id == incoming[1].message_id
        assert len(records_b) == 1
        assert [(c.kind, c.key) for c in await store.due_cleanups(due)] == [
            (Kind.BLOB, loser_a.key)]
        assert await store.clear_many([]) == []
        await tokens.delete(me, incoming[1].message_id)

    async def test_concurrent_batches_over_the_same_partitions_never_deadlock(
        self, colocated
    ) -> None:
        store, _, _ = colocated
        partitions = [f"p{i}" for i in range(8)]
        for p in partitions:
            await store.load_tr(p)

        async def batch(order: list[str]) -> list[Any]:
            return await store.commit_many([CommitRequest(p, 0, Tally((p,)), uuid.uuid4(),
                                                          uuid.uuid4()) for p in order])

        orders = [partitions, partitions[::-1], partitions[3:] + partitions[:3]]
        results = await asyncio.gather(*(batch(order) for order in orders))
        won = Counter(p for order, done in zip(orders, results, strict=True)
                      for p, x in zip(order, done, strict=True) if x is not None)
        assert won == dict.fromkeys(partitions, 1)  # each partition committed once


class TestMemoryTokenStore(TokenStoreContract):
    @asynccontextmanager
    async def make(self) -> AsyncIterator[Any]:
        yield MemoryTokenStore()


class TestPostgresTokenStore(TokenStoreContract):
    @asynccontextmanager
    async def make(self) -> AsyncIterator[Any]:
        async with postgres_pool() as pool:
            yield PostgresTokenStore(pool)


class TestMemoryTransactionalStore(TransactionalStoreContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[Any]:
        yield MemoryTransactionalStore(clock)

    @asynccontextmanager
    async def make_colocated(self, clock: ManualClock) -> AsyncIterator[Any]:
        tokens = MemoryTokenStore()
        yield MemoryTransactionalStore(clock, tokens, f"contract-{uuid.uuid4()}"), tokens


class TestPostgresTransactionalStore(TransactionalStoreContract):
    @asynccontextmanager
    async def make(self, clock: ManualClock) -> AsyncIterator[Any]:
        async with postgres_pool() as pool:  # an endpoint of its own: the tables are shared
            yield PostgresTransactionalStore(pool, f"contract-{uuid.uuid4()}", Tally, clock)

    @asynccontextmanager
    async def make_colocated(self, clock: ManualClock) -> AsyncIterator[Any]:
        async with postgres_pool() as pool:
            store = PostgresTransactionalStore(pool, f"contract-{uuid.uuid4()}", Tally, clock,
                                               holds_tokens=True)
            yield store, PostgresTokenStore(pool)

    async def test_a_session_holds_one_connection_for_its_task_only(self) -> None:
        """On a pool of two connections, one of them taken: the task in `session()` makes
        its load, commit and clear on the other, which it holds, and so do the other stores
        of that pool (a token store, a request store: without the session sharing it, its
        own second call would wait for the pool for ever), while a task it creates does not
        share it (two statements at once on one connection fail) and waits until the session
        ends."""
        clock = ManualClock()
        async with postgres_pool(max_size=2) as pool, pool.acquire():
            store = PostgresTransactionalStore(pool, f"contract-{uuid.uuid4()}", Tally, clock)
            async with asyncio.timeout(10):
                async with store.session():
                    loaded = await store.load("p")
                    assert not await PostgresTokenStore(pool).exists(store.endpoint, M)
                    assert not await PostgresRequestStore(pool, store.endpoint).known(M)
                    other = asyncio.ensure_future(store.load_tr("q"))
                    committed = await store.commit(CommitRequest(
                        "p", loaded.tr.version, Tally(("m",)), uuid.uuid4(), uuid.uuid4()))
                    await asyncio.sleep(0.2)
                    assert not other.done()  # the only free connection is this task's
                    assert await store.clear(Clear("p", committed.version, (), (),
                                                   clock.now()))
                assert (await other).version == 0
                assert (await store.load_tr("p")).version == committed.version + 1

    async def test_sessions_leave_one_connection_to_the_others(self) -> None:
        """Of a pool of three connections, sessions hold two at most: a third session's
        statements take turns on the pool, so they go on while the two holders wait (on
        S3, say), and so do those of a task in no session."""
        clock = ManualClock()
        async with postgres_pool(max_size=3) as pool:
            store = PostgresTransactionalStore(pool, f"contract-{uuid.uuid4()}", Tally, clock)
            holding, done = asyncio.Event(), asyncio.Event()

            async def holder() -> None:
                async with store.session():
                    await store.load_tr("h")
                    holding.set()
                    await done.wait()

            holders = [asyncio.ensure_future(holder()) for _ in range(2)]
            try:
                async with asyncio.timeout(10):
                    await holding.wait()
                    await asyncio.sleep(0.1)
                    async with store.session():  # holds nothing: the last one is shared
                        async with asyncio.TaskGroup() as group:
                            for p in "abc":
                                group.create_task(store.load_tr(p))
                        assert (await store.load("p")).tr.version == 0
            finally:
                done.set()
                await asyncio.gather(*holders)

    async def test_batches_lock_in_partition_order_so_they_cannot_deadlock(self) -> None:
        """A batch listing its partitions in descending order waits first for p7 (held
        here), then an ascending one takes p0-p6 and waits for p7. Were rows locked in list
        order, the first would then wait for p6 and PostgreSQL would abort one (deadlock)."""
        clock = ManualClock()
        async with self.make(clock) as store:
            partitions = [f"p{i}" for i in range(8)]
            for p in partitions:
                await store.load_tr(p)

            def batch(order: list[str]) -> Any:
                return store.commit_many([CommitRequest(p, 0, Tally((p,)), uuid.uuid4(),
                                                        uuid.uuid4()) for p in order])

            async with store.pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT 1 FROM eo_transaction_record WHERE endpoint = $1 "
                                   "AND partition_key = 'p7' FOR UPDATE", store.endpoint)
                descending = asyncio.ensure_future(batch(partitions[::-1]))
                await asyncio.sleep(0.3)
                ascending = asyncio.ensure_future(batch(partitions))
                await asyncio.sleep(0.3)
            results = await asyncio.gather(descending, ascending)  # no TransientError
            won = Counter(p for order, done in zip((partitions[::-1], partitions), results,
                                                   strict=True)
                          for p, x in zip(order, done, strict=True) if x is not None)
            assert won == dict.fromkeys(partitions, 1)

    @pytest.mark.parametrize("plan", ["force_custom_plan", "force_generic_plan"])
    async def test_batch_statements_look_rows_up_by_index_whatever_the_statistics(
        self, plan: str
    ) -> None:
        """The batch's statements read, lock and write each partition's row by an index
        lookup (then by its ctid), never by scanning every transaction record or token: on
        a table without statistics (autovacuum off, just truncated) a plain join of the
        request to the table was planned as a hash join over a sequential scan, whose cost
        grows with the number of partitions. Plans only: nothing is executed."""
        clock = ManualClock()
        async with self.make_colocated(clock) as (store, _):
            await store.pool.execute(
                "INSERT INTO eo_transaction_record (endpoint, partition_key) "
                "SELECT $1, 'p' || g FROM generate_series(1, 2000) AS g", store.endpoint)
            n, parts = 30, [f"p{i}" for i in range(1, 31)]
            ids = [uuid.uuid4() for _ in parts]
            statements = {
                "LOAD_MANY": (batch.LOAD_MANY, [store.endpoint, parts, ids]),
                "INSERT_LOAD_MANY": (batch.INSERT_LOAD_MANY, [store.endpoint, parts, ids]),
                "COMMIT_MANY": (batch.COMMIT_MANY, [
                    store.endpoint, parts, [0] * n, [{}] * n, ids, ids, clock.now(),
                    *[[]] * 8, *[[]] * 6, [None] * n, [None] * n]),
                "CLEAR_MANY": (batch.CLEAR_MANY, [
                    store.endpoint, parts, [1] * n, ids, *[[]] * 3, *[[]] * 5]),
            }
            async with store.pool.acquire() as conn:
                await conn.execute(f"SET plan_cache_mode = {plan}")
                try:
                    for name, (text, args) in statements.items():
                        [explained] = json.loads(await conn.fetchval(
                            f"EXPLAIN (FORMAT JSON) {text}", *args))
                        scans = [(node["Node Type"], node.get("Relation Name"))
                                 for node in _plan_nodes(explained["Plan"])]
                        assert not [s for s in scans if s[0] in ("Seq Scan", "Bitmap Heap Scan")
                                    and s[1] in ("eo_transaction_record", "eo_token")], (
                            name, scans)
                finally:
                    await conn.execute("RESET plan_cache_mode")
                    await conn.execute("DELETE FROM eo_transaction_record WHERE endpoint = $1",
                                       store.endpoint)

    async def test_a_load_for_an_absent_token_creates_no_transaction_record(self) -> None:
        """A duplicate, or a delivery nobody sent, names a partition from a body nobody
        vouched for: reading it with its (absent) token leaves no row behind, while a
        present token's first message creates the partition's TR, and gets its message."""
        clock = ManualClock()
        async with self.make_colocated(clock) as (store, tokens):
            loaded = await store.load("nobody", uuid.uuid4())
            assert (loaded.tr.version, loaded.token_exists, loaded.token) == (0, False, None)
            [loaded] = await store.load_many(["nobody-either"], [uuid.uuid4()])
            assert (loaded.tr.version, loaded.token_exists) == (0, False)
            mine = Envelope(uuid.uuid4(), "Add", b'{"n": 1}', MappingProxyType({TOKEN_HEADER: "1"}))
            await tokens.create(store.endpoint, [mine])
            loaded = await store.load("somebody", mine.message_id)
            assert (loaded.token_exists, loaded.token) == (True, mine)
            rows = await store.pool.fetch("SELECT partition_key FROM eo_transaction_record "
                                          "WHERE endpoint = $1", store.endpoint)
            assert [r["partition_key"] for r in rows] == ["somebody"]


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """`node` and every node below it in an EXPLAIN (FORMAT JSON) plan."""
    return [node, *(n for child in node.get("Plans", []) for n in _plan_nodes(child))]
