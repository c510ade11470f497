"""Tokens in PostgreSQL: `TokenStore` on the table `eo_token` (claim check: the row holds the
message, and names the endpoint it is addressed to)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import asyncpg

from adapters.postgres.pool import db, translated
from application.envelope import Envelope
from application.ports import TokenStore

#: The tokens endpoint $1 may consume: its own, and those written before tokens had an
#: address (migration 0005), until they drain.
ADDRESSED = "(endpoint = $1 OR endpoint IS NULL)"


def envelope_of_row(message_id: uuid.UUID, row: Any) -> Envelope | None:
    """The envelope of a claim-check row (`type`, `body`, `headers`), or None without a row."""
    if row is None:
        return None
    headers = row["headers"]
    if isinstance(headers, str):  # a connection without the jsonb codec
        headers = json.loads(headers)
    return Envelope(message_id, row["type"], bytes(row["body"]), MappingProxyType(headers))


class PostgresTokenStore(TokenStore):
    """One row per in-flight message, keyed by message ID, with the endpoint it is addressed
    to. Every method is one statement (one round trip) and idempotent. Its pool may be a
    different database from the endpoint's (the token store is small and hot:
    architecture.md)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def create(self, endpoint: str, envelopes: Sequence[Envelope]) -> None:
        if not envelopes:
            return
        async with translated():
            await db(self.pool).execute(
                """INSERT INTO eo_token (endpoint, message_id, type, body, headers)
                   SELECT $1, m, t, b, h
                     FROM unnest($2::uuid[], $3::text[], $4::bytea[], $5::jsonb[])
                       AS x(m, t, b, h)
                   ON CONFLICT (message_id) DO NOTHING""",
                endpoint, [e.message_id for e in envelopes], [e.type for e in envelopes],
                [e.body for e in envelopes], [dict(e.headers) for e in envelopes])

    async def get(self, endpoint: str, message_id: uuid.UUID) -> Envelope | None:
        async with translated():
            row = await db(self.pool).fetchrow(
                f"SELECT type, body, headers FROM eo_token WHERE message_id = $2 AND {ADDRESSED}",
                endpoint, message_id)
        return envelope_of_row(message_id, row)

    async def exists(self, endpoint: str, message_id: uuid.UUID) -> bool:
        async with translated():
            return bool(await db(self.pool).fetchval(
                f"SELECT EXISTS (SELECT 1 FROM eo_token WHERE message_id = $2 AND {ADDRESSED})",
                endpoint, message_id))

    async def delete(self, endpoint: str, message_id: uuid.UUID) -> None:
        async with translated():
            await db(self.pool).execute(
                f"DELETE FROM eo_token WHERE message_id = $2 AND {ADDRESSED}",
                endpoint, message_id)

    async def count(self) -> int:
        async with translated():
            return int(await db(self.pool).fetchval("SELECT count(*) FROM eo_token"))

    async def count_of(self, addresses: Sequence[tuple[str, uuid.UUID]]) -> int:
        if not addresses:
            return 0
        pairs = sorted(set(addresses))
        async with translated():
            return int(await db(self.pool).fetchval(
                """SELECT count(*) FROM eo_token k
                     JOIN unnest($1::text[], $2::uuid[]) AS a(endpoint, message_id)
                       ON k.message_id = a.message_id
                      AND (k.endpoint = a.endpoint OR k.endpoint IS NULL)""",
                [e for e, _ in pairs], [m for _, m in pairs]))
