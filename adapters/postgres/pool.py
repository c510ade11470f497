"""The asyncpg pool, the connection a task holds for a block of statements (`Session`), and
driver errors translated into the application's."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar, Token
from typing import Any

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


class _Translated:
    """The block of `translated()`; stateless, so one serves every block (cheaper than a
    generator-based context manager on a path that enters one per statement)."""

    __slots__ = ()

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        if exc is None:
            return
        if isinstance(exc, _TRANSIENT):
            raise TransientError(f"PostgreSQL: {type(exc).__name__}: {exc}") from exc
        if isinstance(exc, asyncpg.exceptions.DataError):
            raise PermanentError(f"PostgreSQL refused the data: {type(exc).__name__}: "
                                 f"{exc}") from exc


_TRANSLATED = _Translated()


def translated() -> _Translated:
    """A block that raises `TransientError` for driver errors a retry may fix,
    `PermanentError` for data the server refuses whatever the retry (SQLSTATE class 22, e.g.
    U+0000 in a jsonb string or a number out of range: the same message fails the same way
    every time); others pass unchanged."""
    return _TRANSLATED


#: the connection a task holds (`Session`): (that task, its pool, the connection)
_HELD: ContextVar[tuple[asyncio.Task[Any] | None, Any, Any] | None] = ContextVar(
    "eo_held_connection", default=None)


def db(pool: Any) -> Any:
    """Where the current task's statement on `pool` goes: the connection its `Session` on
    that pool holds, else the pool itself (both offer `execute`, `fetch`, `fetchrow`,
    `fetchval`). A task created inside another's session does not share its connection:
    one connection runs one statement at a time."""
    held = _HELD.get()
    if held is not None and held[1] is pool and held[0] is asyncio.current_task():
        return held[2]
    return pool


#: sessions holding a connection, by pool (its id)
_SESSIONS: dict[int, int] = {}


class Session:
    """`async with Session(pool):` the entering task's statements on `pool` (through `db`
    and `acquired`, which every store of this package uses) share one connection until the
    block ends: one pool acquisition for an attempt's load, commit and clear, instead of one
    per statement (`PartitionStore.session`).

    Sessions hold at most all but one of the pool's connections: when that many are held,
    the block holds none and its statements take turns on the pool as they would without
    it, so that attempts beyond the pool's size (a batch's messages sent to the single path
    together, an endpoint whose attempts wait on S3 or HTTP) still interleave, and the
    sweeper and the readiness check always find a connection. A task never waits for a
    second connection of a pool while holding one, so small pools cannot deadlock. Nested
    blocks of one task on the same pool share the outer one's connection. Raises
    `TransientError` when no connection can be had."""

    __slots__ = ("_conn", "_pool", "_reset")

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._reset: Token[tuple[asyncio.Task[Any] | None, Any, Any] | None] | None = None
        self._conn: Any = None

    async def __aenter__(self) -> None:
        pool = self._pool
        if db(pool) is not pool:
            return  # this task holds one of this pool already
        key = id(pool)
        held = _SESSIONS.get(key, 0)
        if held >= pool.get_max_size() - 1:
            return  # the rest of the pool is for the others
        _SESSIONS[key] = held + 1
        try:
            async with translated():
                self._conn = await pool.acquire()
        except BaseException:
            self._left()
            raise
        self._reset = _HELD.set((asyncio.current_task(), pool, self._conn))

    async def __aexit__(self, *exc: object) -> None:
        reset, conn = self._reset, self._conn
        if reset is None:
            return
        self._reset = self._conn = None
        _HELD.reset(reset)
        try:
            await self._pool.release(conn)
        finally:
            self._left()

    def _left(self) -> None:
        key = id(self._pool)
        held = _SESSIONS[key] - 1
        if held:
            _SESSIONS[key] = held
        else:
            del _SESSIONS[key]


class _Borrowed:
    """`acquired(pool)` inside a session: the held connection, left held at the end."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def __aenter__(self) -> Any:
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        return None


def acquired(pool: Any) -> Any:
    """`async with acquired(pool) as conn:` a connection for several statements (a
    transaction): the one the task's `Session` on `pool` holds, else one acquired from the
    pool and released at the end."""
    conn = db(pool)
    return pool.acquire() if conn is pool else _Borrowed(conn)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without asyncpg's reset query (one more round trip per use): the stores keep
    no session state (only transaction-scoped locks), and asyncpg still rolls back an open
    transaction before this runs."""


def _jsonb_binary(value: object) -> bytes:
    """`jsonb`'s binary wire form of a parameter: format version 1, then its JSON text, by
    pydantic-core (one call into Rust, where the standard library's `json.dumps` makes three
    Python calls per value). Binary, not text: asyncpg then encodes a `jsonb[]` parameter
    as a binary array, without escaping each element's text character by character. Raises
    `pydantic_core.PydanticSerializationError` for a value that has no JSON form."""
    return b"\x01" + to_json(value)


def _jsonb_value(data: bytes) -> Any:
    """The value of `jsonb`'s binary wire form (format version 1, then JSON text)."""
    return from_json(data[1:])


async def _init(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=_jsonb_binary, decoder=_jsonb_value,
                              schema="pg_catalog", format="binary")


async def create_pool(dsn: str, min_size: int = 1, max_size: int = 10,
                      max_queries: int = 50_000, read_only: bool = False) -> asyncpg.Pool:
    """A pool whose connections encode and decode `jsonb` as JSON, each replaced by a new
    one after `max_queries` queries (asyncpg's default); with `read_only`, every transaction
    of theirs is read-only (the server refuses a write: an operator's reading command).
    Raises `TransientError` when the server does not answer (the DSN is never put in the
    message)."""
    server = {"default_transaction_read_only": "on"} if read_only else None
    async with translated():
        pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init,
                                         reset=_keep_session, command_timeout=30,
                                         max_queries=max_queries, server_settings=server)
    if pool is None:  # create_pool returns None only when awaited oddly; keep mypy honest
        raise TransientError("PostgreSQL pool could not be created")
    return pool
