"""The token protocol (protocol.md 3) on the real PostgreSQL adapters, on both token paths.

The general path (outgoing tokens registered, created and re-checked before the commit) and
protocol 3.2's co-located fast path (the token checked by the TR load, outgoing tokens
inserted by the commit, the incoming one consumed by the clear).

The module runs on a database of its own (`eo_it_pg_protocol_<pid>`), every test on an
endpoint name of its own; `eo_token` is shared by every endpoint of the database, so message
IDs are fresh uuid4s and the IDs a world generates are seeded per world. The amounts sent to
one partition are distinct powers of two, so its total says which messages were applied and
a message applied twice shows. Each test ends on the exactly-once end state
(`assert_exactly_once`).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any

import asyncpg
import pytest

from adapters.memory.blob_store import MemoryBlobStore
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.system.clock import ManualClock, SeededIds
from application.assembly import build_processor, build_sweeper
from application.codec import decode, encode
from application.envelope import TOKEN_HEADER, Envelope
from application.errors import Crash, MessageIdReused, TransientError, UnreadableState
from application.failpoints import Failpoints
from application.observability import HANDLER_INVOKED, CountingSink
from application.outcome import Outcome
from application.ports import Clear, Ports
from application.processor import Processor
from application.strategy import Strategy
from application.sweeper import Sweeper
from domain.context import Context
from domain.decisions import Decision, Endpoint, Outgoing
from tests.support.counter import COUNTER, Add, Added, Tally
from tests.support.processes import private_database, this_run
from tests.support.services import discover
from tests.support.world import RecordingDispatcher, crash
from tools.bench.counting import CountingPool

PATHS = ["general", "colocated"]


# ---------------------------------------------------------------------------------------------
# a pure endpoint without blobs (round-trip counting): one Outgoing per message, no blob


def _pure_handle(state: Tally | None, message: Add, context: Context) -> Decision[Tally]:
    state = state or Tally()
    applied = (*state.applied, str(context.message_id))
    out = Added(message.partition, str(context.message_id), applied, "")
    return Decision(state=Tally(applied, state.total + message.amount),
                    outgoing=(Outgoing("audit", out),))


PURE: Endpoint[Tally] = Endpoint(name="pure-counter", messages={"Add": Add},
                                 partition_of=lambda m: m.partition, handle=_pure_handle,
                                 state_type=Tally, outputs=("audit",))


# ---------------------------------------------------------------------------------------------
# a "PG world": tests.support.world.World on the PostgreSQL adapters


class RecordingIds:
    """`SeededIds` (seeded per world) that remembers what it handed out, so the teardown can
    delete every token the world may have made in the shared `eo_token`."""

    def __init__(self) -> None:
        self._ids = SeededIds(random.SystemRandom().getrandbits(64))
        self.issued: list[uuid.UUID] = []

    def __call__(self) -> uuid.UUID:
        new = self._ids()
        self.issued.append(new)
        return new


@dataclass
class PgWorld:
    """One endpoint's stores on PostgreSQL, shared by every worker (each its own Processor)."""

    pool: Any
    colocated: bool
    endpoint: Endpoint[Any] = COUNTER
    clock: ManualClock = field(default_factory=ManualClock)
    blobs: MemoryBlobStore = field(default_factory=MemoryBlobStore)
    dispatcher: RecordingDispatcher = field(default_factory=RecordingDispatcher)
    events: CountingSink = field(default_factory=CountingSink)
    sent: list[uuid.UUID] = field(default_factory=list)
    #: what each message sent adds: message ID -> (partition, amount)
    amounts: dict[uuid.UUID, tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = f"it-pg-protocol-{uuid.uuid4()}"
        # an endpoint name of its own: the tables (tokens included) are shared by runs
        self.endpoint = replace(self.endpoint, name=self.name)
        self.store = PostgresTransactionalStore(self.pool, self.name, self.endpoint.state_type,
                                                self.clock, holds_tokens=self.colocated)
        self.tokens = PostgresTokenStore(self.pool)
        self.ids = RecordingIds()

    def ports(self) -> Ports:
        return Ports(tokens=self.tokens, store=self.store, dispatcher=self.dispatcher,
                     clock=self.clock, ids=self.ids, events=self.events, blobs=self.blobs,
                     colocated_tokens=self.colocated)

    def processor(self, failpoints: str | None = None,
                  strategy: Strategy = Strategy.TOKEN, ports: Ports | None = None) -> Processor:
        """A worker (a "process") on `strategy`; `failpoints` is an `EO_FAILPOINTS` spec
        whose `crash` raises `Crash`; `ports` replaces the world's (a wrapped store)."""
        return build_processor(self.endpoint, ports or self.ports(), strategy,
                               Failpoints.from_spec(failpoints, crash),
                               cleanup_grace=timedelta(minutes=30))

    def sweeper(self) -> Sweeper:
        finisher = self.processor().finisher
        assert finisher is not None
        return build_sweeper(self.endpoint.name, self.ports(), finisher,
                             stale_after=timedelta(seconds=30), grace=timedelta(minutes=30))

    async def send(self, message: Add) -> Envelope:
        """What a token-based sender does: create the token, return the envelope to deliver."""
        envelope = Envelope(uuid.uuid4(), "Add", encode(message),
                            MappingProxyType({TOKEN_HEADER: "1"}))
        self.sent.append(envelope.message_id)
        self.amounts[envelope.message_id] = (message.partition, message.amount)
        await self.tokens.create(self.endpoint.name, [envelope])
        return envelope

    def invoked(self) -> int:
        return self.events.total(HANDLER_INVOKED)

    async def committed_to(self, partition: str) -> uuid.UUID | None:
        return (await self.store.load_tr(partition)).message_id


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    services = discover(rabbitmq=False)
    try:  # alembic runs its own event loop: no loop runs here
        with private_database(services.postgres_dsn, this_run("eo_it_pg_protocol")) as found:
            yield found
    finally:
        services.close()


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(dsn, max_size=10)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(params=PATHS)
async def make_world(
    request: pytest.FixtureRequest, pool: asyncpg.Pool
) -> AsyncIterator[Callable[..., PgWorld]]:
    """`make_world(endpoint=COUNTER, on=None)`: a PG world on the parametrized token path (`on`:
    another pool-like object, e.g. a `CountingPool`, instead of the pool);
    its rows and every token it may have made are deleted afterwards."""
    worlds: list[PgWorld] = []

    def make(endpoint: Endpoint[Any] = COUNTER, on: Any = None) -> PgWorld:
        world = PgWorld(pool if on is None else on, request.param == "colocated", endpoint)
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        ids = [*world.sent, *world.ids.issued]
        async with pool.acquire() as conn:
            await conn.execute("DELETE FROM eo_token WHERE message_id = ANY($1::uuid[])", ids)
            for table in ("eo_side_effect_record", "eo_deferred_cleanup",
                          "eo_transaction_record", "eo_processed_message"):
                await conn.execute(f"DELETE FROM {table} WHERE endpoint = $1", world.name)


@pytest.fixture
def world(make_world: Callable[..., PgWorld]) -> PgWorld:
    return make_world()


# ---------------------------------------------------------------------------------------------
# the end state


async def assert_exactly_once(world: PgWorld, incoming: list[uuid.UUID]) -> None:
    """Every message applied once (each partition's total the sum of its messages' amounts),
    one output each (identical copies, matching the committed state), nothing of the
    protocol left, outputs' tokens present, the blobs the committed ones; and a sweep two
    hours later finds nothing to do."""
    states: dict[str, Tally] = await world.store.states()
    applied = Counter(m for s in states.values() for m in s.applied)
    assert {str(m): applied[str(m)] for m in incoming} == {str(m): 1 for m in incoming}
    assert sum(applied.values()) == len(incoming)
    totals: Counter[str] = Counter()
    for m in incoming:
        partition, amount = world.amounts[m]
        totals[partition] += amount
    assert {p: s.total for p, s in states.items()} == dict(totals)

    copies: dict[uuid.UUID, set[tuple[str, str, bytes, tuple[Any, ...]]]] = defaultdict(set)
    by_incoming: dict[str, set[uuid.UUID]] = defaultdict(set)
    for destination, env in world.dispatcher.sent:
        copies[env.message_id].add((destination, env.type, env.body,
                                    tuple(sorted(env.headers.items()))))
        out = decode(Added, env.body)
        by_incoming[out.incoming].add(env.message_id)
        state = states[out.partition]
        i = state.applied.index(out.incoming)  # ValueError: output of an uncommitted attempt
        assert out.applied == state.applied[: i + 1], "output does not match the commit"
        assert out.blob_key == (state.blobs[i] if state.blobs else ""), "blob of another attempt"
    assert {m: len(c) for m, c in copies.items() if len(c) != 1} == {}, "copies differ"
    assert {str(m): len(by_incoming[str(m)]) for m in incoming} == {str(m): 1 for m in incoming}

    assert await world.store.record_count() == 0, "side-effect records left"
    assert await world.store.unfinished_count() == 0, "a committed TR was never finished"
    left = [m for m in incoming if await world.tokens.exists(world.endpoint.name, m)]
    assert left == [], "incoming tokens left"
    missing = [m for m in copies if not await world.tokens.exists("audit", m)]
    assert missing == [], "an output's token is missing"

    world.clock.advance(timedelta(hours=2))
    report = await world.sweeper().sweep()
    assert report.finished == 0
    assert report.taken_over == 0
    assert await world.store.cleanup_count() == 0, "deferred clean-ups left"
    committed_blobs = {b for s in states.values() for b in s.blobs}
    assert set(world.blobs.objects) == committed_blobs


# ---------------------------------------------------------------------------------------------
# 1. one message, then a duplicate


async def test_one_message_is_processed_and_its_duplicate_dropped(world: PgWorld) -> None:
    envelope = await world.send(Add("p", 1))
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert world.invoked() == 1
    assert await world.processor().process(envelope) is Outcome.DUPLICATE
    assert world.invoked() == 1
    assert len(world.dispatcher.sent) == 1
    await assert_exactly_once(world, [envelope.message_id])


# ---------------------------------------------------------------------------------------------
# 2. concurrent copies and messages on one partition, each in its own process


async def _as_a_broker_would(processor: Processor, envelope: Envelope, rounds: int = 60
                             ) -> Outcome:
    """Deliver until settled: a `TransientError` (conflicts retried too often) means a delayed
    redelivery, after a growing delay (the consumer's `retry_delays`, scaled down, jittered)."""
    for attempt in range(rounds):
        try:
            return await processor.process(envelope)
        except TransientError:
            await asyncio.sleep(min(0.002 * 2 ** attempt, 0.1) * random.uniform(0.5, 1.5))
    raise AssertionError(f"{envelope.message_id} not settled after {rounds} deliveries")


async def test_concurrent_copies_and_messages_on_one_partition(world: PgWorld) -> None:
    # the partition's TR exists before the burst: its concurrent creation is the next test's
    await world.store.load_tr("p")
    copied = await world.send(Add("p", 2 ** 10))
    others = [await world.send(Add("p", 2 ** i)) for i in range(10)]
    deliveries = [copied] * 10 + others
    random.shuffle(deliveries)
    tasks = [asyncio.create_task(_as_a_broker_would(world.processor(), env))
             for env in deliveries]
    try:
        outcomes = await asyncio.gather(*tasks)
    finally:  # on a failure, no other "process" outlives the test to write behind its teardown
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    by_message: dict[uuid.UUID, Counter[Outcome]] = defaultdict(Counter)
    for env, outcome in zip(deliveries, outcomes, strict=True):
        by_message[env.message_id][outcome] += 1
    assert by_message[copied.message_id] == Counter({Outcome.PROCESSED: 1,
                                                     Outcome.DUPLICATE: 9})
    assert all(by_message[e.message_id] == Counter({Outcome.PROCESSED: 1}) for e in others)
    await assert_exactly_once(world, [copied.message_id] + [e.message_id for e in others])
    assert (await world.store.states())["p"].total == 2 ** 11 - 1


@pytest.mark.parametrize("method", ["load", "load_tr"])
async def test_the_first_load_of_a_partition_races_its_concurrent_creation(
    world: PgWorld, pool: asyncpg.Pool, method: str
) -> None:
    """What the first messages of a fresh partition do when they arrive together (test 2
    without the warm-up), made deterministic: another worker's insert of the TR is held open
    while this load runs, and commits once the load waits for it."""
    async with pool.acquire() as blocker:
        async with blocker.transaction():
            await blocker.execute("INSERT INTO eo_transaction_record (endpoint, partition_key) "
                                  "VALUES ($1, 'p')", world.name)
            load = asyncio.create_task(getattr(world.store, method)("p"))
            pid = blocker.get_server_pid()
            for _ in range(500):  # until the load's insert waits for the blocker's
                if await pool.fetchval("SELECT count(*) FROM pg_stat_activity "
                                       "WHERE $1 = ANY(pg_blocking_pids(pid))", pid):
                    break
                await asyncio.sleep(0.01)
            else:
                load.cancel()
                raise AssertionError("the load never waited for the concurrent insert")
        loaded = await load
    tr = loaded.tr if method == "load" else loaded
    assert (tr.message_id, tr.version) == (None, 0)


# ---------------------------------------------------------------------------------------------
# 3. the failure table (protocol 3.4) on PostgreSQL

BEFORE_COMMIT = ["after_tr_load", "after_register:blob", "after_create:blob", "before_commit"]
AFTER_COMMIT = ["after_commit", "after_publish:1", "after_consume_token", "after_tr_clear"]


async def _crash(world: PgWorld, point: str) -> Envelope:
    envelope = await world.send(Add("p", 1))
    with pytest.raises(Crash):
        await world.processor(f"{point}=crash").process(envelope)
    return envelope


@pytest.mark.parametrize("point", BEFORE_COMMIT)
async def test_crash_before_the_commit_is_repaired_by_redelivery(
    world: PgWorld, point: str
) -> None:
    envelope = await _crash(world, point)
    ran_before = world.invoked()
    assert ran_before == (0 if point == "after_tr_load" else 1)
    assert await world.committed_to("p") is None
    assert await world.processor().process(envelope) is Outcome.PROCESSED
    assert world.invoked() == ran_before + 1  # nothing committed: the handler runs again
    await assert_exactly_once(world, [envelope.message_id])


@pytest.mark.parametrize("point", ["after_commit", "after_publish:1", "after_tr_clear"])
async def test_crash_after_the_commit_is_repaired_without_a_second_handler_run(
    world: PgWorld, point: str
) -> None:
    envelope = await _crash(world, point)
    assert world.invoked() == 1
    expected = None if point == "after_tr_clear" else envelope.message_id
    assert await world.committed_to("p") == expected
    assert await world.processor().process(envelope) is Outcome.DUPLICATE
    assert world.invoked() == 1
    assert await world.committed_to("p") is None
    await assert_exactly_once(world, [envelope.message_id])


async def test_a_clear_on_a_stale_version_leaves_the_next_commit_alone(world: PgWorld) -> None:
    """The fence's second half (protocol 3.1) in SQL: a finisher that read M1's committed
    transaction, then stalled while another worker finished it and M2 committed on the same
    partition, must not clear M2's transaction (nor consume M1's token a second time) when
    it wakes; M2's redelivery then finishes M2 without a second handler run."""
    first = await _crash(world, "after_commit")
    tr, records = await world.store.load_tr_with_records("p")
    assert tr.message_id == first.message_id
    stale = Clear("p", tr.version, tuple(records), (), world.clock.now(),
                  first.message_id if world.colocated else None)
    assert await world.processor().process(first) is Outcome.DUPLICATE  # finished it
    second = await world.send(Add("p", 2))
    with pytest.raises(Crash):
        await world.processor("after_commit=crash").process(second)
    assert await world.store.clear(stale) is False
    assert await world.committed_to("p") == second.message_id
    assert await world.processor().process(second) is Outcome.DUPLICATE
    assert world.invoked() == 2
    await assert_exactly_once(world, [first.message_id, second.message_id])


@pytest.mark.parametrize("repair", ["next_message", "sweeper"])
async def test_crash_after_the_token_delete_is_repaired_without_a_second_handler_run(
    world: PgWorld, repair: str
) -> None:
    envelope = await _crash(world, "after_consume_token")
    assert world.invoked() == 1
    # co-located, the consume and the clear are one transaction: nothing is left pending
    pending = None if world.colocated else envelope.message_id
    assert await world.committed_to("p") == pending
    assert await world.processor().process(envelope) is Outcome.DUPLICATE  # token gone
    assert world.invoked() == 1
    assert await world.committed_to("p") == pending
    incoming = [envelope.message_id]
    if repair == "next_message":
        following = await world.send(Add("p", 2))
        incoming.append(following.message_id)
        assert await world.processor().process(following) is Outcome.PROCESSED
        assert world.invoked() == 2  # the next message's handler only
    else:
        world.clock.advance(timedelta(seconds=31))
        report = await world.sweeper().sweep()
        assert report.finished == (0 if world.colocated else 1)
        assert world.invoked() == 1
    assert await world.committed_to("p") is None
    await assert_exactly_once(world, incoming)


# ---------------------------------------------------------------------------------------------
# 4. round trips of the co-located fast path


async def test_round_trips_per_message(
    make_world: Callable[..., PgWorld], pool: asyncpg.Pool
) -> None:
    counting = CountingPool(pool)  # counts the statements on connections held too
    world = make_world(PURE, counting)
    warm_up = await world.send(Add("p", 1))  # the partition's first load also inserts its TR
    assert await world.processor().process(warm_up) is Outcome.PROCESSED
    envelope = await world.send(Add("p", 2))
    processor = world.processor()
    counting.counts.reset()
    assert await processor.process(envelope) is Outcome.PROCESSED
    calls = list(counting.counts.by_statement.elements())
    if world.colocated:  # token read, TR + state + token read, commit, clear
        assert len(calls) <= 4, calls
    else:  # + token check, register, re-check, token delete
        assert len(calls) > 4, calls
    await assert_exactly_once(world, [warm_up.message_id, envelope.message_id])


# ---------------------------------------------------------------------------------------------
# 5. the gateway's claim (protocol 4): one message ID, two bodies, two partitions


class HeldCommits:
    """The world's store with every commit held at its start until `go` is set, once
    `expected` of them have arrived (`arrived`): the test locks the partitions' TR rows,
    lets the commits run into the locks and releases them together, so that the commit
    statements overlap for certain."""

    def __init__(self, store: PostgresTransactionalStore, expected: int) -> None:
        self._store, self._expected, self._seen = store, expected, 0
        self.arrived, self.go = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def commit(self, request: Any) -> Any:
        self._seen += 1
        if self._seen == self._expected:
            self.arrived.set()
        await self.go.wait()
        return await self._store.commit(request)


async def _outcome(processor: Processor, envelope: Envelope) -> Outcome | BaseException:
    """`process`, with the error it raised as the result (a dead letter's `PermanentError`)."""
    try:
        return await _as_a_broker_would(processor, envelope)
    except Exception as exc:  # noqa: BLE001 - the result under test
        return exc


def _pair(world: PgWorld, k: int) -> tuple[Envelope, Envelope]:
    """An outside producer's two commands under one message ID: two bodies, two partitions."""
    m = uuid.uuid4()
    first, second = Add(f"pair-{k}-a", 1), Add(f"pair-{k}-b", 2)
    world.sent.append(m)
    return Envelope(m, "Add", encode(first)), Envelope(m, "Add", encode(second))


async def _same_id_pair(world: PgWorld, pool: asyncpg.Pool, k: int, held: bool
                        ) -> list[Outcome | BaseException]:
    first, second = _pair(world, k)
    store = HeldCommits(world.store, 2)
    if not held:
        store.go.set()
    ports = replace(world.ports(), store=store)  # type: ignore[arg-type]
    tasks = [asyncio.create_task(_outcome(world.processor(strategy=Strategy.OUTBOX,
                                                          ports=ports), e))
             for e in (first, second)]
    try:
        if held:
            await asyncio.wait_for(store.arrived.wait(), 30)
            async with pool.acquire() as blocker, blocker.transaction():
                await blocker.execute(
                    "SELECT 1 FROM eo_transaction_record WHERE endpoint = $1 "
                    "AND partition_key = ANY($2::text[]) FOR UPDATE",
                    world.name, [f"pair-{k}-a", f"pair-{k}-b"])
                store.go.set()
                pid = blocker.get_server_pid()
                for _ in range(1000):  # until both commits wait for the blocker's row locks
                    if await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE "
                                           "$1 = ANY(pg_blocking_pids(pid))", pid) == 2:
                        break
                    await asyncio.sleep(0.005)
                else:
                    raise AssertionError("the two commits never waited together")
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_message_id_with_two_bodies_on_two_partitions_commits_once(
    world: PgWorld, pool: asyncpg.Pool
) -> None:
    """The field report: 50 pairs of commands with one message ID and order keys k and k+1,
    sent back to back to the gateway, left both orders committed in 8 pairs. The
    processed-message claim decides: the commit that loses it rolls back whole (state, TR,
    records, tokens), and its message is dead-lettered as an ID reused with another body.
    10 pairs have their commit statements overlap for certain (`HeldCommits`), 40 race
    freely, as the gateway's deliveries do."""
    pairs = [await _same_id_pair(world, pool, k, held=k < 10) for k in range(50)]
    for k, outcomes in enumerate(pairs):
        processed = [o for o in outcomes if o is Outcome.PROCESSED]
        reused = [o for o in outcomes if isinstance(o, MessageIdReused)]
        assert (len(processed), len(reused)) == (1, 1), (k, outcomes)
    states: dict[str, Tally] = await world.store.states()
    applied = Counter(m for s in states.values() for m in s.applied)
    assert sorted(applied.values()) == [1] * 50, "a message ID committed on two partitions"
    assert {str(m) for m in world.sent} == set(applied)
    outputs = Counter(decode(Added, env.body).incoming for _, env in world.dispatcher.sent)
    assert outputs == Counter({str(m): 1 for m in world.sent})
    # the losers' registrations (general path: their outgoing tokens and blobs) are the
    # sweeper's once the grace period is over: then nothing is left but what was committed
    world.clock.advance(timedelta(hours=2))
    await world.sweeper().sweep()
    world.clock.advance(timedelta(hours=1))
    await world.sweeper().sweep()
    assert await world.store.record_count() == 0
    assert await world.store.cleanup_count() == 0
    assert await world.store.unfinished_count() == 0
    assert set(world.blobs.objects) == {b for s in states.values() for b in s.blobs}
    committed_outputs = {env.message_id for _, env in world.dispatcher.sent}
    issued_left = [m for m in world.ids.issued if m not in committed_outputs
                   and await world.tokens.exists("audit", m)]
    assert issued_left == [], "a losing attempt's outgoing token was left"


