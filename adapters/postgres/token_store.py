"""Tokens in PostgreSQL: `TokenStore` on the table `eo_token` (claim check: the row holds the
message)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import asyncpg

from adapters.postgres.pool import translated
from application.envelope import Envelope
from application.ports import TokenStore


def envelope_of_row(message_id: uuid.UUID, row: Any) -> Envelope | None:
    """The envelope of a claim-check row (`type`, `body`, `headers`), or None without a row."""
    if row is None:
        return None
    headers = row["headers"]
    if isinstance(headers, str):  # a connection without the jsonb codec
        headers = json.loads(headers)
    return Envelope(message_id, row["type"], bytes(row["body"]), MappingProxyType(headers))


class PostgresTokenStore(TokenStore):
    """One row per in-flight message. Every method is one statement (one round trip) and
    idempotent. Its pool may be a different database from the endpoint's (the token store is
    small and hot: architecture.md)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def create(self, envelopes: Sequence[Envelope]) -> None:
        if not envelopes:
            return
        async with translated():
            await self.pool.execute(
                """INSERT INTO eo_token (message_id, type, body, headers)
                   SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[])
                   ON CONFLICT (message_id) DO NOTHING""",
                [e.message_id for e in envelopes], [e.type for e in envelopes],
                [e.body for e in envelopes], [dict(e.headers) for e in envelopes])

    async def get(self, message_id: uuid.UUID) -> Envelope | None:
        async with translated():
            row = await self.pool.fetchrow(
                "SELECT type, body, headers FROM eo_token WHERE message_id = $1", message_id)
        return envelope_of_row(message_id, row)

    async def exists(self, message_id: uuid.UUID) -> bool:
        async with translated():
            return bool(await self.pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM eo_token WHERE message_id = $1)", message_id))

    async def delete(self, message_id: uuid.UUID) -> None:
        async with translated():
            await self.pool.execute("DELETE FROM eo_token WHERE message_id = $1", message_id)

    async def count(self) -> int:
        async with translated():
            return int(await self.pool.fetchval("SELECT count(*) FROM eo_token"))
