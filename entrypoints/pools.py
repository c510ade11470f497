"""The PostgreSQL pools a process opens, and the stores read on a pool alone: light to import
(no dependency-injector, no broker, no S3 client), so that an operator's command that reads
one table starts in a fraction of a second (`eo dead-letters list`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from adapters.postgres.admin import database_refusal
from adapters.postgres.dead_letter_store import PostgresDeadLetterStore
from adapters.postgres.pool import create_pool
from application.ports import Clock
from entrypoints.settings import Settings


@dataclass(frozen=True)
class Pools:
    """The endpoint database's pool and the token store's (the same one when co-located)."""

    endpoint: Any
    tokens: Any

    @property
    def colocated(self) -> bool:
        """Whether tokens live in the endpoint database (protocol 3.2's fast path)."""
        return self.endpoint is self.tokens


async def opened(dsn: str, **options: Any) -> Any:
    """`create_pool(dsn, **options)`. Raises `TransientError` when the server does not
    answer, `PermanentError` when it refuses (no such database, refused credentials:
    `adapters.postgres.admin.database_refusal`)."""
    try:
        return await create_pool(dsn, **options)
    except asyncpg.PostgresError as exc:
        raise database_refusal(exc, dsn) from exc


async def pools_resource(settings: Settings) -> AsyncIterator[Pools]:
    """dependency-injector `Resource`: one pool per distinct DSN, closed on shutdown; raises
    as `opened`."""
    endpoint = await opened(settings.database(), max_size=settings.postgres.pool_size)
    tokens = endpoint
    try:
        if settings.tokens_database() != settings.database():
            tokens = await opened(settings.tokens_database(),
                                  max_size=settings.postgres.pool_size)
        yield Pools(endpoint, tokens)
    finally:
        if tokens is not endpoint:
            await tokens.close()
        await endpoint.close()


@asynccontextmanager
async def endpoint_pool(settings: Settings) -> AsyncIterator[Any]:
    """A pool of one connection on the endpoint database, closed on exit; raises as
    `opened`."""
    pool = await opened(settings.database(), min_size=1, max_size=1)
    try:
        yield pool
    finally:
        await pool.close()


def dead_letter_store_of(pool: Any, clock: Clock) -> PostgresDeadLetterStore:
    """The service's dead letters, in the endpoint database that `pool` opens."""
    return PostgresDeadLetterStore(pool, clock)
