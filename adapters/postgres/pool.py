"""The asyncpg pool as a resource, and driver errors translated into the application's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pydantic_core import from_json, to_json

from application.errors import PermanentError, TransientError

#: Errors after which a retry may succeed: lost connections, timeouts, serialization
#: failures and deadlocks, a server shutting down.
_TRANSIENT = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)


@asynccontextmanager
async def translated() -> AsyncIterator[None]:
    """Raise `TransientError` for driver errors a retry may fix, `PermanentError` for data
    the server refuses whatever the retry (SQLSTATE class 22, e.g. U+0000 in a jsonb string
    or a number out of range: the same message fails the same way every time); others pass
    unchanged."""
    try:
        yield
    except _TRANSIENT as exc:
        raise TransientError(f"PostgreSQL: {type(exc).__name__}: {exc}") from exc
    except asyncpg.exceptions.DataError as exc:
        raise PermanentError(f"PostgreSQL refused the data: {type(exc).__name__}: "
                             f"{exc}") from exc


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without asyncpg's reset query (one more round trip per use): the stores keep
    no session state (only transaction-scoped locks), and asyncpg still rolls back an open
    transaction before this runs."""


def _jsonb_text(value: object) -> str:
    """JSON text of a `jsonb` parameter, by pydantic-core (one call into Rust, where the
    standard library's `json.dumps` makes three Python calls per value). Raises
    `pydantic_core.PydanticSerializationError` for a value that has no JSON form."""
    return to_json(value).decode()


async def _init(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=_jsonb_text, decoder=from_json,
                              schema="pg_catalog")


async def create_pool(dsn: str, min_size: int = 1, max_size: int = 10,
                      max_queries: int = 50_000) -> asyncpg.Pool:
    """A pool whose connections encode and decode `jsonb` as JSON, each replaced by a new
    one after `max_queries` queries (asyncpg's default). Raises `TransientError` when the
    server does not answer (the DSN is never put in the message)."""
    async with translated():
        pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init,
                                         reset=_keep_session, command_timeout=30,
                                         max_queries=max_queries)
    if pool is None:  # create_pool returns None only when awaited oddly; keep mypy honest
        raise TransientError("PostgreSQL pool could not be created")
    return pool


async def pool_resource(dsn: str, min_size: int = 1, max_size: int = 10
                        ) -> AsyncIterator[asyncpg.Pool]:
    """dependency-injector `Resource`: the pool, closed on shutdown."""
    pool = await create_pool(dsn, min_size, max_size)
    try:
        yield pool
    finally:
        await pool.close()
