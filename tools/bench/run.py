"""The runs of `eo bench`: at-least-once baseline, outbox, token and state paths; same
handler."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import time
import uuid
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, cast

from aio_pika.abc import AbstractIncomingMessage

from adapters.postgres.admin import ensure_database
from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.state_stream import PostgresStateStream
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.dispatcher import RabbitDispatcher, envelope_message
from adapters.system.clock import SystemClock
from application.assembly import build_processor
from application.codec import decode, encode, from_jsonable, to_jsonable
from application.consumer import Consumer
from application.envelope import TOKEN_HEADER, Envelope
from application.observability import CountingSink
from application.ports import Ports
from application.processor import Outcome, Processor
from application.strategy import Strategy
from domain.context import Context
from domain.decisions import Endpoint
from tools.bench import endpoint as bench
from tools.bench.counting import CountingPool
from tools.bench.report import BenchResult, Params, PathResult, percentile_ms

PATHS = ("baseline", "outbox", "token", "state")
RETRY_DELAYS_S = (0.05, 0.2, 1.0, 5.0)
BATCH = 50  #: publishes awaiting their confirms at once
_EO_TABLES = ("eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
              "eo_processed_message", "eo_stored_reply", "eo_state_entry")
#: the state path's business state: the newest snapshot of each partition's stream
_NEWEST = ("(SELECT DISTINCT ON (partition_key) state FROM eo_state_entry WHERE endpoint = $1 "
           "ORDER BY partition_key, version DESC) AS newest")
_LOCK = "SELECT state FROM bench_baseline_state WHERE account = $1 FOR UPDATE"
_CREATE = "INSERT INTO bench_baseline_state (account) VALUES ($1) ON CONFLICT DO NOTHING"
_SAVE = "UPDATE bench_baseline_state SET state = $2 WHERE account = $1"
_COUNT = "coalesce(sum((state->>'count')::bigint), 0)"


class _Baseline:
    """At least once: one transaction (lock, handle, write), dispatch, ack; no deduplication.
    Duck-types what `Consumer` uses of a `Processor` (process, endpoint, events)."""

    def __init__(self, pool: Any, endpoint: Endpoint[bench.Balance],
                 dispatcher: RabbitDispatcher) -> None:
        self.pool, self.definition, self.dispatcher = pool, endpoint, dispatcher
        self.endpoint = endpoint.name
        self.events = CountingSink()

    async def process(self, envelope: Envelope) -> Outcome:
        message = decode(bench.Deposit, envelope.body)
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_LOCK, message.account)
            if row is None:  # first deposit of the account: create its row, then lock it
                await conn.execute(_CREATE, message.account)
                row = await conn.fetchrow(_LOCK, message.account)
            state = from_jsonable(bench.Balance, row["state"])
            context = Context(envelope.message_id, uuid.uuid4(), datetime.now(UTC))
            decision = self.definition.handle(state, message, context)
            await conn.execute(_SAVE, message.account, to_jsonable(decision.state))
        for out in decision.outgoing:
            await self.dispatcher.dispatch(out.destination, Envelope(
                uuid.uuid4(), type(out.message).__name__, encode(out.message)))
        return Outcome.PROCESSED


class _Sink:
    """Consumes a run's sink queue; latency (ns) of the first output of each message."""

    def __init__(self, expected: int) -> None:
        self.expected, self.done = expected, asyncio.Event()
        self.latencies_ns: list[int] = []
        self.output_ids: list[uuid.UUID] = []
        self.duplicates, self.last_ns = 0, 0
        self._seen: set[int] = set()

    async def start(self, connection: RabbitConnection, queue: str) -> None:
        self._channel = await connection.open_channel(prefetch=1000)
        self._queue = await self._channel.declare_queue(queue, passive=True)
        self._tag = await self._queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        now = time.monotonic_ns()
        await message.ack()
        sent = int(json.loads(message.body)["sent_at_ns"])  # unique per incoming message
        self.output_ids.append(uuid.UUID(message.message_id))
        if sent in self._seen:
            self.duplicates += 1
            return
        self._seen.add(sent)
        self.latencies_ns.append(now - sent)
        if len(self._seen) >= self.expected:
            self.last_ns = now
            self.done.set()

    async def stop(self) -> None:
        await self._queue.cancel(self._tag)
        await self._channel.close()


