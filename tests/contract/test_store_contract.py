"""One contract suite for `TransactionalStore` and `TokenStore`, run against the memory
adapter and PostgreSQL: the semantics the protocol relies on (ports.py)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from types import MappingProxyType

import pytest

from application.envelope import TOKEN_HEADER, Envelope
from application.errors import Conflict
from application.records import Kind, ProcessedMessage, SideEffectRecord
from domain.decisions import Reply
from tests.contract.conftest_stores import (  # noqa: F401
    colocated,
    store_and_clock,
    token_store,
)
from tests.support.counter import Tally

M, A, B = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def rec(attempt: uuid.UUID, key: str, kind: Kind = Kind.BLOB, seq: int = 0,
        partition: str = "p") -> SideEffectRecord:
    return SideEffectRecord(partition, kind, key, M, attempt, seq,
                            MappingProxyType({"destination": "x"}), None)


async def test_a_new_partition_is_idle_at_version_zero(store_and_clock) -> None:  # noqa: F811
    store, _ = store_and_clock
    tr = await store.load_tr("p")
    assert (tr.message_id, tr.attempt_id, tr.version) == (None, None, 0)
    assert await store.load_state("p") == (None, 0)
    assert (await store.load_tr("p")).version == 0


async def test_register_bumps_the_version_and_fences_stale_attempts(store_and_clock) -> None:  # noqa: F811
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


async def test_concurrent_registrations_at_one_version_admit_exactly_one(store_and_clock) -> None:  # noqa: F811
    store, _ = store_and_clock
    await store.load_tr("p")
    results = await asyncio.gather(*(store.register(rec(uuid.uuid4(), f"k/{i}"), 0)
                                     for i in range(5)), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, Conflict) for r in results if isinstance(r, BaseException))


async def test_commit_is_atomic_and_optimistic(store_and_clock) -> None:  # noqa: F811
    store, clock = store_and_clock
    await store.load_tr("p")
    registered = rec(A, f"blob/{uuid.uuid4()}")
    v = await store.register(registered, 0)
    extra = rec(A, f"http://x/{uuid.uuid4()}", Kind.HTTP_DELETE, seq=1)
    with pytest.raises(Conflict):
        await store.commit("p", v - 1, Tally(("m",), 1), M, A, [extra])
    await store.commit("p", v, Tally(("m",), 1), M, A, [extra], Reply(200, {"ok": True}))
    tr, records = await store.load_tr_with_records("p")
    assert (tr.message_id, tr.attempt_id, tr.version) == (M, A, v + 1)
    assert tr.committed_at == clock.now()
    assert {r.key for r in records} == {registered.key, extra.key}
    assert await store.load_state("p") == (Tally(("m",), 1), v + 1)
    assert await store.stored_reply(M) == Reply(200, {"ok": True})
    assert not await store.registration_valid(registered)  # the re-check sees the commit
    with pytest.raises(Conflict):  # committed: nothing else may commit or register
        await store.commit("p", v + 1, Tally(), B, B, [])
    with pytest.raises(Conflict):
        await store.register(rec(B, "late"), v + 1)
    assert await store.unfinished_count() == 1


async def test_concurrent_commits_admit_exactly_one(store_and_clock) -> None:  # noqa: F811
    store, _ = store_and_clock
    await store.load_tr("p")
    attempts = [uuid.uuid4() for _ in range(5)]
    results = await asyncio.gather(*(store.commit("p", 0, Tally((str(a),)), M, a, [])
                                     for a in attempts), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    tr = await store.load_tr("p")
    state, _ = await store.load_state("p")
    assert state == Tally((str(tr.attempt_id),))


async def test_clear_is_a_compare_and_clear(store_and_clock) -> None:  # noqa: F811
    store, clock = store_and_clock
    await store.load_tr("p")
    loser = rec(B, f"blob/{uuid.uuid4()}")
    winner = rec(A, f"blob/{uuid.uuid4()}", seq=0)
    v = await store.register(loser, 0)
    await asyncio.sleep(0)
    tr = await store.load_tr("p")
    v = await store.register(winner, tr.version)
    await store.commit("p", v, Tally(), M, A, [])
    tr, records = await store.load_tr_with_records("p")
    due = clock.now() + timedelta(minutes=30)
    assert not await store.clear("p", tr.version - 1, records, [loser], due)
    assert await store.clear("p", tr.version, records, [loser], due)
    tr2, left = await store.load_tr_with_records("p")
    assert (tr2.message_id, tr2.version, left) == (None, tr.version + 1, ())
    assert not await store.clear("p", tr.version, records, [loser], due)  # a stale finisher
    assert await store.cleanup_count() == 1
    assert await store.due_cleanups(clock.now()) == []
    due_now = await store.due_cleanups(due)
    assert [(c.kind, c.key) for c in due_now] == [(Kind.BLOB, loser.key)]
    await store.drop_cleanups([c.cleanup_id for c in due_now])
    assert await store.cleanup_count() == 0


async def test_sweeper_queries(store_and_clock) -> None:  # noqa: F811
    store, clock = store_and_clock
    await store.load_tr("old")
    await store.commit("old", 0, Tally(), M, A, [])
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


async def test_inbox_rows(store_and_clock) -> None:  # noqa: F811
    store, clock = store_and_clock
    await store.load_tr("p")
    row = ProcessedMessage(M, "p", (MappingProxyType({"message_id": str(B), "type": "T"}),),
                           clock.now())
    await store.commit("p", 0, Tally(), M, A, [], processed=row)
    got = await store.processed(M)
    assert got is not None
    assert [dict(o) for o in got.outgoing] == [{"message_id": str(B), "type": "T"}]
    tr = await store.load_tr("p")
    await store.clear("p", tr.version, [], [], clock.now())
    with pytest.raises(Conflict):  # positive proof: a message ID is processed once
        await store.commit("p", tr.version + 1, Tally(), M, B, [], processed=row)
    clock.advance(timedelta(days=8))
    assert await store.purge_processed(clock.now() - timedelta(days=7)) == 1
    assert await store.processed(M) is None


async def test_tokens_are_idempotent_claim_checks(token_store) -> None:  # noqa: F811
    tokens = token_store
    before = await tokens.count()
    env = Envelope(uuid.uuid4(), "Add", b'{"a": 1}', MappingProxyType({TOKEN_HEADER: "1"}))
    await tokens.create([env])
    await tokens.create([Envelope(env.message_id, "Other", b"{}")])  # existing token kept
    got = await tokens.get(env.message_id)
    assert got is not None
    assert (got.message_id, got.type, got.body, dict(got.headers)) == (
        env.message_id, "Add", b'{"a": 1}', {TOKEN_HEADER: "1"})
    assert await tokens.exists(env.message_id)
    assert await tokens.count() == before + 1
    await tokens.delete(env.message_id)
    await tokens.delete(env.message_id)
    assert await tokens.get(env.message_id) is None
    assert not await tokens.exists(env.message_id)
    assert await tokens.count() == before


async def test_commit_returns_what_finish_would_read(store_and_clock) -> None:  # noqa: F811
    store, _ = store_and_clock
    await store.load_tr("p")
    loser = rec(B, f"blob/{uuid.uuid4()}")
    v = await store.register(loser, 0)
    extra = rec(A, f"http://x/{uuid.uuid4()}", Kind.HTTP_DELETE)
    committed = await store.commit("p", v, Tally(("m",)), M, A, [extra])
    tr, records = await store.load_tr_with_records("p")
    assert committed.version == tr.version
    assert sorted(r.key for r in committed.records) == sorted(r.key for r in records)
    loaded = await store.load("p")
    assert (loaded.tr, loaded.state, loaded.token_exists) == (tr, Tally(("m",)), None)


async def test_co_located_tokens_join_the_stores_statements(colocated) -> None:  # noqa: F811
    """Protocol 3.2's fast path: the token is checked with the TR, created by the commit and
    consumed by the clear, each atomically with the store's own write."""
    store, tokens, clock = colocated
    incoming = Envelope(uuid.uuid4(), "Add", b"{}", MappingProxyType({TOKEN_HEADER: "1"}))
    await tokens.create([incoming])
    loaded = await store.load("p", incoming.message_id)
    assert loaded.token_exists is True
    out = Envelope(uuid.uuid4(), "Added", b'{"x": 1}', MappingProxyType({TOKEN_HEADER: "1"}))
    record = rec(A, str(out.message_id), Kind.MESSAGE)
    with pytest.raises(Conflict):  # a refused commit creates no token
        await store.commit("p", 7, Tally(), incoming.message_id, A, [record], tokens=[out])
    assert not await tokens.exists(out.message_id)
    committed = await store.commit("p", loaded.tr.version, Tally(), incoming.message_id, A,
                                   [record], tokens=[out])
    assert await tokens.exists(out.message_id)
    assert not await store.clear("p", committed.version - 1, committed.records, [],
                                 clock.now(), consume=incoming.message_id)
    assert await tokens.exists(incoming.message_id)  # a fenced-out clear consumes nothing
    assert await store.clear("p", committed.version, committed.records, [], clock.now(),
                             consume=incoming.message_id)
    assert not await tokens.exists(incoming.message_id)
    assert (await store.load("p", incoming.message_id)).token_exists is False
    await tokens.delete(out.message_id)
