"""Every row of the failure table (protocol 3.4): what a crash leaves and who repairs it.

These are the rows' proofs: the sample's real-process failure table
(tests/sample/chaos/test_failure_table.py, test_general_path.py) keeps one test per class of
row and names, per row it left to memory, its twin here (or, for the HTTP artifacts and
failpoints, in test_http_protocol.py).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from application.errors import Crash, TransientError
from application.failpoints import Failpoints
from application.observability import HANDLER_INVOKED, TRANSACTION_CONFLICT
from application.outcome import Outcome
from application.records import Kind, SideEffectRecord
from application.settlement import Settler
from tests.support.counter import COUNTER, Add
from tests.support.invariants import check, install_probes
from tests.support.world import World, crash

M1, M2 = uuid.UUID(int=1), uuid.UUID(int=2)


COLOCATED = False


@pytest.fixture(autouse=True, params=["general", "colocated"])
def _token_path(request: pytest.FixtureRequest) -> None:
    """Every row runs on the general path and on protocol 3.2's co-located fast path."""
    global COLOCATED
    COLOCATED = request.param == "colocated"


async def _world() -> tuple[World, list[str]]:
    world = World(COUNTER, colocated=COLOCATED)
    violations = install_probes(world, {M1, M2})
    return world, violations


async def _crash_at(world: World, spec: str, message_id: uuid.UUID = M1) -> None:
    envelope = await world.send(Add("p", 1), message_id)
    with pytest.raises(Crash):
        await world.processor(spec).process(envelope)


async def _redeliver(world: World, message_id: uuid.UUID = M1) -> Outcome:
    envelope = _envelope(world, message_id)
    return await world.processor().process(envelope)


def _envelope(world: World, message_id: uuid.UUID):  # type: ignore[no-untyped-def]
    # the broker redelivers the same envelope; the token (if any) holds the same message
    from types import MappingProxyType

    from application.codec import encode
    from application.envelope import TOKEN_HEADER, Envelope

    return Envelope(message_id, "Add", encode(Add("p", 1)), MappingProxyType({TOKEN_HEADER: "1"}))


async def _take(broker: MemoryBroker, consumer: str) -> MemoryDelivery:
    """The next delivery of the endpoint's queue for `consumer`, left unsettled (one must be
    ready: a missing one fails the test instead of waiting for it)."""
    assert broker.depth(COUNTER.name), "no delivery ready"
    deliveries = broker.consume(COUNTER.name, consumer)
    try:
        return await anext(deliveries)
    finally:
        await deliveries.aclose()


def _invoked(world: World) -> int:
    return world.events.total(HANDLER_INVOKED)


def _record(world: World, kind: str) -> SideEffectRecord:
    """The partition's one side-effect record of `kind`."""
    [record] = [r for r in world.store.partitions["p"].records if r.kind == Kind(kind)]
    return record


async def _artifact_exists(world: World, record: SideEffectRecord) -> bool:
    """Whether `record`'s artifact exists: its blob, or its outgoing message's token."""
    if record.kind is Kind.BLOB:
        return record.key in world.blobs.objects
    return await world.tokens.exists(record.payload["destination"], uuid.UUID(record.key))


def _general_path_only(kind: str) -> None:
    if COLOCATED and kind == "message":
        pytest.skip("co-located: an outgoing token is created by the commit, not before it")


def _finished_by_the_redelivery(world: World) -> None:
    """The redelivered copy finished the committed transaction itself, before any sweeper:
    TR cleared, the output published, the token consumed."""
    assert world.store.partitions["p"].tr.message_id is None
    # published (again, under the same message ID, when the crash came after a publication)
    assert {(e.type, e.message_id) for _d, e in world.dispatcher.sent} == {
        ("Added", world.dispatcher.sent[0][1].message_id)}
    assert M1 not in world.tokens.rows