async def run_bench(params: Params) -> BenchResult:
    """Create and migrate the database, then run every path in turn on fresh queues."""
    await ensure_database(params.database_dsn)
    await upgrade_async(params.database_dsn)
    pool = await create_pool(params.database_dsn, max_size=params.in_flight + 2)
    admin = await create_pool(params.database_dsn, max_size=2)  # producer, checks: uncounted
    service, driver = RabbitConnection(params.amqp_url), RabbitConnection(params.amqp_url)
    try:
        await service.start()
        await driver.start()
        await admin.execute("CREATE TABLE IF NOT EXISTS bench_baseline_state "
                            "(account text PRIMARY KEY, state jsonb)")
        underlay = await driver.channel.get_underlay_channel()
        machine = {"nproc": str(os.cpu_count()), "python": platform.python_version(),
                   "postgresql": str(await admin.fetchval("SHOW server_version")),
                   "rabbitmq": str(underlay.connection.server_properties.get("version", "?"))}
        paths = [await _run(params, path, pool, admin, service, driver) for path in PATHS]
    finally:
        await service.close()
        await driver.close()
        await pool.close()
        await admin.close()
    return BenchResult(params, machine, paths)


async def _queues(driver: RabbitConnection, work: str, sink: str, declare: bool) -> None:
    names = topology.queue_names(work, len(RETRY_DELAYS_S))
    for name in (names.work, *names.retries, names.dead_letter, sink, f"{sink}.dlq"):
        await driver.channel.queue_delete(name)
    if declare:
        await topology.declare(driver, work, RETRY_DELAYS_S, delivery_limit=20)
        await topology.declare(driver, sink, (), delivery_limit=20)


def _consumer(path: str, pool: Any, work: str, sink: str, service: RabbitConnection) -> Consumer:
    """The run's consumer: the real `Processor` on the counted pool, or the baseline."""
    endpoint, dispatcher = bench.endpoint(work, sink), RabbitDispatcher(service)
    if path == "baseline":
        return Consumer(cast(Processor, _Baseline(pool, endpoint, dispatcher)),
                        retry_delays=RETRY_DELAYS_S)
    clock = SystemClock()
    # tokens in the endpoint database: protocol 3.2's co-located fast path, as the local
    # profile runs it when EO_TOKEN_DSN is unset
    state = path == "state"  # the state path keeps no TR and creates no token
    ports = Ports(PostgresTokenStore(pool),
                  PostgresTransactionalStore(pool, work, bench.Balance, clock,
                                             holds_tokens=not state),
                  dispatcher, clock, uuid.uuid4, CountingSink(), colocated_tokens=not state,
                  state_stream=PostgresStateStream(pool, work, bench.Balance, clock)
                  if state else None)
    return Consumer(build_processor(endpoint, ports, Strategy(path)), retry_delays=RETRY_DELAYS_S)


