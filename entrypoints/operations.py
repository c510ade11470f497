"""Operator commands on the real services: create and migrate the database, inspect state."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from adapters.postgres.migrate import upgrade_async
from adapters.rabbitmq.topology import queue_names
from entrypoints.settings import Settings


async def ensure_database(dsn: str) -> bool:
    """Create the database named by `dsn` when it does not exist (connecting to the server's
    `postgres` database). Returns True when it created it."""
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        parts = urlsplit(dsn)
        name = parts.path.lstrip("/")
        admin = await asyncpg.connect(urlunsplit(parts._replace(path="/postgres")))
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        return True
    await conn.close()
    return False


async def migrate_all(settings: Settings) -> list[str]:
    """Create (if missing) and migrate the endpoint database and the token database; returns
    the databases it created."""
    created = []
    for dsn in dict.fromkeys([settings.database(), settings.tokens_database()]):
        if await ensure_database(dsn):
            created.append(urlsplit(dsn).path.lstrip("/"))
        await upgrade_async(dsn)
    return created


@dataclass
class Inspection:
    """What `eo inspect` reports."""

    tokens: int = 0
    unfinished: dict[str, int] = field(default_factory=dict)
    oldest_unfinished_s: dict[str, float] = field(default_factory=dict)
    deferred_cleanups: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int | None] = field(default_factory=dict)


async def inspect(settings: Settings, endpoints: list[str]) -> Inspection:
    """Tokens in flight, committed-but-unfinished transaction records and their age, deferred
    clean-ups per endpoint, and each endpoint's dead-letter queue depth (None: no queue)."""
    out = Inspection()
    conn = await asyncpg.connect(settings.tokens_database())
    try:
        out.tokens = int(await conn.fetchval("SELECT count(*) FROM eo_token"))
    finally:
        await conn.close()
    conn = await asyncpg.connect(settings.database())
    try:
        for row in await conn.fetch(
                "SELECT endpoint, count(*) AS n, extract(epoch FROM now() - min(committed_at)) "
                "AS age FROM eo_transaction_record WHERE message_id IS NOT NULL "
                "GROUP BY endpoint"):
            out.unfinished[row["endpoint"]] = row["n"]
            out.oldest_unfinished_s[row["endpoint"]] = float(row["age"] or 0)
        for row in await conn.fetch("SELECT endpoint, count(*) AS n FROM eo_deferred_cleanup "
                                    "GROUP BY endpoint"):
            out.deferred_cleanups[row["endpoint"]] = row["n"]
    finally:
        await conn.close()
    connection = await aio_pika.connect(settings.amqp())
    try:
        for endpoint in endpoints:
            channel = await connection.channel()
            name = queue_names(endpoint, len(settings.retry_delays_s)).dead_letter
            try:
                queue = await channel.declare_queue(name, passive=True)
                out.dead_letters[endpoint] = queue.declaration_result.message_count
            except aio_pika.exceptions.ChannelClosed:
                out.dead_letters[endpoint] = None
    finally:
        await connection.close()
    return out
