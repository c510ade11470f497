"""`eo consume` as real processes on PostgreSQL and RabbitMQ: bad input dead-lettered with its
reason while the consumer goes on, graceful shutdown on SIGTERM, recovery from SIGKILL, and
`eo migrate` / `eo inspect`.

The processes share a database of this module's own (`eo_it_consumer_process`) and, where the
broker is local and `rabbitmqctl` works, a RabbitMQ virtual host of its own, so the fixed queue
names (`orders`, ...) cannot collide with other users of the broker. Each test starts from
deleted queues and empty tables. The process helpers live in tests/support/processes.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from typer.testing import CliRunner

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.postgres.migrate import head_revision
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from application.codec import encode, from_jsonable, to_jsonable
from application.envelope import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
)
from domain.sample.ledger import CustomerLedger
from domain.sample.messages import PlaceOrder
from domain.sample.orders import CONFIRMED, REJECTED, Order
from domain.sample.payments import Account, open_account
from entrypoints.cli import app
from entrypoints.demo.oracle_check import check_oracle
from entrypoints.demo.tpch import TpchSample, generate
from tests.support.processes import (
    DELAYS,
    DELIVERY_LIMIT,
    ENDPOINTS,
    MAX_BODY_BYTES,
    TABLES,
    Fleet,
    Rabbit,
    Where,
    fresh_fleet,
    logged_at,
    metric,
    publisher,
    states,
    unfinished,
    until,
    where_for,
)

DATABASE = "eo_it_consumer_process"
VHOST = "eo-it-consumer-process"
CREDIT_LIMIT = Decimal("150000")  # some orders confirmed, some refused


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for(DATABASE, VHOST, ENDPOINTS, first_port=19464) as found:
        yield found


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_fleet(where, tmp_path, pool_size=3) as started:
        yield started


@pytest.fixture
async def rabbit(where: Where) -> AsyncIterator[Rabbit]:
    async with publisher(where) as connected:
        yield connected


@pytest.fixture
async def pool(where: Where) -> AsyncIterator[asyncpg.Pool]:
    created = await create_pool(where.dsn, max_size=2)
    try:
        yield created
    finally:
        await created.close()


def token_envelope(message: object, type_: str | None = None, body: bytes | None = None,
                   ) -> Envelope:
    return Envelope(uuid.uuid4(), type_ or type(message).__name__,
                    encode(message) if body is None else body,
                    MappingProxyType({TOKEN_HEADER: "1"}))


def place(order_key: int) -> PlaceOrder:
    return PlaceOrder(order_key, 7, date(1996, 1, 2), "1-URGENT", 3)


# ---------------------------------------------------------------------------------------------
# bad input


async def test_bad_input_is_dead_lettered_with_its_reason_and_the_consumer_goes_on(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    orders = fleet.start("orders")
    await fleet.ready(orders)
    tokens = PostgresTokenStore(pool)
    not_json = token_envelope(None, "PlaceOrder", b'{"order_key": 1, ')
    unknown = token_envelope(None, "Frobnicate", b"{}")
    good = token_envelope(place(101))
    await tokens.create([not_json, unknown, good])  # the senders' tokens
    no_token_header = encode(place(102))
    oversized = b'{"pad": "' + b"x" * (2 * MAX_BODY_BYTES) + b'"}'
    token = {TOKEN_HEADER: "1"}
    ids = {name: str(uuid.uuid4()) for name in ("no_token_header", "oversized")}

    await rabbit.publish("orders", not_json.body, str(not_json.message_id), "PlaceOrder", token)
    await rabbit.publish("orders", unknown.body, str(unknown.message_id), "Frobnicate", token)
    await rabbit.publish("orders", no_token_header, ids["no_token_header"], "PlaceOrder")
    await rabbit.publish("orders", oversized, ids["oversized"], "PlaceOrder", token)
    await asyncio.to_thread(rabbit.publish_without_message_id, "orders", encode(place(103)),
                            "PlaceOrder")
    await rabbit.publish("orders", good.body, str(good.message_id), "PlaceOrder", token)

    async def settled() -> bool:
        return (await rabbit.depth("orders.dlq") == 5
                and not await tokens.exists(good.message_id))

    await until(settled, 20, "5 dead letters and the valid message processed", fleet, rabbit)
    dead = await rabbit.take("orders.dlq", 5)
    ours = {str(not_json.message_id), str(unknown.message_id), *ids.values()}
    # the copy of the message without an ID gets a random one from aiormq on its way to the
    # DLQ: key it as None
    reasons = {m.message_id if m.message_id in ours else None:
               str((m.headers or {}).get(REASON_HEADER)) for m in dead}
    assert set(reasons) == {*ours, None}, reasons
    assert reasons[str(not_json.message_id)].startswith("malformed PlaceOrder")
    assert reasons[str(unknown.message_id)] == "unknown message type 'Frobnicate'"
    assert reasons[ids["no_token_header"]].startswith("no token header")
    assert reasons[ids["oversized"]] == (f"body of {len(oversized)} bytes exceeds the limit "
                                         f"of {MAX_BODY_BYTES}")
    assert reasons[None] == "no message_id"
    for message in dead:
        headers = message.headers or {}
        assert (headers.get(ENDPOINT_HEADER), headers.get(ATTEMPTS_HEADER)) == ("orders", "1")
    # the tokens of dead letters stay (a replay from the DLQ is processed normally)
    assert await tokens.exists(not_json.message_id)
    assert await tokens.exists(unknown.message_id)
    assert await tokens.count() == 2

    order = await pool.fetchrow("SELECT state, message_id FROM eo_transaction_record "
                                "WHERE endpoint = 'orders' AND partition_key = '101'")
    assert order is not None
    assert order["message_id"] is None  # committed and finished
    assert from_jsonable(Order, order["state"]) == Order(
        101, 7, date(1996, 1, 2), "1-URGENT", placed=True, line_count=3)
    assert await pool.fetchval("SELECT count(*) FROM eo_transaction_record WHERE "
                               "endpoint = 'orders' AND state IS NOT NULL") == 1
    assert await rabbit.depths("orders") == {
        "orders": 0, "orders.retry.0": 0, "orders.retry.1": 0, "orders.dlq": 0}

    assert orders.alive(), orders.tail()
    status, body = await asyncio.to_thread(orders.get, "/ready")
    assert (status, json.loads(body)) == (200, {"consuming": True, "postgres": True})
    status, scrape = await asyncio.to_thread(orders.get, "/metrics")
    assert status == 200
    assert metric(scrape, "orders", "transaction.committed") == 1
    # the three the processor judged and the two the source refused
    assert metric(scrape, "orders", "message.dead_lettered") == 5

    orders.popen.send_signal(signal.SIGTERM)
    assert await fleet.exit_code(orders, 10) == 0, orders.tail()
    [stopped] = orders.events("consumer.stopped")
    # every delivery accounted for: processed, duplicate, dead-lettered, or refused by the source
    assert (stopped.get("processed", 0), stopped.get("duplicate", 0),
            stopped.get("dead_lettered", 0), stopped.get("rejected", 0)) == (1, 0, 3, 2), stopped


async def test_every_dead_letter_is_counted_in_the_metrics(
    fleet: Fleet, rabbit: Rabbit,
) -> None:
    orders = fleet.start("orders")
    await fleet.ready(orders)
    oversized = b'{"pad": "' + b"x" * (2 * MAX_BODY_BYTES) + b'"}'
    await rabbit.publish("orders", oversized, str(uuid.uuid4()), "PlaceOrder",
                         {TOKEN_HEADER: "1"})
    await asyncio.to_thread(rabbit.publish_without_message_id, "orders", encode(place(104)),
                            "PlaceOrder")

    async def dead_lettered() -> bool:
        return await rabbit.depth("orders.dlq") == 2

    await until(dead_lettered, 20, "2 dead letters", fleet)
    status, scrape = await asyncio.to_thread(orders.get, "/metrics")
    assert status == 200
    assert metric(scrape, "orders", "message.dead_lettered") == 2, scrape
    assert len(orders.events("message.dead_lettered")) == 2


async def test_a_replayed_dead_letter_without_message_id_is_refused_again(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    gateway = fleet.start("gateway")
    await fleet.ready(gateway)
    await asyncio.to_thread(rabbit.publish_without_message_id, "gateway", encode(place(105)),
                            "PlaceOrder")

    async def dead_lettered() -> bool:
        return await rabbit.depth("gateway.dlq") == 1

    await until(dead_lettered, 20, "the dead letter", fleet, rabbit)
    [dead] = await rabbit.take("gateway.dlq", 1)
    assert (dead.headers or {}).get(REASON_HEADER) == "no message_id"
    replayed = {k: str(v) for k, v in (dead.headers or {}).items()
                if k not in (REASON_HEADER, ENDPOINT_HEADER, ATTEMPTS_HEADER)}
    await rabbit.publish("gateway", dead.body, dead.message_id, dead.type, replayed)

    async def settled() -> bool:
        return (await rabbit.depth("gateway.dlq") == 1 or await rabbit.depth("orders") > 0
                or bool(await pool.fetchval("SELECT count(*) FROM eo_processed_message")))

    await until(settled, 20, "the replay settled", fleet, rabbit)
    await asyncio.sleep(0.3)  # a relay to orders would follow the commit at once
    assert await pool.fetchval("SELECT count(*) FROM eo_processed_message") == 0
    assert await rabbit.depth("orders") == 0
    [again] = await rabbit.take("gateway.dlq", 1)
    assert (again.headers or {}).get(REASON_HEADER) == "no message_id"


# ---------------------------------------------------------------------------------------------
# graceful shutdown


async def test_sigterm_stops_gracefully_and_loses_nothing(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    n = 400
    await topology.declare(rabbit.channel, "orders", DELAYS, DELIVERY_LIMIT)
    sent = {key: token_envelope(place(key)) for key in range(1, n + 1)}
    tokens = PostgresTokenStore(pool)
    await tokens.create(list(sent.values()))
    for batch in range(0, n, 200):
        await asyncio.gather(*(
            rabbit.publish("orders", e.body, str(e.message_id), e.type, dict(e.headers))
            for e in list(sent.values())[batch:batch + 200]))
    orders = fleet.start("orders")
    await fleet.ready(orders)

    async def under_way() -> bool:
        return await tokens.count() <= n - 40

    await until(under_way, 20, "processing under way", fleet)
    signalled = datetime.now(UTC)
    orders.popen.send_signal(signal.SIGTERM)
    stopping = time.monotonic()
    code = await fleet.exit_code(orders, 10)
    took = time.monotonic() - stopping
    assert code == 0, f"exit {code} after {took:.1f} s\n{orders.tail()}"
    assert took < 5, f"graceful shutdown took {took:.1f} s"

    left = {row["message_id"] for row in await pool.fetch("SELECT message_id FROM eo_token")}
    placed = {int(k) for k, order in (await states(pool, "orders", Order)).items()
              if order.placed}
    depths = await rabbit.depths("orders")
    assert left, "everything was processed before SIGTERM: nothing was in flight"
    # each message is processed (its order placed, its token gone) or waits in the queue
    assert placed == {key for key, e in sent.items() if e.message_id not in left}
    assert depths == {"orders": len(left), "orders.retry.0": 0, "orders.retry.1": 0,
                      "orders.dlq": 0}
    assert await unfinished(pool) == 0
    [stopped] = orders.events("consumer.stopped")
    assert stopped.get("processed") == len(placed), stopped
    # deliveries were in flight at SIGTERM, and they were finished, not dropped
    assert any(logged_at(e) > signalled for e in orders.events("token.consumed"))
    assert len(orders.events("message.received")) == len(placed)
    assert not any(stopped.get(k) for k in ("dead_lettered", "retried", "unsettled")), stopped

    again = fleet.start("orders")

    async def drained() -> bool:
        return await tokens.count() == 0 and await rabbit.depth("orders") == 0

    await until(drained, 30, "the rest processed after a restart", fleet, rabbit)
    placed = {int(k) for k, order in (await states(pool, "orders", Order)).items()
              if order.placed}
    assert placed == set(sent)
    assert await unfinished(pool) == 0
    again.popen.send_signal(signal.SIGTERM)
    assert await fleet.exit_code(again, 10) == 0, again.tail()


# ---------------------------------------------------------------------------------------------
# kill -9 and restart


def _some_orders(sample: TpchSample, min_commands: int, seed: int) -> TpchSample:
    """Whole orders of `sample` picked at random until they make `min_commands` commands,
    with their customers only."""
    by_order: dict[int, list[Any]] = {}
    for command in sample.commands:
        by_order.setdefault(command.message.order_key, []).append(command)  # type: ignore[attr-defined]
    keys = sorted(by_order)
    random.Random(seed).shuffle(keys)
    chosen: list[int] = []
    while sum(len(by_order[k]) for k in chosen) < min_commands:
        chosen.append(keys[len(chosen)])
    customers = {sample.order_customers[k] for k in chosen}
    return replace(
        sample,
        commands=tuple(c for k in sorted(chosen) for c in by_order[k]),
        customers=tuple((c, b) for c, b in sample.customers if c in customers),
        expected={k: sample.expected[k] for k in sorted(chosen)},
        order_customers={k: sample.order_customers[k] for k in chosen})


async def test_orders_killed_mid_run_and_restarted_settle_every_order_once(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    sample = _some_orders(await asyncio.to_thread(generate, 0.001), 200, seed=7)
    for customer, balance in sample.customers:
        await pool.execute(
            "INSERT INTO eo_transaction_record (endpoint, partition_key, state) "
            "VALUES ('payments', $1, $2)", str(customer),
            to_jsonable(open_account(customer, balance, CREDIT_LIMIT)))
    gateway = fleet.start("gateway")
    # the first orders process dawdles after each commit, so the kill likely finds a
    # committed, unfinished transaction
    orders = fleet.start("orders", EO_FAILPOINTS="after_commit=sleep:20")
    ledger = fleet.start("ledger")
    await fleet.ready(gateway, orders, ledger)
    commands = list(sample.commands)
    random.Random(11).shuffle(commands)  # the producer's order is not the business order
    await asyncio.gather(*(
        rabbit.publish("gateway", encode(c.message), str(c.message_id),
                       type(c.message).__name__) for c in commands))

    async def finalising() -> bool:  # assembled orders are being billed and paid
        return await pool.fetchval(
            "SELECT count(*) FROM eo_transaction_record WHERE endpoint = 'orders' "
            "AND state->>'status' <> 'open'") >= 3

    await until(finalising, 30, "some orders billed", fleet, rabbit)
    orders.popen.kill()
    assert await fleet.exit_code(orders, 5) == -signal.SIGKILL
    settled_at_kill = sum(o.status in (CONFIRMED, REJECTED)
                          for o in (await states(pool, "orders", Order)).values())
    assert settled_at_kill < len(sample.expected), "killed after the work was done"
    restarted = fleet.start("orders")

    async def quiescent() -> bool:
        books = await states(pool, "ledger", CustomerLedger)
        recorded = sum(len(b.confirmed) + len(b.rejected) for b in books.values())
        if recorded < len(sample.expected):
            return False
        queues = [await rabbit.depths(e) for e in ENDPOINTS]
        return (await pool.fetchval("SELECT count(*) FROM eo_token") == 0
                and await unfinished(pool) == 0
                and await pool.fetchval("SELECT count(*) FROM eo_http_request") == 0
                and not any(sum(q.values()) for q in queues))

    await until(quiescent, 45, "quiescence after the restart", fleet, rabbit)
    for proc in (gateway, restarted, ledger):
        assert proc.alive(), fleet.tails()

    orders_by_key = await states(pool, "orders", Order)
    for order_key, expected in sample.expected.items():
        order = orders_by_key[str(order_key)]
        assert tuple(line.line_number for line in order.lines) == expected.lines, order_key
        assert order.total == expected.total, order_key
        assert order.status in (CONFIRMED, REJECTED), order
    blobs = await LocalDirectoryBlobStore(fleet.blob_dir).keys()
    oracle = check_oracle(sample, orders_by_key, await states(pool, "ledger", CustomerLedger),
                          await states(pool, "payments", Account), blobs, CREDIT_LIMIT)
    assert not oracle.violations, oracle.violations
    assert oracle.confirmed + oracle.rejected == len(sample.expected)
    assert await pool.fetchval("SELECT count(*) FROM eo_token") == 0
    assert await unfinished(pool) == 0
    for endpoint in ENDPOINTS:
        assert await rabbit.depth(f"{endpoint}.dlq") == 0, endpoint


# ---------------------------------------------------------------------------------------------
# eo migrate and eo inspect


async def _tables(dsn: str) -> tuple[set[str], str]:
    conn = await asyncpg.connect(dsn)
    try:
        names = {r["tablename"] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        return names, await conn.fetchval("SELECT version_num FROM eo_schema_version")
    finally:
        await conn.close()


async def _seed_for_inspect(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO eo_token (message_id, type, body) VALUES ($1, 'x', '')",
                           uuid.uuid4())
        await conn.execute(
            "INSERT INTO eo_transaction_record (endpoint, partition_key, message_id, "
            "attempt_id, committed_at) VALUES ('ledger', '1', $1, $2, now())",
            uuid.uuid4(), uuid.uuid4())
    finally:
        await conn.close()


async def _drop(dsn: str) -> None:
    parts = urlsplit(dsn)
    admin = await asyncpg.connect(urlunsplit(parts._replace(path="/postgres")))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}" WITH (FORCE)')
    finally:
        await admin.close()


def test_migrate_creates_the_database_once_and_inspect_reports(where: Where) -> None:
    name = f"eo_it_migrate_{uuid.uuid4().hex[:12]}"
    dsn = urlunsplit(urlsplit(where.dsn)._replace(path=f"/{name}"))
    env = {"EO_PROFILE": "local", "EO_DATABASE_DSN": dsn, "EO_AMQP_URL": where.amqp_url,
           "EO_RETRY_DELAYS_S": json.dumps(list(DELAYS)), "EO_TOKEN_DSN": None,
           "EO_FAILPOINTS": None}
    runner = CliRunner()
    try:
        first = runner.invoke(app, ["migrate"], env=env)
        assert first.exit_code == 0, first.output
        assert f"created database {name}" in first.output
        assert "schema is up to date" in first.output
        tables, version = asyncio.run(_tables(dsn))
        assert set(TABLES) | {"eo_schema_version"} <= tables
        assert version == head_revision()

        asyncio.run(_seed_for_inspect(dsn))
        second = runner.invoke(app, ["migrate"], env=env)
        assert second.exit_code == 0, second.output
        assert "created database" not in second.output
        assert "schema is up to date" in second.output
        assert asyncio.run(_tables(dsn)) == (tables, version)

        shown = runner.invoke(app, ["inspect"], env=env)
        assert shown.exit_code == 0, shown.output
        assert "tokens in flight: 1" in shown.output  # the row seeded survived the re-run
        cells = [[cell.strip() for cell in line.strip().strip("│").split("│")]
                 for line in shown.output.splitlines() if line.startswith("│")]
        rows = {row[0]: row[1:] for row in cells if row[0] in ENDPOINTS}
        assert set(rows) == set(ENDPOINTS), shown.output
        assert rows["ledger"][0] == "1", shown.output  # one unfinished transaction record
        assert rows["orders"][0] == rows["gateway"][0] == "0", shown.output
    finally:
        asyncio.run(_drop(dsn))
