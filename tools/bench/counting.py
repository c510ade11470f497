"""A counting proxy of an asyncpg pool: database round trips made through it, per statement."""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

#: Label of the reset query asyncpg sends when a connection goes back to the pool.
RESET = "(asyncpg reset on release)"


@cache
def label(query: str) -> str:
    """A short, stable name for a statement: its first 60 characters, whitespace folded.
    Cached: the statements are few, and folding a long one on every call cost the paths
    with long statements (the template's) more of the bench's own overhead than the
    references (1 % of the unbatched token path's Python, py-spy)."""
    return " ".join(query.split())[:60]


class RoundTrips:
    """Round trips counted by statement label. `total` is what the bench reports: every
    execute/fetch/fetchrow/fetchval and each transaction's BEGIN and COMMIT (or ROLLBACK);
    `resets` counts the reset query asyncpg runs on every release to the pool (one more
    round trip per acquisition), kept apart because no store statement asks for it."""

    def __init__(self) -> None:
        self.by_statement: Counter[str] = Counter()
        self.resets = 0

    def hit(self, query: str) -> None:
        """Count one round trip of `query`."""
        self.by_statement[label(query)] += 1

    @property
    def total(self) -> int:
        """Round trips asked for by the code (resets excluded)."""
        return sum(self.by_statement.values())

    def reset(self) -> None:
        """Forget every count (between runs)."""
        self.by_statement.clear()
        self.resets = 0


class _CountingTransaction:
    """`conn.transaction()`: BEGIN on entry and COMMIT/ROLLBACK on exit, one round trip each."""

    def __init__(self, inner: Any, counts: RoundTrips) -> None:
        self._inner, self._counts = inner, counts

    async def __aenter__(self) -> Any:
        self._counts.hit("BEGIN")
        return await self._inner.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        self._counts.hit("ROLLBACK" if exc[0] is not None else "COMMIT")
        return await self._inner.__aexit__(*exc)


class CountingConnection:
    """An acquired connection whose statements and transactions are counted."""

    def __init__(self, inner: Any, counts: RoundTrips) -> None:
        self._inner, self._counts = inner, counts

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._counts.hit(query)
        return await self._inner.execute(query, *args, **kwargs)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._counts.hit(query)
        return await self._inner.fetch(query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._counts.hit(query)
        return await self._inner.fetchrow(query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._counts.hit(query)
        return await self._inner.fetchval(query, *args, **kwargs)

    def transaction(self, **kwargs: Any) -> _CountingTransaction:
        return _CountingTransaction(self._inner.transaction(**kwargs), self._counts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Acquire:
    """`CountingPool.acquire()`: awaited, a `CountingConnection` to `release`; or an async
    context manager that releases it (as asyncpg's own)."""

    def __init__(self, pool: CountingPool, kwargs: dict[str, Any]) -> None:
        self._pool, self._kwargs = pool, kwargs
        self._conn: CountingConnection | None = None

    def __await__(self) -> Any:
        return self._acquired().__await__()

    async def _acquired(self) -> CountingConnection:
        inner = await self._pool._inner.acquire(**self._kwargs)
        return CountingConnection(inner, self._pool.counts)

    async def __aenter__(self) -> CountingConnection:
        self._conn = conn = await self._acquired()
        return conn

    async def __aexit__(self, *exc: Any) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.release(conn)


class CountingPool:
    """Stands in for an `asyncpg.Pool` given to the stores: each pool-level call is one
    counted round trip, `acquire()` yields a `CountingConnection`."""

    def __init__(self, inner: Any, counts: RoundTrips | None = None) -> None:
        self._inner = inner
        self.counts = counts or RoundTrips()

    async def _call(self, method: str, query: str, *args: Any, **kwargs: Any) -> Any:
        self.counts.hit(query)
        return await getattr(self._inner, method)(query, *args, **kwargs)

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call("execute", query, *args, **kwargs)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call("fetch", query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call("fetchrow", query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call("fetchval", query, *args, **kwargs)

    def acquire(self, **kwargs: Any) -> _Acquire:
        return _Acquire(self, kwargs)

    async def release(self, connection: CountingConnection, **kwargs: Any) -> None:
        await self._inner.release(connection._inner, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
