"""What the contract suites' adapter classes build on: a PostgreSQL pool on this run's own
contract database (created and migrated on first use, dropped at the end of the session by
tests/contract/conftest.py), closed when its context ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from adapters.postgres.admin import with_database
from adapters.postgres.pool import create_pool
from tests.support.processes import prepare_database, this_run
from tests.support.services import discover

#: this run's contract database: a second run of the suite on the same server counts its own
#: rows only (a shared database made `count()` see the other run's tokens)
DATABASE = this_run("eo_contract")


@asynccontextmanager
async def postgres_pool(max_size: int = 8) -> AsyncIterator[asyncpg.Pool]:
    """A pool on this run's contract database on the discovered PostgreSQL
    (tests/support/services.py), its schema migrated; adapters under test use endpoint names
    of their own, so tests of one run do not see each other's rows either."""
    services = discover(rabbitmq=False)
    try:
        dsn = with_database(services.postgres_dsn, DATABASE)
        await prepare_database(dsn)
        pool = await create_pool(dsn, max_size=max_size)
        try:
            yield pool
        finally:
            await pool.close()
    finally:
        services.close()
