"""The gateway's inbox relay on a real PostgreSQL and RabbitMQ: inbox rows reach the orders
queue exactly once (one message ID and one token per command, every copy identical) even when
the relay crashes between publish and marking; and the `eo gateway` process relays its inbox.

A database (`eo_ingest_it_relay`) and, where `rabbitmqctl` works, a RabbitMQ virtual host
(`eo-ingest-it`) of this module's own keep its fixed queue names away from other users.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest
from pydantic import SecretStr

from adapters.postgres.migrate import upgrade_async
from adapters.rabbitmq import topology
from adapters.rabbitmq.consumer import RabbitSource
from application.codec import encode
from application.envelope import Envelope
from application.errors import Crash
from application.inbox_relay import InboxRelay
from application.observability import INBOX_RELAYED, TRANSACTION_COMMITTED
from application.ports import Inbox, InboxClaim
from entrypoints.demo.tpch import generate
from entrypoints.local import LocalContainer
from entrypoints.operations import ensure_database
from entrypoints.settings import Settings
from tests.support.processes import private_vhost
from tests.support.services import discover

DATABASE = "eo_ingest_it_relay"
VHOST = "eo-ingest-it"
DELAYS = (0.05, 0.1)
QUEUES = ("gateway", "orders")
ORDERS = 4  # the first TPC-H orders' commands: about 30


@dataclass(frozen=True)
class Where:
    dsn: str
    amqp_url: str


async def _admin(dsn: str, statement: str) -> None:
    admin = await asyncpg.connect(urlunsplit(urlsplit(dsn)._replace(path="/postgres")))
    try:
        await admin.execute(statement)
    finally:
        await admin.close()


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    services = discover()
    dsn = urlunsplit(urlsplit(services.postgres_dsn)._replace(path=f"/{DATABASE}"))
    asyncio.run(_admin(dsn, f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
    asyncio.run(ensure_database(dsn))
    asyncio.run(upgrade_async(dsn))
    yield Where(dsn, private_vhost(services.amqp_url, VHOST))
    asyncio.run(_admin(dsn, f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
    services.close()


@pytest.fixture(scope="module")
def commands() -> list[Envelope]:
    sample = generate(0.001)
    keys = sorted(sample.expected)[:ORDERS]
    return [Envelope(c.message_id, type(c.message).__name__, encode(c.message))
            for c in sample.commands if c.message.order_key in keys]  # type: ignore[attr-defined]


def _settings(where: Where, tmp_path: Path) -> Settings:
    return Settings(profile="local", database_dsn=SecretStr(where.dsn),
                    amqp_url=SecretStr(where.amqp_url), retry_delays_s=DELAYS, pool_size=2,
                    metrics_port=0, blob_store="directory", blob_dir=tmp_path / "blobs",
                    inbox_batch=10)


async def _reset(where: Where) -> None:
    connection = await aio_pika.connect(where.amqp_url)
    try:
        channel = await connection.channel()
        for endpoint in QUEUES:
            names = topology.queue_names(endpoint, len(DELAYS))
            for name in (names.work, *names.retries, names.dead_letter):
                await channel.queue_delete(name)
            await topology.declare(channel, endpoint, DELAYS, 20)
    finally:
        await connection.close()
    conn = await asyncpg.connect(where.dsn)
    try:
        await conn.execute("TRUNCATE eo_inbox, eo_token, eo_transaction_record, "
                           "eo_side_effect_record, eo_processed_message, eo_deferred_cleanup")
    finally:
        await conn.close()


async def _depth(where: Where, queue: str) -> int:
    connection = await aio_pika.connect(where.amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0
    finally:
        await connection.close()


async def _drain_queue(where: Where, queue: str) -> list[Envelope]:
    """Every message of `queue`, taken off it."""
    connection = await aio_pika.connect(where.amqp_url)
    out: list[Envelope] = []
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        while (message := await declared.get(no_ack=True, fail=False)) is not None:
            out.append(Envelope(uuid.UUID(message.message_id or ""), message.type or "",
                                message.body))
    finally:
        await connection.close()
    return out


async def _count(where: Where, sql: str) -> int:
    conn = await asyncpg.connect(where.dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not reached within {timeout_s} s")


class _CrashingInbox:
    """`inbox` whose claims crash right after the relay marked its rows: the relay process
    dies between publish and the commit of its marks."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def claim(self, limit: int) -> AbstractAsyncContextManager[InboxClaim]:
        @asynccontextmanager
        async def crashing() -> AsyncIterator[InboxClaim]:
            async with self.inbox.claim(limit) as claim:

                class Marking:
                    envelopes = claim.envelopes

                    async def mark_relayed(self, ids: Sequence[uuid.UUID]) -> None:
                        await claim.mark_relayed(ids)
                        raise Crash("killed before the claim committed its marks")

                yield Marking()  # type: ignore[misc]

        return crashing()