# ---------------------------------------------------------------------------------------------
# a state type that changes between releases (docs/upgrading.md, "Messages and states that
# change"): the states at rest were written by the previous release


@dataclass(frozen=True)
class TallyWithCurrency:
    """`Tally` of a later release: a field added, with a default."""

    applied: tuple[str, ...] = ()
    total: int = 0
    blobs: tuple[str, ...] = ()
    currency: str = "EUR"


@dataclass(frozen=True)
class TallyNeedingCurrency:
    """`Tally` of a later release: a field added without a default."""

    currency: str
    applied: tuple[str, ...] = ()
    total: int = 0
    blobs: tuple[str, ...] = ()


async def test_a_state_type_that_gains_a_field_reads_the_states_at_rest_with_its_default(
        world: PgWorld) -> None:
    envelope = await world.send(Add("p", 5))
    assert await world.processor().process(envelope) is Outcome.PROCESSED  # the old release
    later = PostgresTransactionalStore(world.pool, world.name, TallyWithCurrency, world.clock,
                                       holds_tokens=world.colocated)
    state = (await later.load("p")).state
    assert state == TallyWithCurrency((str(envelope.message_id),), 5, state.blobs, "EUR")


async def test_a_state_the_code_no_longer_reads_dead_letters_its_message_replayable(
        world: PgWorld) -> None:
    """Without a default, the new release cannot read the state at rest: its message is not
    at fault, so it is dead-lettered replayable, body and token kept (a `MalformedMessage`,
    as before, clipped its body and could not be replayed: the message was lost)."""
    first = await world.send(Add("p", 5))
    assert await world.processor().process(first) is Outcome.PROCESSED
    later = PostgresTransactionalStore(world.pool, world.name, TallyNeedingCurrency,
                                       world.clock, holds_tokens=world.colocated)
    second = await world.send(Add("p", 1))
    with pytest.raises(UnreadableState) as refused:
        await world.processor(ports=replace(world.ports(), store=later)).process(second)
    assert refused.value.replayable
    assert "partition 'p' does not decode as TallyNeedingCurrency: currency" in \
        refused.value.reason
    assert await world.tokens.exists(world.name, second.message_id)  # kept for the replay
    # the code fixed (a default), the replay is processed as any message
    assert await world.processor().process(second) is Outcome.PROCESSED