async def _run(params: Params, path: str, pool: Any, admin: Any, service: RabbitConnection,
               driver: RabbitConnection) -> PathResult:
    n, work, sink = params.messages, f"{params.prefix}-{path}", f"{params.prefix}-sink-{path}"
    await _queues(driver, work, sink, declare=True)
    for table in _EO_TABLES:
        await admin.execute(f"DELETE FROM {table} WHERE endpoint = $1", work)
    await admin.execute("DELETE FROM eo_token WHERE type IN ('Deposit', 'Deposited')")
    await admin.execute("TRUNCATE bench_baseline_state")
    counting = CountingPool(pool)
    consumer = _consumer(path, counting, work, sink, service)
    source, receiver = RabbitSource(service, work, RETRY_DELAYS_S), _Sink(n)
    await receiver.start(driver, sink)
    serving = asyncio.create_task(consumer.serve(source.deliveries(params.in_flight),
                                                 params.in_flight))
    start_ns, timeout_s = time.monotonic_ns(), 60 + n * 0.05
    try:
        incoming = await _produce(params, admin, driver, work, token=path == "token")
        waiter = asyncio.create_task(receiver.done.wait())
        await asyncio.wait({waiter, serving}, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    finally:
        await source.stop()
        await serving  # the deliveries in flight finish: the consumer is at rest
        await receiver.stop()
    settlements = {str(k): v for k, v in consumer.counts.items()}
    if not receiver.done.is_set():
        raise RuntimeError(f"{path}: {len(receiver.latencies_ns)} of {n} outputs in "
                           f"{timeout_s:.0f} s; settlements {settlements}")
    rows = await _at_rest(admin, path, work, incoming, receiver.output_ids)
    await _queues(driver, work, sink, declare=False)
    seconds, counts = (receiver.last_ns - start_ns) / 1e9, counting.counts
    dedup = {"baseline": 0, "outbox": rows["processed_message_rows"],
             "token": rows["incoming_tokens_left"], "state": rows["stream_entries"]}
    return PathResult(
        path, seconds, n / seconds, percentile_ms(receiver.latencies_ns, 0.50),
        percentile_ms(receiver.latencies_ns, 0.99), counts.total / n, counts.resets / n,
        dedup[path], rows, settlements, receiver.duplicates,
        {k: v / n for k, v in counts.by_statement.most_common()})


async def _produce(params: Params, admin: Any, driver: RabbitConnection, work: str,
                   token: bool) -> list[uuid.UUID]:
    """Publish every deposit at full speed, `BATCH` confirms in flight; a token-based sender
    creates the batch's tokens first. Returns the incoming message IDs."""
    rng, tokens = random.Random(params.seed), PostgresTokenStore(admin)
    headers = MappingProxyType({TOKEN_HEADER: "1"} if token else {})
    ids: list[uuid.UUID] = []
    last = 0
    for start in range(0, params.messages, BATCH):
        batch = []
        for _ in range(start, min(params.messages, start + BATCH)):
            last = max(time.monotonic_ns(), last + 1)  # strictly increasing: a message's key
            deposit = bench.Deposit(f"acct-{rng.randrange(params.partitions)}",
                                    rng.randint(1, 10_000), last)
            batch.append(Envelope(uuid.uuid4(), "Deposit", encode(deposit), headers))
        if token:
            await tokens.create(work, batch)
        await asyncio.gather(*(driver.publish(work, envelope_message(e)) for e in batch))
        ids.extend(e.message_id for e in batch)
    return ids


async def _at_rest(admin: Any, path: str, work: str, incoming: list[uuid.UUID],
                   outputs: list[uuid.UUID]) -> dict[str, int]:
    """Rows left once the consumer is idle. The outputs' tokens belong to the receiver that
    would consume them (nobody here): counted apart, then deleted."""
    eo = path != "baseline"
    queries = {
        "incoming_tokens_left": ("SELECT count(*) FROM eo_token WHERE message_id = ANY($1)",
                                 incoming),
        "processed": (f"SELECT {_COUNT} FROM bench_baseline_state", None) if not eo
        else (f"SELECT {_COUNT} FROM {_NEWEST}", work) if path == "state"
        else (f"SELECT {_COUNT} FROM eo_transaction_record WHERE endpoint = $1", work),
        "stream_entries": ("SELECT count(*) FROM eo_state_entry WHERE endpoint = $1", work),
        "processed_message_rows": (
            "SELECT count(*) FROM eo_processed_message WHERE endpoint = $1", work),
        "side_effect_records_left": (
            "SELECT count(*) FROM eo_side_effect_record WHERE endpoint = $1", work),
        "unfinished_trs": ("SELECT count(*) FROM eo_transaction_record WHERE endpoint = $1 "
                           "AND message_id IS NOT NULL", work),
        "deferred_cleanups": ("SELECT count(*) FROM eo_deferred_cleanup WHERE endpoint = $1",
                              work),
        "output_tokens": ("WITH gone AS (DELETE FROM eo_token WHERE message_id = ANY($1) "
                          "RETURNING 1) SELECT count(*) FROM gone", outputs),
    }
    return {name: int(await admin.fetchval(query, *([] if arg is None else [arg])))
            for name, (query, arg) in queries.items()}