async def _relay_crash_then_gateway(where: Where, tmp_path: Path, commands: list[Envelope]
                                    ) -> tuple[Any, list[Envelope]]:
    await _reset(where)
    container = LocalContainer(settings=_settings(where, tmp_path))
    await container.init_resources()  # type: ignore[misc]
    try:
        system = await container.system()  # type: ignore[misc]
        n = len(commands)
        assert await system.inbox.add(commands) == n
        crashing = InboxRelay("gateway", _CrashingInbox(system.inbox),  # type: ignore[arg-type]
                              system.dispatcher, system.events, batch_size=n)
        with pytest.raises(Crash):
            await crashing.relay_once()
        assert await _depth(where, "gateway") == n  # published and confirmed ...
        assert await system.inbox.count_pending() == n  # ... but the marks rolled back
        assert await system.relay().drain() == n  # the restarted relay: every row again
        assert await system.inbox.count_pending() == 0
        assert await system.relay().drain() == 0
        assert await _depth(where, "gateway") == 2 * n

        rabbit = await container.rabbit()  # type: ignore[misc]
        source = RabbitSource(rabbit, "gateway", DELAYS, events=system.events)
        consumer = system.consumer("gateway")
        serving = asyncio.create_task(consumer.serve(source.deliveries(8), 8))

        async def settled() -> bool:
            return sum(consumer.counts.values()) >= 2 * n

        await _until(settled)
        await source.stop()
        await serving
        return consumer.counts, await _drain_queue(where, "orders")
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


def test_inbox_rows_reach_orders_exactly_once_despite_a_relay_crash(
    where: Where, tmp_path: Path, commands: list[Envelope],
) -> None:
    n = len(commands)
    counts, delivered = asyncio.run(_relay_crash_then_gateway(where, tmp_path, commands))
    assert counts == {"processed": n, "duplicate": n}
    copies: dict[uuid.UUID, set[tuple[str, bytes]]] = {}
    for envelope in delivered:
        copies.setdefault(envelope.message_id, set()).add((envelope.type, envelope.body))
    assert len(copies) == n  # one message ID per command ...
    assert all(len(versions) == 1 for versions in copies.values())  # ... copies identical (I2)
    assert sorted(v for (v,) in copies.values()) == sorted((c.type, c.body) for c in commands)
    tokens = asyncio.run(_count(where, "SELECT count(*) FROM eo_token"))
    processed = asyncio.run(_count(where, "SELECT count(*) FROM eo_processed_message "
                                          "WHERE endpoint = 'gateway'"))
    assert (tokens, processed) == (n, n)  # one token per command for orders to consume


def _eo_command() -> list[str]:
    script = Path(sys.executable).with_name("eo")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from entrypoints.cli import main; main()"]


def test_the_gateway_process_relays_its_inbox(where: Where, tmp_path: Path,
                                              commands: list[Envelope]) -> None:
    asyncio.run(_reset(where))
    settings = _settings(where, tmp_path)
    container = LocalContainer(settings=settings)

    async def add() -> int:
        await container.init_resources()  # type: ignore[misc]
        try:
            system = await container.system()  # type: ignore[misc]
            return int(await system.inbox.add(commands))
        finally:
            await container.shutdown_resources()  # type: ignore[misc]

    assert asyncio.run(add()) == len(commands)
    env = {**os.environ, "EO_PROFILE": "local", "EO_DATABASE_DSN": where.dsn,
           "EO_AMQP_URL": where.amqp_url, "EO_RETRY_DELAYS_S": json.dumps(list(DELAYS)),
           "EO_METRICS_PORT": "0", "EO_BLOB_STORE": "directory",
           "EO_BLOB_DIR": str(tmp_path / "blobs"), "EO_POOL_SIZE": "2",
           "EO_INBOX_POLL_S": "0.2", "EO_INBOX_BATCH": "7", "EO_FAILPOINTS": "",
           "EO_DUPLICATE_RATE": "0"}
    env.pop("EO_TOKEN_DSN", None)
    log = tmp_path / "gateway.jsonl"
    with log.open("wb") as out:
        process = subprocess.Popen([*_eo_command(), "gateway"], env=env, stdout=out,
                                   stderr=out)
        try:
            async def relayed() -> bool:
                return await _depth(where, "orders") >= len(commands)

            asyncio.run(_until(relayed))
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(30)
    events = [json.loads(line) for line in log.read_text().splitlines()
              if line.startswith("{")]
    assert code == 0, log.read_text()[-2000:]
    assert sum(e.get("event") == INBOX_RELAYED for e in events) == len(commands)
    assert sum(e.get("event") == TRANSACTION_COMMITTED for e in events) == len(commands)
    pending = asyncio.run(_count(where, "SELECT count(*) FROM eo_inbox "
                                        "WHERE relayed_at IS NULL"))
    assert pending == 0
    assert asyncio.run(_depth(where, "orders")) == len(commands)
