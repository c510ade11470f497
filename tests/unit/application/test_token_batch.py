"""The batched token path (application/token_batch.py): one statement per step for a whole
batch, per-message outcomes exactly those of protocol 3.1, and the failure table for every
message of a batch."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Any

import pytest

from application.codec import encode
from application.envelope import REQUEST_URL_HEADER, Envelope
from application.errors import (
    Crash,
    HandlerRejected,
    MalformedMessage,
    PermanentError,
    UnknownMessageType,
)
from application.observability import ATTEMPT_ABANDONED, HANDLER_INVOKED, TRANSACTION_CONFLICT
from application.outcome import Outcome
from application.processor import Processor
from domain.context import Context
from domain.decisions import CreateBlob, Decision, Endpoint, Outgoing
from domain.errors import Rejected
from tests.support.counter import PLAIN_COUNTER, Add, Added, Tally, handle_plain
from tests.support.invariants import check, install_probes
from tests.support.world import World


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


class Counting:
    """A port whose coroutine calls are counted by name; `before[name]` runs first."""

    def __init__(self, target: Any, calls: Counter[str],
                 before: dict[str, Callable[[], Awaitable[None]]] | None = None) -> None:
        self._target, self._calls, self._before = target, calls, before or {}

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if not callable(value) or attr.startswith("_"):
            return value

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self._calls[attr] += 1
            hook = self._before.pop(attr, None)
            if hook is not None:
                await hook()
            return await value(*args, **kwargs)

        return counted if attr not in ("holds", "insert", "discard", "seed_state", "session",
                                       "states", "record_count") else value


async def _world(endpoint: Endpoint[Any] = PLAIN_COUNTER, *messages: tuple[str, int]
                 ) -> tuple[World, list[Envelope], list[str]]:
    """A co-located world with a token per message, (partition, ID) each, and its probes."""
    world = World(endpoint, seed=5, colocated=True)
    envelopes = [Envelope(_id(n), "Add", encode(Add(p, n)), MappingProxyType({"eo-token": "1"}))
                 for p, n in messages]
    violations = install_probes(world, {e.message_id for e in envelopes})
    await world.tokens.create(world.endpoint.name, envelopes)
    return world, envelopes, violations


def _counted(world: World, calls: Counter[str],
             before: dict[str, Callable[[], Awaitable[None]]] | None = None,
             failpoints: str | None = None) -> Processor:
    return world.processor(failpoints, wrap=lambda name, port: Counting(port, calls, before)
                           if name in ("store", "tokens") else port)


async def test_a_batch_costs_one_statement_per_step_for_all_its_messages() -> None:
    world, envelopes, violations = await _world(
        PLAIN_COUNTER, ("a", 1), ("b", 2), ("c", 3), ("a", 4), ("d", 5))
    copy = envelopes[0]  # a second copy of message 1 in the same batch
    calls: Counter[str] = Counter()
    results = await _counted(world, calls).process_batch([*envelopes, copy])
    assert results == [Outcome.PROCESSED] * 5 + [Outcome.DUPLICATE]
    # partition a holds three deliveries (1, 4 and the copy of 1): three rounds, each
    # reading its TRs with the tokens (claim checks), no read of the tokens alone
    assert calls == {"load_many": 3, "commit_many": 2, "clear_many": 2}
    assert world.events.total(HANDLER_INVOKED) == 5
    assert violations + check(world, {e.message_id for e in envelopes}) == []
    # the order of a partition's messages is kept: 1 before 4
    assert world.store.states()["a"].applied == (str(_id(1)), str(_id(4)))


def _picky(state: Tally | None, message: Add, context: Context) -> Decision[Tally]:
    """The plain counter, except: a negative amount is rejected, 7 makes a blob."""
    if message.amount < 0:
        raise Rejected("negative amount")
    decision = handle_plain(state, message, context)
    if message.amount != 7:
        return decision
    key = context.artifact_key("receipts")
    out = Added(message.partition, str(context.message_id), decision.state.applied, key)
    return Decision(state=Tally(decision.state.applied, decision.state.total,
                                (*decision.state.blobs[:-1], key)),
                    outgoing=(Outgoing("audit", out),),
                    blobs=(CreateBlob(key, b"receipt", "text/plain"),))


PICKY = Endpoint(name="counter", messages={"Add": Add}, partition_of=lambda m: m.partition,
                 handle=_picky, state_type=Tally, outputs=("audit",))


async def test_what_the_batch_does_not_handle_goes_singly_and_the_rest_commits() -> None:
    world, envelopes, violations = await _world(PICKY, ("a", 1), ("b", 7), ("c", 3), ("b", 4))
    rejected = Envelope(_id(20), "Add", encode(Add("d", -1)),
                        MappingProxyType({"eo-token": "1"}))
    await world.tokens.create(world.endpoint.name, [rejected])
    untokened = Envelope(_id(21), "Add", encode(Add("e", 1)), MappingProxyType({}))
    unknown = Envelope(_id(22), "Subtract", b"{}", MappingProxyType({"eo-token": "1"}))
    await world.tokens.create(world.endpoint.name, [unknown])
    calls: Counter[str] = Counter()
    results = await _counted(world, calls).process_batch(
        [*envelopes, rejected, untokened, unknown])
    assert results[:4] == [Outcome.PROCESSED] * 4
    assert isinstance(results[4], HandlerRejected)
    assert isinstance(results[5], MalformedMessage)
    assert isinstance(results[6], UnknownMessageType)
    # the batch ran the handler of 7 (a blob) and of the rejected one, then left them: each
    # such attempt ends visibly (a log audit excuses the second run by it)
    assert world.events.total(ATTEMPT_ABANDONED) == 2
    # 1 and 3 in the batch's commit; 7 (a blob) singly, and 4 behind it on its partition
    assert calls["commit_many"] == 1
    assert calls["commit"] == 2
    assert world.store.states()["b"].applied == (str(_id(7)), str(_id(4)))
    assert list(world.blobs.objects) == list(world.store.states()["b"].blobs[:1])
    # a dead-lettered message keeps its token (protocol 7), for a replay
    assert {_id(20), _id(22)} <= set(world.tokens.rows)
    for dead in (_id(20), _id(22)):
        world.tokens.discard(world.endpoint.name, dead)
    assert violations + check(world, {e.message_id for e in envelopes}) == []


async def test_a_conflict_in_the_batch_commit_is_retried_alone() -> None:
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("b", 2), ("c", 3))
    rival = await world.send(Add("b", 9), _id(9))

    async def rival_commits_first() -> None:  # another process moves partition b meanwhile
        assert await world.processor().process(rival) is Outcome.PROCESSED

    calls: Counter[str] = Counter()
    batch = _counted(world, calls, {"commit_many": rival_commits_first})
    assert await batch.process_batch(envelopes) == [Outcome.PROCESSED] * 3
    assert world.events.total(TRANSACTION_CONFLICT) == 1
    assert calls["commit_many"] == 1
    assert calls["commit"] == 1
    assert world.store.states()["b"].applied == (str(_id(9)), str(_id(2)))
    assert violations + check(world, {*(e.message_id for e in envelopes), _id(9)}) == []


async def test_a_message_finished_elsewhere_before_the_batch_read_is_a_duplicate() -> None:
    """The token is checked with the TR, in its snapshot (protocol 3.1): before the batch's
    read another worker processed message 2 and consumed its token."""
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("b", 2))

    async def another_worker_processes_2() -> None:
        assert await world.processor().process(envelopes[1]) is Outcome.PROCESSED

    batch = _counted(world, Counter(), {"load_many": another_worker_processes_2})
    assert await batch.process_batch(envelopes) == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert violations + check(world, {e.message_id for e in envelopes}) == []


async def test_a_failed_statement_sends_its_round_singly_and_loses_nothing() -> None:
    """A statement fails for the whole round (PostgreSQL refusing one message's data, a lost
    connection): which message it was only the single path can tell, so the round's
    messages and the rounds behind it go singly; the rounds before it are done."""
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("b", 2), ("a", 3))

    async def refused() -> None:
        raise PermanentError("PostgreSQL refused the data: \\u0000")

    calls: Counter[str] = Counter()
    batch = _counted(world, calls, {"commit_many": refused})
    assert await batch.process_batch(envelopes) == [Outcome.PROCESSED] * 3
    assert world.events.total(ATTEMPT_ABANDONED) == 2  # the round's two attempts
    assert calls["commit_many"] == 1  # the first round's, refused
    assert calls["commit"] == 3  # then each message alone (the culprit would fail alone)
    assert violations + check(world, {e.message_id for e in envelopes}) == []


async def test_a_message_whose_data_the_store_refuses_is_dead_lettered_alone() -> None:
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("b", 2), ("c", 3))
    real_commit, real_commit_many = world.store._commit, world.store.commit_many

    def picky(request):  # type: ignore[no-untyped-def]
        if request.partition == "b":
            raise PermanentError("PostgreSQL refused the data: \\u0000 in a string")
        return real_commit(request)

    async def all_or_nothing(requests):  # type: ignore[no-untyped-def]
        if any(r.partition == "b" for r in requests):  # one bad row fails the statement
            raise PermanentError("PostgreSQL refused the data: \\u0000 in a string")
        return await real_commit_many(requests)

    world.store._commit = picky  # type: ignore[method-assign]
    world.store.commit_many = all_or_nothing  # type: ignore[method-assign]
    results = await world.processor().process_batch(envelopes)
    assert results[0] is Outcome.PROCESSED
    assert results[2] is Outcome.PROCESSED
    assert isinstance(results[1], PermanentError)  # dead-lettered alone, its token kept
    assert envelopes[1].message_id in world.tokens.rows
    del world.tokens.rows[envelopes[1].message_id]  # (a replay's business, not checked here)
    assert violations + check(world, {envelopes[0].message_id, envelopes[2].message_id}) == []


# The failure table (protocol 3.4) for a batch: a crash at each step, for every message of
# the batch at once; `@2` is the second round (partition a holds two messages).
BATCH_POINTS = ["after_token_load", "after_tr_load", "after_token_check", "after_handler",
                "before_commit", "after_commit", "after_commit@2", "after_publish:1",
                "after_publish_all", "after_publish_all@2", "after_cleanup_aborted",
                "after_consume_token", "after_tr_clear", "after_tr_clear@2"]


@pytest.mark.parametrize("point", BATCH_POINTS)
async def test_a_crash_anywhere_in_a_batch_is_repaired_for_every_message(point: str) -> None:
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("b", 2), ("a", 3))
    name, _, nth = point.partition("@")
    with pytest.raises(Crash):
        await world.processor(f"{name}=crash@{nth or 1}").process_batch(envelopes)
    committed = {p for p, part in world.store.partitions.items() if part.tr.is_committed}
    published = {decode_incoming(env) for _d, env in world.dispatcher.sent}
    if name in ("after_token_load", "after_tr_load", "after_token_check", "after_handler",
                "before_commit") and not nth:  # nothing durable yet
        assert not committed
        assert not published
        assert world.store.record_count() == 0
        assert all(e.message_id in world.tokens.rows for e in envelopes)
    if point == "after_commit":  # committed, nothing published: redelivery or the sweeper
        assert committed == {"a", "b"}
        assert not published
    if point == "after_publish_all":  # published, tokens still there
        assert published == {str(_id(1)), str(_id(2))}
        assert all(e.message_id in world.tokens.rows for e in envelopes)
    invoked = world.events.total(HANDLER_INVOKED)
    redelivered = await world.processor().process_batch(envelopes)
    assert all(isinstance(r, Outcome) for r in redelivered)
    # a committed message is finished by its redelivery without a second handler run
    assert world.events.total(HANDLER_INVOKED) - invoked == sum(
        r is Outcome.PROCESSED for r in redelivered)
    await world.quiesce()
    assert violations + check(world, {e.message_id for e in envelopes}) == []


def decode_incoming(envelope: Envelope) -> str:
    from application.codec import decode

    return decode(Added, envelope.body).incoming


async def test_a_crash_before_the_acks_leaves_duplicates_only() -> None:
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("b", 2))
    assert await world.processor().process_batch(envelopes) == [Outcome.PROCESSED] * 2
    # the acks were lost: the broker redelivers the whole batch
    assert await world.processor().process_batch(envelopes) == [Outcome.DUPLICATE] * 2
    assert violations + check(world, {e.message_id for e in envelopes}) == []


async def test_a_batch_with_a_single_message_attempt_on_the_general_path() -> None:
    """Workers on both paths meet in the same stores (a rolling upgrade, or a callee's
    processor beside a batched consumer)."""
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("a", 2))

    async def general_path_worker() -> None:
        general = world.processor(general=True)
        assert general.batch is None
        assert await general.process(envelopes[1]) is Outcome.PROCESSED

    batch = _counted(world, Counter(), {"commit_many": general_path_worker})
    assert await batch.process_batch(envelopes) == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert violations + check(world, {e.message_id for e in envelopes}) == []


async def test_a_delivery_that_is_not_its_tokens_message_goes_singly_as_the_token_says(
) -> None:
    """The batch takes the partition from the delivery's body, and processes it only when it
    is the token's message (claim check, docs/security.md): a forged body goes singly, where
    the token's body decides; the batch's other messages commit together."""
    world, envelopes, violations = await _world(PLAIN_COUNTER, ("a", 1), ("b", 2))
    forged = Envelope(_id(2), "Add", encode(Add("c", 500)), envelopes[1].headers)
    calls: Counter[str] = Counter()
    results = await _counted(world, calls).process_batch([envelopes[0], forged])
    assert results == [Outcome.PROCESSED] * 2
    assert (calls["commit_many"], calls["commit"]) == (1, 1)
    assert world.store.states()["b"].total == 2
    assert "c" not in world.store.states()
    assert violations + check(world, {e.message_id for e in envelopes}) == []


async def test_a_follow_up_goes_singly_by_its_tokens_headers_not_the_deliverys() -> None:
    """HTTP follow-ups are the single path's (protocol 6). The batch tells them by the
    token's message: a copy whose request-URL header was lost on the way is not batched
    (the counter here has no HTTP client, so the single path refuses it, by that header)."""
    world, _, violations = await _world(PLAIN_COUNTER)
    token = Envelope(_id(30), "Add", encode(Add("a", 1)), MappingProxyType(
        {"eo-token": "1", REQUEST_URL_HEADER: "inproc://bank/requests/1"}))
    await world.tokens.create(world.endpoint.name, [token])
    stripped = Envelope(token.message_id, token.type, token.body,
                        MappingProxyType({"eo-token": "1"}))
    calls: Counter[str] = Counter()
    results = await _counted(world, calls).process_batch([stripped])
    assert calls["commit_many"] == 0
    # the single path read the token's header: this endpoint has no HTTP client to ask
    [result] = results
    assert isinstance(result, PermanentError)
    assert "HTTP follow-up" in str(result)
    assert world.events.total(HANDLER_INVOKED) == 0
    assert violations == []
