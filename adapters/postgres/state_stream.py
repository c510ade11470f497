"""The state stream in PostgreSQL: table `eo_state_entry`, one row per processed message."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

import asyncpg

from adapters.postgres.pool import db, translated
from application.codec import decode_state, from_jsonable, to_jsonable
from application.errors import Conflict, MessageIdReused, OutsideRetention
from application.ports import Clock, StateStream
from application.records import StateEntry

#: The message's own entry, the entry just before it and the newest entry: one snapshot.
LOAD = """
SELECT e.version, e.message_id, e.state, e.recorded, e.appended_at
  FROM eo_state_entry e
 WHERE e.endpoint = $1 AND e.partition_key = $2
   AND (e.message_id = $3
        OR e.version = (SELECT h.version - 1 FROM eo_state_entry h
                         WHERE h.endpoint = $1 AND h.partition_key = $2 AND h.message_id = $3)
        OR e.version = (SELECT max(l.version) FROM eo_state_entry l
                         WHERE l.endpoint = $1 AND l.partition_key = $2))"""

#: Optimistic append: only at newest version $3; a concurrent append of the same version
#: meets the primary key and inserts nothing. The same message ID appended on another
#: partition (another body under the ID) violates `MESSAGE_KEY` (revision 0009): an error,
#: never a second commit of the ID.
APPEND = """
INSERT INTO eo_state_entry
  (endpoint, partition_key, version, message_id, state, recorded, appended_at)
SELECT $1, $2, $3 + 1, $4, $5, $6, $7
 WHERE coalesce((SELECT max(version) FROM eo_state_entry
                  WHERE endpoint = $1 AND partition_key = $2), 0) = $3
ON CONFLICT (endpoint, partition_key, version) DO NOTHING
RETURNING version"""

#: the unique index through which an entry claims its message ID for the endpoint
MESSAGE_KEY = "eo_state_entry_message"

#: the partition whose entry holds message $2
CLAIMED_BY = """
SELECT partition_key FROM eo_state_entry WHERE endpoint = $1 AND message_id = $2"""

#: Drop entries whose next entry is older than the cutoff (the newest one has none: kept).
TRUNCATE = """
WITH old AS (
  SELECT partition_key, version,
         lead(appended_at) OVER (PARTITION BY partition_key ORDER BY version) AS next_at
    FROM eo_state_entry WHERE endpoint = $1),
gone AS (
  DELETE FROM eo_state_entry e USING old
   WHERE e.endpoint = $1 AND e.partition_key = old.partition_key
     AND e.version = old.version AND old.next_at < $2
  RETURNING 1)
SELECT count(*) FROM gone"""


class PostgresStateStream(StateStream):
    """Entries of endpoint `endpoint` (several endpoints may share the table); states are
    JSONB decoded into `state_type`; times come from `clock`."""

    def __init__(self, pool: asyncpg.Pool, endpoint: str, state_type: type, clock: Clock
                 ) -> None:
        self.pool, self.endpoint, self.state_type, self.clock = pool, endpoint, state_type, clock

    def _entry(self, partition: str, row: Any) -> StateEntry:
        return StateEntry(partition, int(row["version"]), row["message_id"],
                          decode_state(self.state_type, row["state"], partition),
                          MappingProxyType(dict(row["recorded"])), row["appended_at"])

    async def load(
        self, partition: str, message_id: uuid.UUID
    ) -> tuple[Any, int, StateEntry | None]:
        async with translated():
            rows = await db(self.pool).fetch(LOAD, self.endpoint, partition, message_id)
        by_version = {int(r["version"]): r for r in rows}
        hit = next((r for r in rows if r["message_id"] == message_id), None)
        if hit is not None:
            entry = self._entry(partition, hit)
            if entry.version == 1:
                return None, 0, entry
            before = by_version.get(entry.version - 1)
            if before is None:
                raise OutsideRetention(
                    f"partition {partition}: the entry before message {message_id} was "
                    "truncated (duplicate older than the retention window)")
            return (decode_state(self.state_type, before["state"], partition),
                    entry.version - 1, entry)
        if not by_version:
            return None, 0, None
        newest = by_version[max(by_version)]
        return (decode_state(self.state_type, newest["state"], partition),
                int(newest["version"]), None)

    async def append(
        self,
        partition: str,
        expected_version: int,
        message_id: uuid.UUID,
        state: Any,
        recorded: Mapping[str, Any],
    ) -> int:
        async with translated():
            try:
                version = await db(self.pool).fetchval(
                    APPEND, self.endpoint, partition, expected_version, message_id,
                    to_jsonable(state), dict(recorded), self.clock.now())
            except asyncpg.UniqueViolationError:
                holder = await db(self.pool).fetchval(CLAIMED_BY, self.endpoint, message_id)
                if holder is not None and holder != partition:
                    raise MessageIdReused(message_id) from None
                version = None  # this partition's own entry: a concurrent copy appended it
        if version is None:
            raise Conflict(f"partition {partition}: append at v{expected_version} of "
                           f"message {message_id}")
        return int(version)

    async def truncate(self, before: datetime) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(TRUNCATE, self.endpoint, before))

    async def states(self, limit: int | None = None, partition: str | None = None
                     ) -> dict[str, Any]:
        """The newest state of every partition (oracles, audits), in key order; with `limit`,
        of the first `limit` partitions (`eo states`); with `partition`, of that one only
        (nothing when it has no entry)."""
        query = "SELECT DISTINCT ON (partition_key) partition_key, state FROM eo_state_entry " \
                "WHERE endpoint = $1"
        args: list[Any] = [self.endpoint]
        if partition is not None:
            args.append(partition)
            query += f" AND partition_key = ${len(args)}"
        query += " ORDER BY partition_key, version DESC"
        if limit is not None:
            args.append(limit)
            query += f" LIMIT ${len(args)}"
        async with translated():
            rows = await db(self.pool).fetch(query, *args)
        return {r["partition_key"]: from_jsonable(self.state_type, r["state"]) for r in rows}

    async def entry_count(self) -> int:
        """Entries kept for this endpoint."""
        async with translated():
            return int(await db(self.pool).fetchval(
                "SELECT count(*) FROM eo_state_entry WHERE endpoint = $1", self.endpoint))
