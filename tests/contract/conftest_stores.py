"""Fixtures building each store adapter for the contract suites (imported by them)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.system.clock import ManualClock
from tests.support.counter import Tally
from tests.support.services import discover

ADAPTERS = ["memory", "postgres"]


async def postgres_pool():  # type: ignore[no-untyped-def]
    services = discover(rabbitmq=False)
    await upgrade_async(services.postgres_dsn)
    return await create_pool(services.postgres_dsn, max_size=8), services


@pytest.fixture(params=ADAPTERS)
async def store_and_clock(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[object, ManualClock]]:
    clock = ManualClock()
    if request.param == "memory":
        yield MemoryTransactionalStore(clock), clock
        return
    pool, services = await postgres_pool()
    try:
        yield PostgresTransactionalStore(pool, f"contract-{uuid.uuid4()}", Tally, clock), clock
    finally:
        await pool.close()
        services.close()


@pytest.fixture(params=ADAPTERS)
async def token_store(request: pytest.FixtureRequest) -> AsyncIterator[object]:
    if request.param == "memory":
        yield MemoryTokenStore()
        return
    pool, services = await postgres_pool()
    try:
        yield PostgresTokenStore(pool)
    finally:
        await pool.close()
        services.close()


@pytest.fixture(params=ADAPTERS)
async def colocated(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[object, object, ManualClock]]:
    """A store holding the token table (co-located fast path) with that token store."""
    clock = ManualClock()
    if request.param == "memory":
        tokens = MemoryTokenStore()
        yield MemoryTransactionalStore(clock, tokens), tokens, clock
        return
    pool, services = await postgres_pool()
    try:
        store = PostgresTransactionalStore(pool, f"contract-{uuid.uuid4()}", Tally, clock,
                                           holds_tokens=True)
        yield store, PostgresTokenStore(pool), clock
    finally:
        await pool.close()
        services.close()
