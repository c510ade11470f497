"""Fixtures of the integration modules that run processes: each module defines its own
`where` (its database and virtual host: tests/support/processes.py); these give a test a
publisher on that broker and a pool on that database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from adapters.postgres.pool import create_pool
from tests.support.processes import Rabbit, Where, publisher


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
