"""The sweeper's queries and the gauges of the PostgreSQL transactional store (one endpoint's
rows): finished transactions, due clean-ups, abandoned attempts to take over, processed-message
rows to purge."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from adapters.postgres.pool import db, translated
from adapters.postgres.record_rows import side_effect_record, transaction_record
from adapters.postgres.sql import upkeep
from application.ports import StoreGauges, SweeperQueries
from application.records import Abandoned, DeferredCleanup, Kind, TransactionRecord


class PostgresSweeperQueries(SweeperQueries, StoreGauges):
    """The sweeper's queries and the gauges on the rows of endpoint `endpoint` in `pool`'s
    `eo_*` tables (the transactional store's; see `PostgresTransactionalStore`)."""

    def __init__(self, pool: asyncpg.Pool, endpoint: str) -> None:
        self.pool, self.endpoint = pool, endpoint

    async def committed_before(self, cutoff: datetime) -> Sequence[TransactionRecord]:
        async with translated():
            rows = await db(self.pool).fetch(upkeep.COMMITTED_BEFORE, self.endpoint, cutoff)
        return [transaction_record(r["partition_key"], r) for r in rows]

    async def due_cleanups(self, now: datetime) -> Sequence[DeferredCleanup]:
        async with translated():
            rows = await db(self.pool).fetch(upkeep.DUE_CLEANUPS, self.endpoint, now)
        return [DeferredCleanup(r["cleanup_id"], Kind(r["kind"]), r["key"], r["payload"],
                                r["due"]) for r in rows]

    async def drop_cleanups(self, cleanup_ids: Sequence[int]) -> None:
        async with translated():
            await db(self.pool).execute(upkeep.DROP_CLEANUPS, self.endpoint, list(cleanup_ids))

    async def abandoned(self, cutoff: datetime) -> Sequence[Abandoned]:
        async with translated():
            rows = await db(self.pool).fetch(upkeep.ABANDONED, self.endpoint, cutoff)
        return [Abandoned(r["partition_key"], r["version"],
                          tuple(side_effect_record(r["partition_key"], x) for x in r["records"]))
                for r in rows]

    async def take_over(self, abandoned: Abandoned, cleanup_due: datetime) -> bool:
        recs = abandoned.records
        async with translated():
            taken = await db(self.pool).fetchval(
                upkeep.TAKE_OVER, self.endpoint, abandoned.partition, abandoned.version,
                [str(r.kind) for r in recs], [r.key for r in recs],
                [dict(r.payload) for r in recs], cleanup_due)
        return bool(taken)

    async def purge_processed(self, before: datetime) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(upkeep.PURGE_PROCESSED, self.endpoint, before))

    async def unfinished_count(self) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(upkeep.UNFINISHED, self.endpoint))

    async def cleanup_count(self) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(upkeep.CLEANUP_COUNT, self.endpoint))
