"""Positive-proof deduplication (protocol 4): the inbox row and the classic outbox."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from application.codec import decode
from application.errors import Crash, TransientError
from application.observability import HANDLER_INVOKED
from application.outcome import Outcome
from application.strategy import Strategy
from domain.gateway import Relayed
from tests.support.counter import COUNTER, Add, Added
from tests.support.counters import endpoints as counters
from tests.support.counters.harness import outside_envelope
from tests.support.invariants import check
from tests.support.world import World

M1, M2 = uuid.UUID(int=1), uuid.UUID(int=2)


def _world() -> World:
    return World(COUNTER, strategy=Strategy.OUTBOX)


def _copies(world: World) -> set[tuple[str, uuid.UUID, str, bytes, tuple[tuple[str, str], ...]]]:
    """Every distinct published copy: destination, ID, type, body and headers."""
    return {
        (dest, env.message_id, env.type, env.body, tuple(sorted(env.headers.items())))
        for dest, env in world.dispatcher.sent
    }


def _runs(world: World) -> int:
    return world.events.total(HANDLER_INVOKED)


async def test_outside_message_without_a_token_is_processed_once() -> None:
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    assert not world.tokens.rows  # outside producers create no token
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert world.store.partitions["p"].state.total == 5
    assert len(world.dispatcher.sent) == 1
    assert _runs(world) == 1


async def test_duplicate_republishes_the_stored_copy_without_running_the_handler() -> None:
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    await world.processor().process(envelope)
    (first,) = _copies(world)
    for _ in range(3):
        assert await world.processor().process(envelope) is Outcome.DUPLICATE
    assert len(world.dispatcher.sent) == 4
    assert _copies(world) == {first}  # byte-identical: same ID, body, headers, destination
    assert _runs(world) == 1
    assert world.store.partitions["p"].state.total == 5
    assert check(world, {M1}) == []


async def test_the_inbox_row_stores_the_outgoing_messages_it_republishes() -> None:
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    await world.processor().process(envelope)
    row = world.store.processed_rows[("", M1)]
    assert (row.message_id, row.partition, row.processed_at) == (M1, "p", world.clock.now())
    (stored,) = row.outgoing
    ((destination, sent),) = world.dispatcher.sent
    assert stored["destination"] == destination == "audit"
    assert uuid.UUID(stored["message_id"]) == sent.message_id
    assert (stored["type"], stored["body"].encode()) == (sent.type, sent.body)
    assert decode(Added, sent.body).incoming == str(M1)
    # the outgoing message's token was created before the commit, once
    assert set(world.tokens.rows) == {sent.message_id}


async def test_republication_never_recreates_a_consumed_outgoing_token() -> None:
    """Protocol 3.3: tokens are created before the commit, never at dispatch time, so a
    receiver that already consumed the message drops the re-published copy."""
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    await world.processor().process(envelope)
    ((_, sent),) = world.dispatcher.sent
    await world.tokens.delete("audit", sent.message_id)  # the receiver consumed it
    assert await world.processor().process(envelope) is Outcome.DUPLICATE
    assert len(world.dispatcher.sent) == 2
    assert not world.tokens.rows


@pytest.mark.parametrize(
    ("point", "published_before_crash"),
    [("after_commit", 0), ("after_publish:1", 1), ("after_publish_all", 1)],
)
async def test_crash_after_commit_then_redelivery_publishes_the_same_copy(
    point: str, published_before_crash: int
) -> None:
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    with pytest.raises(Crash):
        await world.processor(f"{point}=crash").process(envelope)
    assert world.store.partitions["p"].tr.message_id == M1
    row = world.store.processed_rows[("", M1)]  # written by the commit itself
    assert len(world.dispatcher.sent) == published_before_crash
    assert await world.processor().process(envelope) is Outcome.DUPLICATE
    assert len(world.dispatcher.sent) == published_before_crash + 1  # finished: once more
    assert world.store.partitions["p"].tr.message_id is None
    assert await world.processor().process(envelope) is Outcome.DUPLICATE
    (copy,) = _copies(world)
    assert copy[1] == uuid.UUID(row.outgoing[0]["message_id"])
    assert copy[3] == row.outgoing[0]["body"].encode()
    assert _runs(world) == 1
    await world.quiesce()
    assert check(world, {M1}) == []


async def test_transient_failure_before_commit_leaves_no_inbox_row_and_retry_processes() -> None:
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    with pytest.raises(TransientError):
        await world.processor("before_commit=raise").process(envelope)
    assert ("", M1) not in world.store.processed_rows
    assert not world.dispatcher.sent
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert world.store.partitions["p"].state.total == 5
    await world.quiesce()
    assert check(world, {M1}) == []  # the failed attempt's blob and token are gone


async def test_concurrent_copies_on_two_workers_commit_once() -> None:
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    outcomes = await asyncio.gather(
        world.processor().process(envelope), world.processor().process(envelope)
    )
    assert sorted(outcomes) == sorted([Outcome.PROCESSED, Outcome.DUPLICATE])
    assert world.store.partitions["p"].state.applied == (str(M1),)
    await world.quiesce()
    assert check(world, {M1}) == []


async def test_retention_keeps_rows_inside_the_window() -> None:
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    await world.processor().process(envelope)
    world.clock.advance(timedelta(days=6))
    report = await world.sweeper(world.processor()).sweep()
    assert report.purged_processed == 0
    assert ("", M1) in world.store.processed_rows
    assert await world.processor().process(envelope) is Outcome.DUPLICATE


async def test_a_duplicate_older_than_the_retention_window_is_processed_again() -> None:
    """The known cost of the outbox window (protocol 4): once the inbox row is purged, a very
    late duplicate is indistinguishable from a new message and is processed a second time
    (I1 does not hold beyond the window; the token path has no such window)."""
    world = _world()
    envelope = await world.send(Add("p", 5), M1)
    other = await world.send(Add("p", 1), M2)
    await world.processor().process(envelope)
    world.clock.advance(timedelta(days=7, seconds=1))
    await world.processor().process(other)  # processed now: inside the window at the sweep
    report = await world.sweeper(world.processor()).sweep()
    assert report.purged_processed == 1
    assert {m for _, m in world.store.processed_rows} == {M2}

    assert await world.processor().process(other) is Outcome.DUPLICATE
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    state = world.store.partitions["p"].state
    assert state.applied == (str(M1), str(M2), str(M1))
    assert state.total == 11
    assert _runs(world) == 3
    ids = {env.message_id for _, env in world.dispatcher.sent}
    assert len(ids) == 3  # the late duplicate's output is a new message with a new ID


async def test_gateway_relays_once_and_republishes_identically() -> None:
    world = World(counters.FRONT, strategy=Strategy.OUTBOX)
    command = counters.Add("c42", 16)
    envelope = outside_envelope(command, uuid.uuid5(uuid.NAMESPACE_URL, "producer/add/42"))
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert await world.processor().process(envelope) is Outcome.DUPLICATE
    ((dest1, relayed1), (dest2, relayed2)) = world.dispatcher.sent
    assert dest1 == dest2 == "counter"
    assert relayed1 == relayed2
    assert relayed1.message_id != envelope.message_id
    assert decode(counters.Add, relayed1.body) == command
    # the relayed message travels on the token path: its token exists, with the same body
    assert relayed1.header("eo-token") == "1"
    token = await world.tokens.get("counter", relayed1.message_id)
    assert token is not None
    assert token.body == relayed1.body
    assert world.store.partitions["c42"].state == Relayed(1)


async def test_gateway_keeps_one_partition_per_counter() -> None:
    world = World(counters.FRONT, strategy=Strategy.OUTBOX)
    envelopes = [
        outside_envelope(counters.Add("c42", 1), uuid.uuid5(uuid.NAMESPACE_URL, "p/42")),
        outside_envelope(counters.Spend("c43", 2), uuid.uuid5(uuid.NAMESPACE_URL, "p/43")),
    ]
    for envelope in envelopes:
        await world.processor().process(envelope)
    assert world.store.partitions["c42"].state == Relayed(1)
    assert world.store.partitions["c43"].state == Relayed(1)
    assert {m for _, m in world.store.processed_rows} == {e.message_id for e in envelopes}
