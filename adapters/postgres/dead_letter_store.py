"""Dead letters in PostgreSQL (`eo_dead_letter`, revisions 0011 and 0013): `DeadLetterStore`."""

from __future__ import annotations

import base64
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

import asyncpg

from adapters.postgres.pool import acquired, db, translated
from application.ports import Clock, DeadLetterQuery, DeadLetterStore, HeldDeadLetter
from application.records import DeadLetter, DeadLetterReason, DeadLetterStatus

_COLUMNS = """dead_letter_id, endpoint, message_id, raw_message_id, producer, type, body,
  headers, digest, replayable, origin_id, origin_producer, reasons, status, replays,
  acted_at, acted_by, discard_reason, originals"""

#: A message dead-lettered again (same endpoint, producer, message ID and digest) is the
#: same row: its new reasons are appended (those it has are not repeated: the queue's
#: copies are moved at least once) and it is `dead` again. One statement per unique index:
#: a UUID message ID (0011's), a message ID that is not one (0013's).
_ADD = """
INSERT INTO eo_dead_letter
  (endpoint, message_id, raw_message_id, producer, type, body, headers, digest, replayable,
   origin_id, origin_producer, reasons, first_at, last_at, originals)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
{conflict}
RETURNING dead_letter_id"""
_MERGE = """
DO UPDATE SET
  reasons = (SELECT jsonb_agg(r ORDER BY r->>'at') FROM (
               SELECT DISTINCT r FROM jsonb_array_elements(
                 eo_dead_letter.reasons || excluded.reasons) AS x(r)) AS d),
  first_at = least(eo_dead_letter.first_at, excluded.first_at),
  last_at = greatest(eo_dead_letter.last_at, excluded.last_at),
  headers = excluded.headers, status = 'dead'"""
_ADD_BY_MESSAGE_ID = _ADD.format(conflict=(
    "ON CONFLICT (endpoint, producer, message_id, digest)\n"
    "  WHERE message_id IS NOT NULL AND digest IS NOT NULL" + _MERGE))
_ADD_BY_RAW_MESSAGE_ID = _ADD.format(conflict=(
    "ON CONFLICT (endpoint, producer, raw_message_id, digest)\n"
    "  WHERE message_id IS NULL AND raw_message_id IS NOT NULL AND digest IS NOT NULL"
    + _MERGE))
_ADD_ALONE = _ADD.format(conflict="")

_FIND = f"""
SELECT {_COLUMNS} FROM eo_dead_letter
 WHERE (cardinality($1::text[]) = 0 OR endpoint = ANY($1))
   AND (cardinality($2::bigint[]) = 0 OR dead_letter_id = ANY($2))
   AND ($3::text IS NULL OR status = $3)
   AND ($4::text IS NULL OR strpos(lower(reasons->-1->>'reason'), lower($4)) > 0)
   AND ($5::timestamptz IS NULL OR last_at < $5)
   AND ($6::timestamptz IS NULL OR last_at >= $6)
 ORDER BY last_at, dead_letter_id
 LIMIT $7"""


def _reasons(reasons: Any) -> tuple[DeadLetterReason, ...]:
    return tuple(DeadLetterReason(datetime.fromisoformat(r["at"]), r["reason"], r["attempt"])
                 for r in reasons)


def _letter(row: Any) -> DeadLetter:
    return DeadLetter(
        endpoint=row["endpoint"], message_id=row["message_id"],
        raw_message_id=row["raw_message_id"], producer=row["producer"], type=row["type"],
        body=bytes(row["body"]), headers=MappingProxyType(dict(row["headers"])),
        digest=row["digest"], replayable=row["replayable"], origin_id=row["origin_id"],
        origin_producer=row["origin_producer"], reasons=_reasons(row["reasons"]),
        dead_letter_id=row["dead_letter_id"], status=DeadLetterStatus(row["status"]),
        replays=row["replays"], acted_at=row["acted_at"], acted_by=row["acted_by"],
        discard_reason=row["discard_reason"], originals=MappingProxyType(
            {k: base64.b64decode(v) for k, v in row["originals"].items()}))


