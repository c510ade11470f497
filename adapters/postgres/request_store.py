"""The HTTP callee's stored requests in PostgreSQL: `RequestStore` (a request is a token
while stored and not answered)."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from adapters.postgres.pool import acquired, db, translated
from adapters.postgres.token_store import envelope_of_row
from application.envelope import Envelope
from application.ports import PutResult, RequestStore

# PUT and DELETE of one request serialise on a transaction-scoped advisory lock, so a late PUT
# can never slip in between a DELETE's tombstone and its removal (protocol 6: 410 after DELETE).
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))"


class PostgresRequestStore(RequestStore):
    """Requests of callee endpoint `endpoint` in `eo_http_request`, tombstones in
    `eo_http_tombstone`."""

    def __init__(self, pool: asyncpg.Pool, endpoint: str) -> None:
        self.pool, self.endpoint = pool, endpoint

    async def put(self, request_id: uuid.UUID, envelope: Envelope) -> PutResult:
        async with translated(), acquired(self.pool) as conn, conn.transaction():
            await conn.execute(_LOCK, self.endpoint, str(request_id))
            if await conn.fetchval("SELECT 1 FROM eo_http_tombstone WHERE endpoint = $1 AND "
                                   "request_id = $2", self.endpoint, request_id):
                return PutResult.GONE
            body = await conn.fetchval(
                "SELECT body FROM eo_http_request WHERE endpoint = $1 AND request_id = $2",
                self.endpoint, request_id)
            if body is not None:
                return PutResult.SAME if bytes(body) == envelope.body else PutResult.DIFFERENT
            await conn.execute(
                "INSERT INTO eo_http_request (endpoint, request_id, type, body, headers) "
                "VALUES ($1, $2, $3, $4, $5)", self.endpoint, request_id, envelope.type,
                envelope.body, dict(envelope.headers))
            return PutResult.CREATED

    async def known(self, request_id: uuid.UUID) -> bool:
        async with translated():
            return bool(await db(self.pool).fetchval(
                "SELECT EXISTS (SELECT 1 FROM eo_http_request WHERE endpoint = $1 AND "
                "request_id = $2)", self.endpoint, request_id))

    async def remove(self, request_id: uuid.UUID, now: datetime) -> None:
        async with translated(), acquired(self.pool) as conn, conn.transaction():
            await conn.execute(_LOCK, self.endpoint, str(request_id))
            await conn.execute(
                "INSERT INTO eo_http_tombstone (endpoint, request_id, deleted_at) "
                "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", self.endpoint, request_id, now)
            await conn.execute("DELETE FROM eo_http_request WHERE endpoint = $1 AND "
                               "request_id = $2", self.endpoint, request_id)

    async def purge_tombstones(self, before: datetime) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(
                "WITH gone AS (DELETE FROM eo_http_tombstone WHERE endpoint = $1 AND "
                "deleted_at < $2 RETURNING 1) SELECT count(*) FROM gone", self.endpoint, before))

    async def get(self, message_id: uuid.UUID) -> Envelope | None:
        async with translated():
            row = await db(self.pool).fetchrow(
                "SELECT type, body, headers FROM eo_http_request WHERE endpoint = $1 AND "
                "request_id = $2 AND NOT answered", self.endpoint, message_id)
        return envelope_of_row(message_id, row)

    async def exists(self, message_id: uuid.UUID) -> bool:
        return await self.get(message_id) is not None

    async def delete(self, message_id: uuid.UUID) -> None:
        """Mark the request answered (the callee's consume step)."""
        async with translated():
            await db(self.pool).execute(
                "UPDATE eo_http_request SET answered = true WHERE endpoint = $1 AND "
                "request_id = $2", self.endpoint, message_id)

    async def count(self) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(
                "SELECT count(*) FROM eo_http_request WHERE endpoint = $1", self.endpoint))
