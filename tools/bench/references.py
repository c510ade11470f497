"""The bench's two references, each consuming the work queue with the bench's handler: what a
Python team would write instead of the template, with an inbox table (deduplication by
message ID, one row per message kept) and an outbox (the output written in the handler's
transaction, published after the commit, then deleted).

- `minimal`: aio-pika + asyncpg and nothing else, per message (the limit of what this stack
  does per message);
- `minimal-batched`: the same, up to `batch_size` deliveries per transaction, their outputs'
  publisher confirms awaited together (the limit with batching);
- `faststream`: FastStream 0.7 (the peer a Python team would pick), the handler's work as in
  `minimal`, acked by FastStream after the handler returns;
- `dbos`: DBOS Transact 3.4 (durable workflows on PostgreSQL) behind RabbitMQ as its users
  put it: a workflow per delivery whose ID is the message ID (DBOS's idempotency key), a
  transaction step for the account's state and a step that publishes the output. No inbox
  or outbox table: DBOS's workflow rows and step checkpoints are its deduplication.

Each runs until cancelled. Tables: `bench_inbox`, `bench_state`, `bench_outbox` (`SCHEMA`);
DBOS's own in the schema `dbos` (`DBOS_SCHEMA`), made by DBOS at its launch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from application.codec import decode, encode, from_jsonable, to_jsonable
from domain.context import Context
from tools.bench import endpoint as bench

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS bench_inbox (message_id uuid PRIMARY KEY, "
    "received_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS bench_state (account text PRIMARY KEY, state jsonb)",
    "CREATE TABLE IF NOT EXISTS bench_outbox (message_id uuid PRIMARY KEY, "
    "destination text NOT NULL, body bytea NOT NULL)",
)
TABLES = ("bench_inbox", "bench_state", "bench_outbox")
#: where DBOS keeps its workflows and its datasource's step outputs (its default schema)
DBOS_SCHEMA = "dbos"

_INBOX = "INSERT INTO bench_inbox (message_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1"
# insert the account's row when missing and lock it, in one statement
_LOCK = ("INSERT INTO bench_state (account) VALUES ($1) ON CONFLICT (account) "
         "DO UPDATE SET account = excluded.account RETURNING state")
_SAVE = "UPDATE bench_state SET state = $2 WHERE account = $1"
_OUTBOX = "INSERT INTO bench_outbox (message_id, destination, body) VALUES ($1, $2, $3)"
_SENT = "DELETE FROM bench_outbox WHERE message_id = $1"

_INBOX_MANY = ("INSERT INTO bench_inbox (message_id) SELECT unnest($1::uuid[]) "
               "ON CONFLICT DO NOTHING RETURNING message_id")
_LOCK_MANY = ("INSERT INTO bench_state (account) SELECT a FROM unnest($1::text[]) AS a "
              "ORDER BY a ON CONFLICT (account) DO UPDATE SET account = excluded.account "
              "RETURNING account, state")
_SAVE_MANY = ("UPDATE bench_state s SET state = x.state FROM unnest($1::text[], $2::jsonb[]) "
              "AS x(account, state) WHERE s.account = x.account")
_OUTBOX_MANY = ("INSERT INTO bench_outbox (message_id, destination, body) "
                "SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[])")
_SENT_MANY = "DELETE FROM bench_outbox WHERE message_id = ANY($1::uuid[])"


def _decide(state_json: Any, deposit: bench.Deposit, message_id: uuid.UUID, sink: str,
            state_bytes: int = 0) -> tuple[Any, bytes]:
    """The bench handler on a stored state (`state_bytes`: the load shape's state size, as
    the template's paths are given it): (new state as JSON, the output's body)."""
    state = from_jsonable(bench.Balance, state_json) if state_json is not None else None
    context = Context(message_id, uuid.uuid4(), datetime.now(UTC))
    decision = bench.handle(state, deposit, context, sink, state_bytes)
    [out] = decision.outgoing
    return to_jsonable(decision.state), encode(out.message)


def _output(message_id: uuid.UUID, body: bytes) -> aio_pika.Message:
    return aio_pika.Message(body, message_id=str(message_id), type="Deposited",
                            content_type="application/json",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


async def process_one(pool: Any, message_id: uuid.UUID, deposit: bench.Deposit, sink: str,
                      publish: Any, state_bytes: int = 0) -> None:
    """One message: inbox row, locked state, handler, state and outbox row in one
    transaction; then publish (awaiting the confirm) and delete the outbox row. A known
    message ID does nothing (a duplicate)."""
    out_id = uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        if await conn.fetchval(_INBOX, message_id) is None:
            return
        state, out = _decide(await conn.fetchval(_LOCK, deposit.account), deposit,
                             message_id, sink, state_bytes)
        await conn.execute(_SAVE, deposit.account, state)
        await conn.execute(_OUTBOX, out_id, sink, out)
    await publish(out_id, out)
    await pool.execute(_SENT, out_id)


async def process_many(pool: Any, messages: Sequence[tuple[uuid.UUID, bench.Deposit]],
                       sink: str, publish: Any, state_bytes: int = 0) -> None:
    """`process_one` for many messages with one statement per step: one transaction (inbox
    rows, states locked in account order, states saved, outbox rows), the publications
    with their confirms awaited together, one delete of the outbox rows."""
    ids = [m for m, _ in messages]
    async with pool.acquire() as conn, conn.transaction():
        new = {r["message_id"] for r in await conn.fetch(_INBOX_MANY, ids)}
        fresh = [(m, d) for m, d in messages if m in new]
        if not fresh:
            return
        accounts = sorted({d.account for _, d in fresh})
        states = {r["account"]: r["state"] for r in await conn.fetch(_LOCK_MANY, accounts)}
        outs: list[tuple[uuid.UUID, bytes]] = []
        for m, d in fresh:  # in delivery order: two deposits on one account both count
            states[d.account], out = _decide(states[d.account], d, m, sink, state_bytes)
            outs.append((uuid.uuid4(), out))
        await conn.execute(_SAVE_MANY, list(states), list(states.values()))
        await conn.execute(_OUTBOX_MANY, [o for o, _ in outs], [sink] * len(outs),
                           [b for _, b in outs])
    await asyncio.gather(*(publish(o, b) for o, b in outs))
    await pool.execute(_SENT_MANY, [o for o, _ in outs])


async def run_minimal(amqp_url: str, pool: Any, work: str, sink: str,
                      in_flight: int, batch_size: int, batch_wait_s: float = 0.0,
                      state_bytes: int = 0) -> None:
    """Consume `work` with aio-pika (manual acks, `in_flight` prefetch, publisher confirms)
    until cancelled: per message, or (`batch_size` > 1) the deliveries waiting plus those
    arriving within `batch_wait_s` seconds of the first, up to `batch_size`, per
    transaction; states of about `state_bytes` (0: the small balance)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=in_flight)
        publishing = await connection.channel(publisher_confirms=True)

        async def publish(message_id: uuid.UUID, body: bytes) -> None:
            await publishing.default_exchange.publish(_output(message_id, body), sink)

        queue = await consuming.declare_queue(work, passive=True)
        waiting: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(waiting.put)
        # the template's rule (application.settlement.batches_in_flight): one batch's worth
        # of the prefetch waits, so that a batch starting when another ends is full
        slots = asyncio.Semaphore(max(1, in_flight // batch_size - 1))
        tasks: set[asyncio.Task[None]] = set()

        async def settle(batch: list[AbstractIncomingMessage]) -> None:
            try:
                pairs = [(uuid.UUID(str(d.message_id)), decode(bench.Deposit, d.body))
                         for d in batch]
                if batch_size == 1:
                    await process_one(pool, *pairs[0], sink, publish, state_bytes)
                else:
                    await process_many(pool, pairs, sink, publish, state_bytes)
                for delivery in batch:
                    await delivery.ack()
            finally:
                slots.release()

        while True:  # a batch starts when a slot is free, with what piled up meanwhile
            await slots.acquire()
            batch = [await waiting.get()]
            deadline = asyncio.get_running_loop().time() + batch_wait_s
            while len(batch) < batch_size:
                if not waiting.empty():
                    batch.append(waiting.get_nowait())
                    continue
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(waiting.get(), left))
                except TimeoutError:
                    break
            task = asyncio.create_task(settle(batch))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        await connection.close()


async def run_faststream(amqp_url: str, pool: Any, work: str, sink: str,
                         in_flight: int, state_bytes: int = 0) -> None:
    """Consume `work` with FastStream until cancelled: the handler does `process_one`
    (states of about `state_bytes`), publishing through the broker (persistent,
    publisher-confirmed); FastStream acks after the handler returns."""
    from faststream.rabbit import Channel, RabbitBroker, RabbitMessage, RabbitQueue
    from pydantic import BaseModel

    class DepositBody(BaseModel):  # how a FastStream handler receives a typed message
        account: str
        cents: int
        sent_at_ns: int

    # no per-message log lines: the template's paths log none here either (CountingSink)
    broker = RabbitBroker(amqp_url, default_channel=Channel(prefetch_count=in_flight),
                          logger=None)

    sink_queue = RabbitQueue(sink, declare=False)  # declared by the bench (a quorum queue)

    async def publish(message_id: uuid.UUID, body: bytes) -> None:
        await broker.publish(body, queue=sink_queue, persist=True,
                             message_id=str(message_id), message_type="Deposited",
                             content_type="application/json")

    @broker.subscriber(RabbitQueue(work, declare=False))
    async def handle(body: DepositBody, message: RabbitMessage) -> None:
        deposit = bench.Deposit(body.account, body.cents, body.sent_at_ns)
        await process_one(pool, uuid.UUID(str(message.message_id)), deposit, sink, publish,
                          state_bytes)

    await broker.start()
    try:
        await asyncio.Event().wait()
    finally:
        await broker.stop()


# the same statements as `_LOCK` and `_SAVE`, in SQLAlchemy's parameter style
_LOCK_NAMED = ("INSERT INTO bench_state (account) VALUES (:account) ON CONFLICT (account) "
               "DO UPDATE SET account = excluded.account RETURNING state")
_SAVE_NAMED = "UPDATE bench_state SET state = CAST(:state AS jsonb) WHERE account = :account"


async def run_dbos(amqp_url: str, database_dsn: str, work: str, sink: str, in_flight: int,
                   state_bytes: int = 0) -> None:
    """Consume `work` with aio-pika (`in_flight` prefetch, manual acks) into DBOS workflows
    until cancelled: each delivery runs the workflow whose ID is its message ID (a copy's
    workflow has run already: DBOS returns its recorded result and runs nothing), which
    runs a transaction step (the account's row locked and its new state saved, READ
    COMMITTED as the other references: the row lock orders an account's deposits) and a
    step that publishes the output (publisher-confirmed, its message ID derived from the
    workflow's); the delivery is acked when the workflow returns. DBOS's system tables and
    its datasource's checkpoints go to `database_dsn` (schema `dbos`); this process is an
    executor of its own (`executor_id`: its pid), as each replica of a service is."""
    import json
    import os

    from dbos import DBOS, AsyncSQLAlchemyDatasource, SetWorkflowID
    from sqlalchemy import text

    DBOS(config={"name": "eo-bench-dbos", "system_database_url": database_dsn,
                 "executor_id": f"bench-{os.getpid()}", "log_level": "WARNING",
                 "sys_db_pool_size": in_flight + 2})
    datasource = await AsyncSQLAlchemyDatasource.create(
        database_dsn, engine_kwargs={"pool_size": in_flight + 2})
    connection = await aio_pika.connect(amqp_url)
    publishing = await connection.channel(publisher_confirms=True)

    @datasource.transaction(isolation_level="READ COMMITTED")
    async def apply(message_id: str, account: str, cents: int, sent_at_ns: int) -> str:
        session = datasource.sql_session()
        stored = (await session.execute(text(_LOCK_NAMED), {"account": account})).scalar()
        state, out = _decide(stored, bench.Deposit(account, cents, sent_at_ns),
                             uuid.UUID(message_id), sink, state_bytes)
        await session.execute(text(_SAVE_NAMED), {"account": account,
                                                  "state": json.dumps(state)})
        return out.decode()

    @DBOS.step()
    async def publish(message_id: str, body: str) -> None:
        out_id = uuid.uuid5(uuid.NAMESPACE_URL, f"eo-bench/{message_id}/output")
        await publishing.default_exchange.publish(_output(out_id, body.encode()), sink)

    @DBOS.workflow()
    async def deposit(message_id: str, account: str, cents: int, sent_at_ns: int) -> None:
        body = await apply(message_id, account, cents, sent_at_ns)
        await publish(message_id, body)

    DBOS.launch()
    try:
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=in_flight)
        queue = await consuming.declare_queue(work, passive=True)

        async def on_delivery(delivery: AbstractIncomingMessage) -> None:
            d = decode(bench.Deposit, delivery.body)
            with SetWorkflowID(str(delivery.message_id)):
                await deposit(str(delivery.message_id), d.account, d.cents, d.sent_at_ns)
            await delivery.ack()

        await queue.consume(on_delivery)
        await asyncio.Event().wait()
    finally:
        await connection.close()
        await datasource.engine.dispose()
        DBOS.destroy()
