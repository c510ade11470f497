"""`eo states`: one endpoint's business states on the real services, read through its store
as the tools read them (the transaction records' states, or the newest entry of each
partition's stream for an endpoint on the `state` strategy), a bounded page in partition-key
order, on a read-only connection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.postgres.pool import create_pool
from adapters.system.clock import SystemClock
from application.codec import to_jsonable
from application.strategy import Strategy
from entrypoints.local import postgres_inspection
from entrypoints.settings import Service, Settings


@dataclass(frozen=True)
class StatesPage:
    """Endpoint `endpoint`'s states (`strategy` says where they live): partition key ->
    the domain's state object, the first `limit` partitions in key order; `more`: there are
    partitions beyond them."""

    endpoint: str
    strategy: Strategy
    states: dict[str, Any]
    limit: int
    more: bool

    def as_json(self) -> dict[str, Any]:
        """The page JSON-ready: the states as the store keeps them."""
        return {"endpoint": self.endpoint, "strategy": str(self.strategy),
                "states": {p: to_jsonable(s) for p, s in self.states.items()},
                "limit": self.limit, "more": self.more}


async def read_states(settings: Settings, service: Service, endpoint: str, limit: int,
                      partition: str | None = None) -> StatesPage:
    """The first `limit` partitions' states of registered `endpoint` in the endpoint
    database (`partition`: that one only), read through its store on a read-only
    connection. Raises asyncpg's errors and OSError (a server away, a database not
    migrated), `TransientError`, and `MalformedMessage` for a stored state that does not
    decode as the endpoint's state type."""
    strategy = service.strategy(endpoint)
    clock = SystemClock()
    pool = await create_pool(settings.database(), min_size=1, max_size=1, read_only=True)
    try:
        inspection = postgres_inspection(pool, pool, clock, service)
        found = await inspection.states(endpoint, limit + 1, partition)
    finally:
        await pool.close()
    shown = dict(list(found.items())[:limit])
    return StatesPage(endpoint, strategy, shown, limit, len(found) > limit)
