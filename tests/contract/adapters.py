"""What the contract suites' adapter classes build on: a PostgreSQL pool on the test database
(migrated), closed when its context ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from tests.support.services import discover


@asynccontextmanager
async def postgres_pool(max_size: int = 8) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the discovered PostgreSQL (tests/support/services.py), its schema migrated;
    adapters under test use endpoint names of their own, so runs sharing the database never
    see each other's rows."""
    services = discover(rabbitmq=False)
    try:
        await upgrade_async(services.postgres_dsn)
        pool = await create_pool(services.postgres_dsn, max_size=max_size)
        try:
            yield pool
        finally:
            await pool.close()
    finally:
        services.close()
