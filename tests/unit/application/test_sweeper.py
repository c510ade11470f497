"""The sweeper's steps (protocol 8): stale transactions, deferred clean-up, abandoned
registrations, retention."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from application.errors import Crash
from application.outcome import Outcome
from tests.support.counter import COUNTER, Add
from tests.support.invariants import check, install_probes
from tests.support.world import World

M1 = uuid.UUID(int=1)


async def test_abandoned_registration_is_taken_over_and_its_artifact_deleted() -> None:
    """An attempt registers and creates a blob, then dies; no other message comes to the
    partition. After the grace period the sweeper fences the attempt out (version bump),
    deletes the blob and drops the records."""
    world = World(COUNTER)
    envelope = await world.send(Add("p", 1), M1)
    with pytest.raises(Crash):
        await world.processor("after_create:blob=crash").process(envelope)
    stale_version = world.store.partitions["p"].tr.version
    assert world.blobs.objects
    assert world.store.record_count() == 1

    world.clock.advance(timedelta(minutes=10))  # within the grace period: nothing happens
    report = await world.sweeper(world.processor()).sweep()
    assert report.taken_over == 0
    assert world.blobs.objects

    world.clock.advance(timedelta(minutes=30))
    report = await world.sweeper(world.processor()).sweep()
    assert report.taken_over == 1
    assert not world.blobs.objects
    assert world.store.record_count() == 0
    assert world.store.partitions["p"].tr.version == stale_version + 1  # the fence
    # the message itself is still pending and is processed normally afterwards
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    await world.quiesce()
    assert check(world, {M1}) == []


async def test_take_over_loses_to_an_attempt_that_moved_the_version_first() -> None:
    world = World(COUNTER)
    envelope = await world.send(Add("p", 1), M1)
    with pytest.raises(Crash):
        await world.processor("after_create:blob=crash").process(envelope)
    world.clock.advance(timedelta(hours=1))
    abandoned = await world.store.abandoned(world.clock.now())
    assert len(abandoned) == 1
    assert await world.processor().process(envelope) is Outcome.PROCESSED  # moves the version
    assert not await world.store.take_over(abandoned[0], world.clock.now())
    await world.quiesce()
    assert check(world, {M1}) == []


async def test_deferred_clean_up_waits_for_the_grace_period() -> None:
    world = World(COUNTER)
    violations = install_probes(world, {M1})
    envelope = await world.send(Add("p", 1), M1)
    with pytest.raises(Crash):
        await world.processor("before_commit=crash").process(envelope)
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert len(world.store.cleanups) == 2  # the loser's blob and message, deleted once already
    world.clock.advance(timedelta(minutes=29))
    assert (await world.sweeper(world.processor()).sweep()).deferred_cleaned == 0
    world.clock.advance(timedelta(minutes=2))
    assert (await world.sweeper(world.processor()).sweep()).deferred_cleaned == 2
    assert not world.store.cleanups
    assert violations + check(world, {M1}) == []


async def test_retention_purges_old_inbox_rows_only() -> None:
    from application.strategy import Strategy

    world = World(COUNTER, strategy=Strategy.OUTBOX)
    old = await world.send(Add("p", 1), M1)
    await world.processor().process(old)
    world.clock.advance(timedelta(days=6))
    new = await world.send(Add("q", 1), uuid.UUID(int=2))
    await world.processor().process(new)
    world.clock.advance(timedelta(days=1, seconds=1))
    report = await world.sweeper(world.processor()).sweep()
    assert report.purged_processed == 1
    assert {m for _, m in world.store.processed_rows} == {uuid.UUID(int=2)}