@dataclass
class _Held(HeldDeadLetter):
    """A row locked by the hold's open transaction; its mark commits with it."""

    letter: DeadLetter
    conn: asyncpg.Connection
    clock: Clock

    async def replayed(self, by: str) -> None:
        await self.conn.execute(
            "UPDATE eo_dead_letter SET status = 'replayed', replays = replays + 1, "
            "acted_at = $2, acted_by = $3, discard_reason = NULL WHERE dead_letter_id = $1",
            self.letter.dead_letter_id, self.clock.now(), by)

    async def discarded(self, by: str, why: str) -> None:
        await self.conn.execute(
            "UPDATE eo_dead_letter SET status = 'discarded', acted_at = $2, acted_by = $3, "
            "discard_reason = $4 WHERE dead_letter_id = $1",
            self.letter.dead_letter_id, self.clock.now(), by, why)


class PostgresDeadLetterStore(DeadLetterStore):
    """Every endpoint's dead letters in one table of the endpoints' database. A hold is a
    transaction holding the row's lock (`FOR UPDATE SKIP LOCKED`: a second operator finds
    it held, never waits); its mark commits with it. Times of marks come from `clock`."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock) -> None:
        self.pool, self.clock = pool, clock

    async def add(self, letter: DeadLetter) -> int:
        reasons = [{"at": r.at.isoformat(), "reason": r.reason, "attempt": r.attempt}
                   for r in letter.reasons]
        if letter.digest is None:
            statement = _ADD_ALONE
        elif letter.message_id is not None:
            statement = _ADD_BY_MESSAGE_ID
        else:
            statement = _ADD_BY_RAW_MESSAGE_ID if letter.raw_message_id else _ADD_ALONE
        originals = {k: base64.b64encode(v).decode() for k, v in letter.originals.items()}
        async with translated():
            return int(await db(self.pool).fetchval(
                statement, letter.endpoint, letter.message_id, letter.raw_message_id,
                letter.producer, letter.type, letter.body, dict(letter.headers),
                letter.digest, letter.replayable, letter.origin_id, letter.origin_producer,
                reasons, letter.first_at, letter.last_at, originals))

    async def find(self, query: DeadLetterQuery) -> list[DeadLetter]:
        if query.limit < 1:
            raise ValueError("limit must be at least 1")
        async with translated():
            rows = await db(self.pool).fetch(
                _FIND, list(query.endpoints), list(query.ids),
                None if query.status is None else str(query.status), query.reason,
                query.before, query.after, query.limit)
        return [_letter(r) for r in rows]

    @asynccontextmanager
    async def hold(self, dead_letter_id: int) -> AsyncIterator[HeldDeadLetter | None]:
        async with translated(), acquired(self.pool) as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT {_COLUMNS} FROM eo_dead_letter WHERE dead_letter_id = $1 "
                "FOR UPDATE SKIP LOCKED", dead_letter_id)
            yield None if row is None else _Held(_letter(row), conn, self.clock)

    async def waiting(self) -> list[tuple[str, uuid.UUID]]:
        async with translated():
            rows = await db(self.pool).fetch(
                "SELECT endpoint, message_id FROM eo_dead_letter "
                "WHERE status = 'dead' AND message_id IS NOT NULL")
        return [(r["endpoint"], r["message_id"]) for r in rows]

    async def counts(self) -> dict[str, dict[str, int]]:
        async with translated():
            rows = await db(self.pool).fetch(
                "SELECT endpoint, status, count(*) AS n FROM eo_dead_letter "
                "GROUP BY endpoint, status")
        counts: defaultdict[str, dict[str, int]] = defaultdict(dict)
        for r in rows:
            counts[r["endpoint"]][r["status"]] = int(r["n"])
        return dict(counts)

    async def purge(self, before: datetime) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(
                "WITH gone AS (DELETE FROM eo_dead_letter WHERE status <> 'dead' "
                "AND coalesce(acted_at, last_at) < $1 RETURNING 1) SELECT count(*) FROM gone",
                before))

