"""Schema upgrades on a database that already holds rows: what revision 0005 (addressed
tokens, the processed body's hash) does to tokens and processed-message rows in flight, what
revision 0006 does to the transaction records' updates (heap-only), what 0007's downgrade
keeps, and how 0008 stops an older worker from clearing what it cannot read."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import MappingProxyType

import asyncpg
import pytest

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.migrate import downgrade_async, upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.system.clock import ManualClock
from application.envelope import TOKEN_HEADER, Envelope
from application.ports import Clear, CommitRequest
from application.records import Kind, SideEffectRecord
from application.side_effects import from_message_payload, message_payload
from tests.support.counter import Tally
from tests.support.processes import this_run
from tests.support.services import discover


async def _database_at(revision: str) -> AsyncIterator[str]:
    services = discover(rabbitmq=False)
    dsn = with_database(services.postgres_dsn, this_run("eo_it_migrations"))
    await drop_database(dsn)
    await ensure_database(dsn)
    await upgrade_async(dsn, revision)
    try:
        yield dsn
    finally:
        await drop_database(dsn)
        services.close()


@pytest.fixture
async def at_0004() -> AsyncIterator[str]:
    """A database of its own at revision 0004 (before tokens had an address)."""
    async for dsn in _database_at("0004"):
        yield dsn


@pytest.fixture
async def at_0005() -> AsyncIterator[str]:
    """A database of its own at revision 0005 (transaction records indexed on commit time)."""
    async for dsn in _database_at("0005"):
        yield dsn


# the transaction record's two updates as the store made them at revision 0005 (today's
# statements need today's schema)
_COMMIT_AT_0005 = """UPDATE eo_transaction_record SET state = '{}'::jsonb, message_id = $2,
  attempt_id = $3, committed_at = now(), version = version + 1
  WHERE endpoint = $1 AND partition_key = 'p'"""
_CLEAR_AT_0005 = """UPDATE eo_transaction_record SET message_id = NULL, attempt_id = NULL,
  committed_at = NULL, version = version + 1 WHERE endpoint = $1 AND partition_key = 'p'"""


async def _heap_only_updates(dsn: str, endpoint: str, messages: int,
                             through_store: bool = True) -> tuple[int, int]:
    """(updates, heap-only updates) of `eo_transaction_record` while `messages` messages
    commit and clear on one partition, through the store (else through the statements of
    revision 0005), on one connection (whose statistics are flushed before they are read)."""
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        store = PostgresTransactionalStore(pool, endpoint, Tally, ManualClock())
        if not through_store:
            await pool.execute("INSERT INTO eo_transaction_record (endpoint, partition_key) "
                               "VALUES ($1, 'p')", endpoint)
        before = await _update_counts(pool)
        if through_store:
            await store.load("p")
        for _ in range(messages):
            if not through_store:
                await pool.execute(_COMMIT_AT_0005, endpoint, uuid.uuid4(), uuid.uuid4())
                await pool.execute(_CLEAR_AT_0005, endpoint)
                continue
            tr = await store.load_tr("p")
            committed = await store.commit(CommitRequest("p", tr.version, Tally(), uuid.uuid4(),
                                                         uuid.uuid4()))
            assert await store.clear(Clear("p", committed.version, (), (), datetime.now(UTC)))
        after = await _update_counts(pool)
    finally:
        await pool.close()
    return after[0] - before[0], after[1] - before[1]


async def _update_counts(pool: asyncpg.Pool) -> tuple[int, int]:
    await pool.execute("SELECT pg_stat_force_next_flush()")
    row = await pool.fetchrow("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                              "WHERE relname = 'eo_transaction_record'")
    return (0, 0) if row is None else (row["n_tup_upd"], row["n_tup_hot_upd"])


async def test_0005_addresses_the_tokens_it_can_and_leaves_the_others_drainable(
    at_0004: str,
) -> None:
    pending, dispatched = uuid.uuid4(), uuid.uuid4()
    conn = await asyncpg.connect(at_0004)
    try:
        for message_id in (pending, dispatched):
            await conn.execute("INSERT INTO eo_token (message_id, type, body) "
                               "VALUES ($1, 'Added', '{}')", message_id)
        # the pending token's transaction is not finished: its record names the destination
        await conn.execute(
            """INSERT INTO eo_side_effect_record (endpoint, partition_key, kind, key,
                 incoming_id, attempt_id, seq, payload, registered_at)
               VALUES ('counter', 'p', 'message', $1, $2, $3, 0, $4::jsonb, now())""",
            str(pending), uuid.uuid4(), uuid.uuid4(), json.dumps({"destination": "audit"}))
        await conn.execute("INSERT INTO eo_processed_message (endpoint, message_id, "
                           "partition_key, outgoing, processed_at) "
                           "VALUES ('front', $1, 'p', '[]', now())", uuid.uuid4())
    finally:
        await conn.close()

    await upgrade_async(at_0004)

    pool = await create_pool(at_0004)
    try:
        addresses = {r["message_id"]: r["endpoint"] for r in await pool.fetch(
            "SELECT message_id, endpoint FROM eo_token")}
        assert addresses == {pending: "audit", dispatched: None}
        tokens = PostgresTokenStore(pool)
        assert await tokens.exists("audit", pending)
        assert not await tokens.exists("front", pending)  # addressed: another endpoint's
        # a token of a message dispatched before the upgrade drains through its receiver
        assert await tokens.exists("ledger", dispatched)
        assert await pool.fetchval("SELECT body_sha256 FROM eo_processed_message") is None
        with pytest.raises(asyncpg.CheckViolationError):  # every new token is addressed
            await pool.execute("INSERT INTO eo_token (message_id, type, body) "
                               "VALUES ($1, 'Added', '{}')", uuid.uuid4())
    finally:
        await pool.close()


async def test_0006_makes_the_transaction_records_updates_heap_only(at_0005: str) -> None:
    """Two updates per message (commit, clear): at 0005 the index on `committed_at` made
    every one write index entries; from 0006 they stay on their page."""
    updates, heap_only = await _heap_only_updates(at_0005, "before", 10, through_store=False)
    assert (updates, heap_only) == (20, 0)
    await upgrade_async(at_0005)
    updates, heap_only = await _heap_only_updates(at_0005, "after", 10)
    assert (updates, heap_only) == (20, 20)
    conn = await asyncpg.connect(at_0005)
    try:
        assert await conn.fetchval("SELECT reloptions FROM pg_class "
                                   "WHERE relname = 'eo_transaction_record'") == ["fillfactor=70"]
        assert await conn.fetchval("SELECT count(*) FROM pg_indexes "
                                   "WHERE tablename = 'eo_transaction_record'") == 1  # its key
    finally:
        await conn.close()


async def test_0007_down_turns_the_records_tokens_stand_for_back_into_rows() -> None:
    """Older code reads no `in_token_ids`: the downgrade writes the records that the tokens
    of unfinished transactions stand for as rows, which that code finishes from."""
    async for dsn in _database_at("head"):
        clock = ManualClock()
        pool = await create_pool(dsn, min_size=1, max_size=1)
        try:
            store = PostgresTransactionalStore(pool, "ledger", Tally, clock, holds_tokens=True)
            out = Envelope(uuid.uuid4(), "Added", b'{"n": 1}',
                           MappingProxyType({TOKEN_HEADER: "1"}))
            m, a = uuid.uuid4(), uuid.uuid4()
            record = SideEffectRecord("p", Kind.MESSAGE, str(out.message_id), m, a, 1,
                                      message_payload("audit", out), clock.now(),
                                      in_token=True)
            await store.load_tr("p")
            await store.commit(CommitRequest("p", 0, Tally(), m, a, [record],
                                             tokens=[("audit", out)]))
            assert await store.record_count() == 0
        finally:
            await pool.close()
        await downgrade_async(dsn, "0006")
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT partition_key, kind, key, incoming_id, attempt_id, "
                                    "seq, payload FROM eo_side_effect_record")
        finally:
            await conn.close()
        [row] = rows
        assert (row["partition_key"], row["kind"], row["key"], row["incoming_id"],
                row["attempt_id"], row["seq"]) == ("p", "message", str(out.message_id), m, a, 1)
        assert from_message_payload(row["key"], json.loads(row["payload"])) == ("audit", out)
        await upgrade_async(dsn)


# the clear of the code before revision 0007 (adapters/postgres/sql.py at that time): it
# consumes the incoming token and clears the record, and knows nothing of `in_token_ids`
_CLEAR_BEFORE_0007 = """
WITH tr AS (
  UPDATE eo_transaction_record
     SET message_id = NULL, attempt_id = NULL, committed_at = NULL, version = version + 1
   WHERE endpoint = $1 AND partition_key = $2 AND version = $3
  RETURNING 1),
