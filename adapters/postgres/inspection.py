"""`StoreInspection` on PostgreSQL: the endpoint database's protocol tables and the token
table, read-only (`eo states`, `eo inspect`, reports)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from adapters.postgres.pool import db, translated
from application.ports import AtRest, StoreInspection

#: per endpoint: (what, count, age of the oldest in seconds or NULL)
_AT_REST = """
SELECT 'unfinished' AS what, endpoint, count(*) AS n,
       extract(epoch FROM now() - min(committed_at))::float8 AS age
  FROM eo_transaction_record WHERE message_id IS NOT NULL GROUP BY endpoint
UNION ALL SELECT 'side_effect_records', endpoint, count(*), NULL
  FROM eo_side_effect_record GROUP BY endpoint
UNION ALL SELECT 'deferred_cleanups', endpoint, count(*), NULL
  FROM eo_deferred_cleanup GROUP BY endpoint
UNION ALL SELECT 'requests', endpoint, count(*), NULL FROM eo_http_request GROUP BY endpoint
UNION ALL SELECT 'inbox_rows', endpoint, count(*), NULL
  FROM eo_inbox WHERE relayed_at IS NULL GROUP BY endpoint"""


class StatesReader(Protocol):
    """A store that reads its endpoint's states (`PostgresTransactionalStore`,
    `PostgresStateStream`)."""

    async def states(self, limit: int | None = None, partition: str | None = None
                     ) -> dict[str, Any]: ...


class PostgresInspection(StoreInspection):
    """The stores of one service: `pool` on the endpoint database, `tokens_pool` on the token
    store's (the same pool when co-located), and per endpoint where its states are read
    (`readers`: its transactional store, or its state stream on the `state` strategy)."""

    def __init__(self, pool: Any, tokens_pool: Any, readers: Mapping[str, StatesReader]
                 ) -> None:
        self.pool, self.tokens_pool, self.readers = pool, tokens_pool, readers

    async def states(self, endpoint: str, limit: int | None = None,
                     partition: str | None = None) -> dict[str, Any]:
        return await self.readers[endpoint].states(limit, partition)

    async def at_rest(self) -> AtRest:
        async with translated():
            tokens = await db(self.tokens_pool).fetchval("SELECT count(*) FROM eo_token")
            rows = await db(self.pool).fetch(_AT_REST)
        rest = AtRest(tokens=int(tokens))
        for row in rows:
            getattr(rest, row["what"])[row["endpoint"]] = int(row["n"])
            if row["age"] is not None:
                rest.oldest_unfinished_s[row["endpoint"]] = float(row["age"])
        return rest