class _Stalling:
    """`target` whose coroutine method `method` waits for `release` once `started` is set
    (one worker paused at that call, as a slow process)."""

    def __init__(self, target: object, method: str) -> None:
        self.target, self.method = target, method
        self.started, self.release = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        value = getattr(self.target, name)
        if name != self.method:
            return value

        async def stalled(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.started.set()
            await self.release.wait()
            return await value(*args, **kwargs)

        return stalled


@pytest.mark.parametrize("point", ["after_token_load", "after_tr_load", "after_token_check",
                                   "after_handler"])
async def test_crash_before_anything_durable_leaves_nothing(point: str) -> None:
    """Row "token load, TR load, token check" (and a crash after the pure handler): nothing
    left; the redelivery processes the message normally. The handler runs once, and before
    that once more only where the crashed attempt reached it (`after_handler`)."""
    world, violations = await _world()
    await _crash_at(world, f"{point}=crash")
    assert world.store.record_count() == 0
    assert not world.blobs.objects
    assert await world.tokens.exists(world.endpoint.name, M1)
    assert _invoked(world) == (1 if point == "after_handler" else 0)
    assert await _redeliver(world) is Outcome.PROCESSED
    assert _invoked(world) == (2 if point == "after_handler" else 1)
    await world.quiesce()
    assert violations + check(world, {M1}) == []


@pytest.mark.parametrize("kind", ["blob", "message"])
async def test_crash_after_register_leaves_a_record_the_winner_cleans(kind: str) -> None:
    """Row "register": the attempt registered its `kind` record (a blob, or on the general
    path its outgoing message's token, after its blob was made) and died before creating
    it. Left: a record without an artifact; repaired by the next winner's clean-up (a
    no-op delete): the handler ran twice, once committed, and no record is left before
    any sweep."""
    _general_path_only(kind)
    world, violations = await _world()
    await _crash_at(world, f"after_register:{kind}=crash")
    loser = _record(world, kind)
    assert not await _artifact_exists(world, loser)
    assert world.store.record_count() == (1 if kind == "blob" else 2)  # the blob's first
    assert await _redeliver(world) is Outcome.PROCESSED  # the token is still there: a winner
    assert _invoked(world) == 2
    assert world.store.record_count() == 0
    assert not await _artifact_exists(world, loser)
    await world.quiesce()
    assert violations + check(world, {M1}) == []


@pytest.mark.parametrize("kind", ["blob", "message"])
async def test_crash_after_create_leaves_an_artifact_the_winner_deletes(kind: str) -> None:
    """Row "create": the attempt created its `kind` artifact (a blob, or on the general path
    its outgoing message's token, in the token store) and died before its re-check. Left:
    an artifact of a losing attempt (and its blob); repaired by the next winner's clean-up,
    before any sweep: the handler ran twice, once committed."""
    _general_path_only(kind)
    world, violations = await _world()
    await _crash_at(world, f"after_create:{kind}=crash")
    loser = _record(world, kind)
    assert await _artifact_exists(world, loser)
    orphans = set(world.blobs.objects)
    assert orphans
    assert await _redeliver(world) is Outcome.PROCESSED
    assert _invoked(world) == 2
    assert not orphans & set(world.blobs.objects)
    assert not await _artifact_exists(world, loser)  # the winner's, not the sweeper's
    await world.quiesce()
    assert violations + check(world, {M1}) == []


async def test_artifact_created_after_the_winners_clean_up_goes_by_deferred_clean_up() -> None:
    """A stalls between register and create, B wins and cleans, A creates and crashes before
    its re-check: the orphan is deleted by the sweeper once the grace period is over."""
    world, violations = await _world()
    release = asyncio.Event()
    real_put = world.blobs.put
    loser_put_started = asyncio.Event()

    class StallingBlobs:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(world.blobs, name)

        async def put(self, key: str, content: bytes, media_type: str) -> None:
            loser_put_started.set()
            await release.wait()
            await real_put(key, content, media_type)

    envelope = await world.send(Add("p", 1), M1)
    loser = world.processor("after_create:blob=crash",
                            wrap=lambda name, port: StallingBlobs() if name == "blobs" else port)
    task = asyncio.create_task(loser.process(envelope))
    await loser_put_started.wait()
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    release.set()
    with pytest.raises(Crash):
        await task
    assert len(world.blobs.objects) == 2  # the winner's and the orphan
    assert world.store.cleanups
    await world.quiesce()
    assert violations + check(world, {M1}) == []


async def test_an_outgoing_token_created_after_the_winners_clean_up_goes_by_deferred_clean_up(
) -> None:
    """Row "create", its last clause, for the general path's outgoing token (a token in a
    store of its own): A stalls between registering its message's token and creating it; B
    wins, and its finish cleans A's records (A's blob deleted, the token not created yet: a
    no-op delete) and defers them; A creates the token and dies before its re-check. Left: a
    token nobody will dispatch, still there while the grace period runs; repaired by the
    deferred clean-up once it is over."""
    _general_path_only("message")
    world, violations = await _world()
    envelope = await world.send(Add("p", 1), M1)
    tokens = _Stalling(world.tokens, "create")
    loser = world.processor("after_create:message=crash",
                            wrap=lambda name, port: tokens if name == "tokens" else port)
    task = asyncio.create_task(loser.process(envelope))
    await tokens.started.wait()
    orphan = _record(world, "message")
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert world.store.cleanups  # B's finish deferred A's records
    tokens.release.set()
    with pytest.raises(Crash):
        await task
    assert await _artifact_exists(world, orphan)
    world.clock.advance(timedelta(minutes=29))  # within the grace period: it stays
    await world.sweeper(world.processor()).sweep()
    assert await _artifact_exists(world, orphan)
    await world.quiesce()
    assert not await _artifact_exists(world, orphan)
    assert _invoked(world) == 2
    assert violations + check(world, {M1}) == []


async def test_an_artifact_created_after_the_winners_clean_up_is_deleted_by_its_own_recheck(
) -> None:
    """A stalls between register and create, B wins and cleans up, A creates its blob: A's
    re-check finds its registration gone and deletes the blob itself (protocol 3.2 step 3),
    so no orphan waits for the deferred clean-up; A's retry then finds the token consumed."""
    world, violations = await _world()
    envelope = await world.send(Add("p", 1), M1)
    blobs = _Stalling(world.blobs, "put")
    loser = world.processor(wrap=lambda name, port: blobs if name == "blobs" else port)
    task = asyncio.create_task(loser.process(envelope))
    await blobs.started.wait()
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    winners = set(world.blobs.objects)
    blobs.release.set()
    assert await task is Outcome.DUPLICATE
    assert set(world.blobs.objects) == winners  # at once, not after the grace period
    assert _invoked(world) == 2
    await world.quiesce()
    assert violations + check(world, {M1}) == []


async def test_a_commit_rejected_by_a_conflict_is_retried_and_the_winner_cleans_up() -> None:
    """Row "commit rejected (conflict)": A has registered and created its artifacts and is
    about to commit; B commits first and finishes. A's commit is rejected by the version
    compare, A retries (a conflict is no verdict) and finds the token consumed: a duplicate.
    A's artifacts were the winner's losers, deleted by B's finish."""
    world, violations = await _world()
    envelope = await world.send(Add("p", 1), M1)
    store = _Stalling(world.store, "commit")
    loser = world.processor(wrap=lambda name, port: store if name == "store" else port)
    task = asyncio.create_task(loser.process(envelope))
    await store.started.wait()
    loser_blobs = set(world.blobs.objects)
    assert loser_blobs  # created before the commit
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert not loser_blobs & set(world.blobs.objects)  # B's finish cleaned A's up
    store.release.set()
    assert await task is Outcome.DUPLICATE
    assert world.events.total(TRANSACTION_CONFLICT) == 1
    assert world.store.record_count() == 0
    await world.quiesce()
    assert violations + check(world, {M1}) == []


@pytest.mark.parametrize("action", ["raise", "crash"])
async def test_rejected_commit_leaves_records_and_artifacts_the_retry_cleans(action: str) -> None:
    """Row "commit rejected (error)": everything prepared, the commit fails (`raise`: a
    transient error, the delivery is retried; test_consumer.py has the retry) or the process
    dies just before it (`crash`, the same left-overs). Left: the attempt's records and
    artifacts; repaired by the retry or redelivery, whose winning finish cleans them before
    any sweep: the handler ran twice, once committed."""
    world, violations = await _world()
    envelope = await world.send(Add("p", 1), M1)
    with pytest.raises(TransientError if action == "raise" else Crash):
        await world.processor(f"before_commit={action}").process(envelope)
    assert world.store.record_count() == (1 if COLOCATED else 2)  # the message's is the commit's
    losers = set(world.blobs.objects)
    assert losers
    assert await _redeliver(world) is Outcome.PROCESSED
    assert _invoked(world) == 2
    assert not losers & set(world.blobs.objects)
    assert world.store.record_count() == 0
    await world.quiesce()
    assert violations + check(world, {M1}) == []


async def test_commit_with_unknown_outcome_is_finished_without_running_the_handler_again() -> None:
    world, violations = await _world()
    real_commit = world.store.commit

    async def commit_then_lose_the_reply(*args, **kwargs):  # type: ignore[no-untyped-def]
        await real_commit(*args, **kwargs)
        raise TransientError("connection lost during COMMIT")

    envelope = await world.send(Add("p", 1), M1)
    processor = world.processor()
    world.store.commit = commit_then_lose_the_reply  # type: ignore[method-assign]
    with pytest.raises(TransientError):
        await processor.process(envelope)
    world.store.commit = real_commit  # type: ignore[method-assign]
    assert await _redeliver(world) is Outcome.DUPLICATE
    assert _invoked(world) == 1
    _finished_by_the_redelivery(world)
    await world.quiesce()
    assert violations + check(world, {M1}) == []


@pytest.mark.parametrize("point", ["after_commit", "after_publish:1",
                                   "after_publish_all", "after_cleanup_aborted"])
async def test_crash_after_commit_is_finished_by_redelivery_without_a_second_handler_run(
    point: str,
) -> None:
    world, violations = await _world()
    await _crash_at(world, f"{point}=crash")
    assert world.store.partitions["p"].tr.message_id == M1
    assert await _redeliver(world) is Outcome.DUPLICATE
    assert _invoked(world) == 1
    _finished_by_the_redelivery(world)
    await world.quiesce()
    assert violations + check(world, {M1}) == []


@pytest.mark.parametrize("point", ["after_publish:1", "after_publish_all"])
async def test_a_repeated_publication_never_recreates_an_outgoing_token_already_consumed(
    point: str,
) -> None:
    """Row "some or all dispatches": the crash comes after the first publication
    (`after_publish:1`) or after all of them (`after_publish_all`; the counter sends one),
    the receiver consumes that message, then the redelivery finishes, without running the
    handler again. Tokens are created before the commit, never at dispatch time (protocol
    3.3): on the general path the redelivery publishes the message again and the receiver
    finds no token for the second copy and drops it; with co-located tokens the token stood
    for the message's record, so the consumed message is not published again at all
    (`SideEffectRecord.in_token`)."""
    world, violations = await _world()
    await _crash_at(world, f"{point}=crash")
    ((destination, sent),) = world.dispatcher.sent
    await world.tokens.delete(destination, sent.message_id)  # the receiver consumed it
    assert await _redeliver(world) is Outcome.DUPLICATE
    assert _invoked(world) == 1
    copies = 1 if COLOCATED else 2
    assert [e.message_id for _d, e in world.dispatcher.sent] == [sent.message_id] * copies
    assert sent.message_id not in world.tokens.rows
    # (no `check` at rest: it counts outputs' tokens, and this test played their receiver)
    assert violations == []
    assert world.store.partitions["p"].tr.message_id is None


def _consume_and_clear_are_separate() -> None:
    if COLOCATED:
        pytest.skip("co-located: the token delete and the TR clear are one transaction, so "
                    "this row of the failure table cannot happen")


async def test_crash_after_token_delete_is_finished_by_the_next_message_of_the_partition() -> None:
    _consume_and_clear_are_separate()
    world, violations = await _world()
    await _crash_at(world, "after_consume_token=crash")
    assert world.store.partitions["p"].tr.message_id == M1
    assert await _redeliver(world) is Outcome.DUPLICATE  # token gone: dropped at once
    assert world.store.partitions["p"].tr.message_id == M1
    m2 = await world.send(Add("p", 2), M2)
    assert await world.processor().process(m2) is Outcome.PROCESSED
    assert world.store.partitions["p"].tr.message_id is None
    assert _invoked(world) == 2  # M1's once, M2's once
    assert violations + check(world, {M1, M2}) == []


async def test_crash_after_token_delete_is_finished_by_the_sweeper() -> None:
    _consume_and_clear_are_separate()
    world, violations = await _world()
    await _crash_at(world, "after_consume_token=crash")
    world.clock.advance(timedelta(seconds=31))
    report = await world.sweeper(world.processor()).sweep()
    assert report.finished == 1
    assert world.store.partitions["p"].tr.message_id is None
    await world.quiesce()
    assert violations + check(world, {M1}) == []


@pytest.mark.parametrize("point", ["after_tr_clear", "before_ack"])
async def test_crash_after_clear_leaves_nothing_and_redelivery_is_dropped(point: str) -> None:
    """Row "TR clear, before ack": the message was processed and consumed (token gone, TR
    idle) and its consumer died before acking the delivery, after the clear or in the
    consumer itself (`before_ack`). Left: nothing; the broker redelivers the unsettled
    delivery to the next consumer, whose token check drops it: the handler ran once."""
    world, violations = await _world()
    broker = MemoryBroker()
    await broker.dispatch(COUNTER.name, await world.send(Add("p", 1), M1))
    dying = Settler(world.processor(f"{point}=crash"),
                    failpoints=Failpoints.from_spec(f"{point}=crash", crash))
    delivery = await _take(broker, "dying")
    with pytest.raises(Crash):
        await dying.settle(delivery)
    assert world.store.partitions["p"].tr.message_id is None
    assert not await world.tokens.exists(world.endpoint.name, M1)
    assert broker.drop_consumer("dying") == 1  # its process is gone: the broker requeues
    redelivered = await _take(broker, "next")
    assert redelivered.envelope == delivery.envelope
    assert await Settler(world.processor()).settle(redelivered) is Outcome.DUPLICATE
    assert _invoked(world) == 1
    assert broker.idle()
    await world.quiesce()
    assert violations + check(world, {M1}) == []


async def test_an_ack_that_failed_in_the_consumer_gives_the_delivery_back_at_once() -> None:
    """Row "TR clear, before ack", the consumer alive: its ack failed before the broker heard
    of it (`before_ack=raise`, an error of this process). The delivery is given back to its
    queue at once (`Delivery.release`), not held unacked until the consumer's channel
    closes (RabbitMQ holds it that long, a slot of the prefetch with it): the next take is
    the same message, a duplicate, and nothing stays in flight."""
    world, violations = await _world()
    broker = MemoryBroker()
    await broker.dispatch(COUNTER.name, await world.send(Add("p", 1), M1))
    consumer = Settler(world.processor(),
                       failpoints=Failpoints.from_spec("before_ack=raise@1", crash))
    first = await _take(broker, "consumer")
    slots = asyncio.Semaphore(1)
    await slots.acquire()
    await consumer._guarded(first, slots)
    assert consumer.counts[Outcome.UNSETTLED] == 1
    again = await _take(broker, "consumer")  # the same consumer, its channel alive
    assert again.envelope == first.envelope
    assert await consumer.settle(again) is Outcome.DUPLICATE
    assert _invoked(world) == 1
    assert broker.idle()
    await world.quiesce()
    assert violations + check(world, {M1}) == []
