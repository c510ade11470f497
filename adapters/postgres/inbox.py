"""A boundary endpoint's inbox in PostgreSQL (`eo_inbox`): `Inbox`, and the staging tables
through which a bulk producer (the Spark ingest) merges rows in one conflict-safe statement."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from adapters.postgres.pool import acquired, db, translated
from application.envelope import Envelope
from application.ports import Clock, Inbox, InboxClaim

#: Staging tables are named `eo_inbox_stage_<YYYYmmddHHMMSS>_<hex>` (UTC creation time).
STAGING_PREFIX = "eo_inbox_stage_"
_STAGING = re.compile(rf"^{STAGING_PREFIX}(\d{{14}})_[0-9a-f]{{8}}$")


def _count(status: str) -> int:
    """The row count of a command status such as `INSERT 0 42` or `DELETE 3`."""
    return int(status.rsplit(" ", 1)[-1])


@dataclass
class PostgresClaim(InboxClaim):
    """Rows locked (`FOR UPDATE SKIP LOCKED`) by the claim's open transaction."""

    envelopes: Sequence[Envelope]
    conn: asyncpg.Connection
    endpoint: str
    clock: Clock

    async def mark_relayed(self, rows: Sequence[Envelope]) -> None:
        if rows:
            await self.conn.execute(
                "UPDATE eo_inbox SET relayed_at = $4 WHERE endpoint = $1 "
                "AND (producer, message_id) IN (SELECT * FROM unnest($2::text[], $3::uuid[]))",
                self.endpoint, [e.producer for e in rows], [e.message_id for e in rows],
                self.clock.now())


class PostgresInbox(Inbox):
    """Endpoint `endpoint`'s rows of `eo_inbox`, keyed by (endpoint, producer, natural message
    ID); the producer is the role that inserted the row (the column's default,
    `current_user`: revision 0010), whatever the envelope says.

    A claim is one transaction holding its rows' locks while the relay publishes, so two
    gateway processes never publish the same rows at once; its marks commit with it. Times
    (`received_at` of `add`, `relayed_at`) come from `clock`."""

    def __init__(self, pool: asyncpg.Pool, endpoint: str, clock: Clock) -> None:
        self.pool, self.endpoint, self.clock = pool, endpoint, clock

    async def add(self, envelopes: Sequence[Envelope]) -> int:
        if not envelopes:
            return 0
        async with translated():
            status = await db(self.pool).execute(
                """INSERT INTO eo_inbox (endpoint, message_id, type, body, received_at)
                   SELECT $1, m, t, b, $5
                   FROM unnest($2::uuid[], $3::text[], $4::bytea[]) AS u(m, t, b)
                   ON CONFLICT (endpoint, producer, message_id) DO NOTHING""",
                self.endpoint, [e.message_id for e in envelopes], [e.type for e in envelopes],
                [e.body for e in envelopes], self.clock.now())
        return _count(status)

    @asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[InboxClaim]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        async with translated(), acquired(self.pool) as conn, conn.transaction():
            rows = await conn.fetch(
                """SELECT message_id, type, body, producer FROM eo_inbox
                   WHERE endpoint = $1 AND relayed_at IS NULL
                   ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED""",
                self.endpoint, limit)
            yield PostgresClaim([Envelope(r["message_id"], r["type"], bytes(r["body"]),
                                          producer=r["producer"])
                                 for r in rows], conn, self.endpoint, self.clock)

    async def purge_relayed(self, before: datetime) -> int:
        async with translated():
            status = await db(self.pool).execute(
                "DELETE FROM eo_inbox WHERE endpoint = $1 AND relayed_at < $2",
                self.endpoint, before)
        return _count(status)

    async def count_pending(self) -> int:
        async with translated():
            return int(await db(self.pool).fetchval(
                "SELECT count(*) FROM eo_inbox WHERE endpoint = $1 AND relayed_at IS NULL",
                self.endpoint))


def staging_name(now: datetime | None = None) -> str:
    """A fresh staging table name carrying its UTC creation time (see `drop_stale_staging`)."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%d%H%M%S")
    return f"{STAGING_PREFIX}{stamp}_{uuid.uuid4().hex[:8]}"


def _checked(name: str) -> str:
    if not _STAGING.match(name):
        raise ValueError(f"not a staging table name: {name!r}")
    return f'"{name}"'


async def create_staging(conn: asyncpg.Connection, name: str) -> None:
    """Create the unlogged staging table `name` (message_id text, type text, body bytea): no
    key, so a retried bulk-write task that had already written its rows only adds copies,
    which the merge drops. Raises ValueError for a name `staging_name` did not make."""
    await conn.execute(f"CREATE UNLOGGED TABLE {_checked(name)} "
                       "(message_id text NOT NULL, type text NOT NULL, body bytea NOT NULL)")


async def merge_staging(conn: asyncpg.Connection, name: str, endpoint: str) -> tuple[int, int]:
    """In one transaction: insert the staged rows whose natural IDs are new to `endpoint`'s
    inbox for this connection's role (the rows' producer; `ON CONFLICT DO NOTHING`: rows
    already there, relayed or not, and copies inside the staging table are skipped), then
    drop the staging table. Returns (rows staged, rows
    new). Raises asyncpg errors (e.g. a staged message ID that is not a UUID) unchanged."""
    table = _checked(name)
    async with conn.transaction():
        staged = int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
        status = await conn.execute(
            f"""INSERT INTO eo_inbox (endpoint, message_id, type, body)
                SELECT $1, message_id::uuid, type, body FROM {table}
                ON CONFLICT (endpoint, producer, message_id) DO NOTHING""", endpoint)
        await conn.execute(f"DROP TABLE {table}")
    return staged, _count(status)


async def drop_staging(conn: asyncpg.Connection, name: str) -> None:
    """Drop the staging table `name` if it exists (a failed run's)."""
    await conn.execute(f"DROP TABLE IF EXISTS {_checked(name)}")


async def drop_stale_staging(conn: asyncpg.Connection, older_than: datetime) -> list[str]:
    """Drop staging tables created before `older_than` (left by a driver that was killed
    between its bulk write and its merge); returns their names."""
    names = await conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
        "AND tablename LIKE $1", STAGING_PREFIX.replace("_", r"\_") + "%")
    cutoff = older_than.astimezone(UTC).strftime("%Y%m%d%H%M%S")
    stale = [r["tablename"] for r in names
             if (m := _STAGING.match(r["tablename"])) and m.group(1) < cutoff]
    for name in stale:
        await drop_staging(conn, name)
    return stale
