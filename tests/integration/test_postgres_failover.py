"""A PostgreSQL primary and standby of their own (tools/faults/pg_pair.py; never the
machine's server) failing over: the service's migrations and pool through a multi-host DSN
(`target_session_attrs=read-write`) find the new primary; with synchronous replication no
acknowledged commit is lost, with asynchronous replication the commits the standby had not
received are (docs/operations.md says which the template requires). Skipped where servers
cannot be started (no root, no Debian PostgreSQL 15 binaries)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.system.clock import SystemClock
from application.errors import PermanentError, TransientError
from entrypoints.settings import load_settings
from entrypoints.startup import preflight
from tools.faults.pg_pair import PostgresPair, available

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

ROWS = 20


@pytest.fixture
async def synchronous() -> AsyncIterator[PostgresPair]:
    async with PostgresPair(synchronous=True) as pair:
        yield pair


@pytest.fixture
async def asynchronous() -> AsyncIterator[PostgresPair]:
    async with PostgresPair(synchronous=False) as pair:
        yield pair


async def commits(pair: PostgresPair) -> None:
    """A table of the pair's primary and `ROWS` rows, each its own acknowledged commit."""
    conn = await asyncpg.connect(pair.dsn())
    try:
        await conn.execute("CREATE TABLE acknowledged (n int PRIMARY KEY)")
        for n in range(ROWS):
            await conn.execute("INSERT INTO acknowledged VALUES ($1)", n)
    finally:
        await conn.close()


async def surviving(pair: PostgresPair) -> int:
    conn = await asyncpg.connect(pair.dsn())
    try:
        return int(await conn.fetchval("SELECT count(*) FROM acknowledged"))
    finally:
        await conn.close()


async def test_the_schema_and_the_pool_follow_the_primary_through_a_failover(
        synchronous: PostgresPair) -> None:
    pair = synchronous
    admin = await asyncpg.connect(pair.dsn())
    await admin.execute("CREATE DATABASE eo")
    await admin.close()
    await upgrade_async(pair.dsn("eo"))  # `eo migrate` takes the multi-host DSN
    pool = await create_pool(pair.dsn("eo"), min_size=2, max_size=2)
    try:
        await pool.execute("CREATE TABLE t (n int)")
        await pool.execute("INSERT INTO t VALUES (1)")
        old = pair.primary
        await pair.failover()
        failures = 0
        for _ in range(100):  # the pool's connections to the dead primary fail, then none
            try:
                await pool.execute("INSERT INTO t VALUES (2)")
                break
            except (TransientError, OSError, asyncpg.PostgresError,
                    asyncpg.InterfaceError):
                failures += 1
                await asyncio.sleep(0.1)
        assert await pool.fetchval("SELECT array_agg(n ORDER BY n) FROM t") == [1, 2]
        assert await pool.fetchval("SELECT NOT pg_is_in_recovery()")
        assert failures <= 2  # at most the pool's two connections to the old primary
        await pair.rejoin()
        assert pair.standby is old
        for _ in range(100):
            state = await pair.sql(pair.primary, "SELECT state || '|' || sync_state "
                                                 "FROM pg_stat_replication")
            if state == "streaming|sync":
                break
            await asyncio.sleep(0.1)
        assert state == "streaming|sync"
    finally:
        await pool.close()


async def test_synchronous_replication_loses_no_acknowledged_commit(
        synchronous: PostgresPair) -> None:
    await commits(synchronous)
    await synchronous.failover()  # at once: no time for the standby to catch up
    assert await surviving(synchronous) == ROWS


async def test_asynchronous_replication_loses_the_commits_the_standby_had_not(
        asynchronous: PostgresPair) -> None:
    conn = await asyncpg.connect(asynchronous.dsn())
    await conn.execute("CREATE TABLE acknowledged (n int PRIMARY KEY)")
    await conn.execute("INSERT INTO acknowledged VALUES (-1)")
    await conn.close()
    for _ in range(100):  # the table and its first row have reached the standby
        if await asynchronous.sql(asynchronous.standby,
                                  "SELECT count(*) FROM pg_class WHERE relname = "
                                  "'acknowledged'") == "1":
            break
        await asyncio.sleep(0.1)
    await asynchronous.stop_standby()  # lagging: a network cut, a slow disk
    conn = await asyncpg.connect(asynchronous.dsn())
    for n in range(ROWS):  # each acknowledged, by the primary alone
        await conn.execute("INSERT INTO acknowledged VALUES ($1)", n)
    await conn.close()
    await asynchronous.failover()
    assert await surviving(asynchronous) <= 1  # every acknowledged row of the lag is gone


async def test_a_finishers_read_of_a_commit_not_yet_replicated_waits_for_it(
        synchronous: PostgresPair) -> None:
    """A commit whose wait for the synchronous standby was cancelled (a client's timeout;
    a primary restarted during it does the same) is visible on the primary before the
    standby has it, and a failover loses it. `finish` publishes what its read returns, so
    that read returns only once what it saw is replicated: here, with the standby stopped,
    never (the pool's command timeout then makes it a `TransientError`). Without the
    barrier it returned the attempt at once (eo chaos --production seed 47 run 5 of the
    fixture service: side effects published from an attempt the failover lost, I3)."""
    dsn = await migrated(synchronous)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        store = PostgresTransactionalStore(pool, "tracking", dict, SystemClock())
        await store.load_tr("paris")  # the TR, replicated
        await synchronous.stop_standby()
        committer = await asyncpg.connect(dsn)
        message_id, attempt_id = uuid.uuid4(), uuid.uuid4()
        with pytest.raises(asyncio.TimeoutError):  # asyncpg cancels the COMMIT's wait
            await committer.execute(
                "UPDATE eo_transaction_record SET message_id = $1, attempt_id = $2, "
                "version = version + 1, committed_at = now() "
                "WHERE endpoint = 'tracking' AND partition_key = 'paris'",
                message_id, attempt_id, timeout=2)
        await committer.close()
        seen = await pool.fetchval("SELECT attempt_id FROM eo_transaction_record "
                                   "WHERE partition_key = 'paris'")
        assert seen == attempt_id  # committed locally, visible, not replicated
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(store.load_tr_with_records("paris"), 4)
    finally:
        pool.terminate()


async def migrated(pair: PostgresPair) -> str:
    """The pair's database `eo`, migrated; its multi-host DSN."""
    admin = await asyncpg.connect(pair.dsn())
    await admin.execute("CREATE DATABASE eo")
    await admin.close()
    await upgrade_async(pair.dsn("eo"))
    return pair.dsn("eo")


async def test_start_up_requiring_synchronous_replication_accepts_a_synchronous_pair(
        synchronous: PostgresPair) -> None:
    settings = load_settings(profile="local", database_dsn=await migrated(synchronous),
                             replication_check="require")
    await preflight(settings, broker=False)


async def test_start_up_requiring_synchronous_replication_refuses_an_asynchronous_one(
        asynchronous: PostgresPair) -> None:
    settings = load_settings(profile="local", database_dsn=await migrated(asynchronous),
                             replication_check="require")
    with pytest.raises(PermanentError, match=r"synchronous_standby_names is ''.*1 standbys"):
        await preflight(settings, broker=False)