tok AS (
  DELETE FROM eo_token USING tr
   WHERE message_id = $4::uuid AND (endpoint = $1 OR endpoint IS NULL))
SELECT count(*) FROM tr"""


async def test_0008_an_older_worker_cannot_clear_what_tokens_stand_for() -> None:
    """A rolling upgrade: a worker from before 0007 finishing a transaction whose outgoing
    tokens stand for its records would publish nothing and clear it. Its clear fails as a
    whole with a serialization failure (transient for every version of the store), so the
    message waits for a newer worker; this project's own clear goes through."""
    async for dsn in _database_at("head"):
        clock = ManualClock()
        pool = await create_pool(dsn, min_size=1, max_size=1)
        try:
            store = PostgresTransactionalStore(pool, "ledger", Tally, clock, holds_tokens=True)
            tokens = PostgresTokenStore(pool)
            incoming = Envelope(uuid.uuid4(), "Add", b"{}", MappingProxyType({TOKEN_HEADER: "1"}))
            out = Envelope(uuid.uuid4(), "Added", b'{"n": 1}',
                           MappingProxyType({TOKEN_HEADER: "1"}))
            await tokens.create("ledger", [incoming])
            a = uuid.uuid4()
            record = SideEffectRecord("p", Kind.MESSAGE, str(out.message_id),
                                      incoming.message_id, a, 0,
                                      message_payload("audit", out), clock.now(), in_token=True)
            await store.load_tr("p")
            committed = await store.commit(CommitRequest(
                "p", 0, Tally(), incoming.message_id, a, [record], tokens=[("audit", out)]))
            with pytest.raises(asyncpg.SerializationError, match="revision 0007 or later"):
                await pool.fetchval(_CLEAR_BEFORE_0007, "ledger", "p", committed.version,
                                    incoming.message_id)
            assert (await store.load_tr("p")).message_id == incoming.message_id
            assert await tokens.exists("ledger", incoming.message_id)  # nothing consumed
            assert await store.clear(Clear("p", committed.version, committed.records, [],
                                     clock.now(), incoming.message_id))
            assert not await tokens.exists("ledger", incoming.message_id)
            # without records in tokens the older clear is as it always was
            await tokens.create("ledger", [incoming])
            v = (await store.load_tr("p")).version
            committed = await store.commit(CommitRequest("p", v, Tally(), incoming.message_id, a))
            assert await pool.fetchval(_CLEAR_BEFORE_0007, "ledger", "p", committed.version,
                                       incoming.message_id) == 1
        finally:
            await pool.close()


async def test_a_database_name_is_an_identifier_never_sql() -> None:
    """The security review: `CREATE DATABASE "{name}"` took the DSN's path unquoted."""
    services = discover(rabbitmq=False)
    name = f'eo it "quoted"; DROP DATABASE postgres; -- {os.getpid()}'
    dsn = with_database(services.postgres_dsn, name)
    try:
        assert await ensure_database(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT current_database()") == name
        finally:
            await conn.close()
    finally:
        await drop_database(dsn)
        services.close()
    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await asyncpg.connect(dsn)
