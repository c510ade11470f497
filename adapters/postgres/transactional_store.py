"""The transactional store in PostgreSQL: state, transaction records, side-effect records,
deferred clean-ups, processed-message rows and stored replies of one endpoint."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from adapters.postgres.pool import Session, db, translated
from adapters.postgres.record_rows import (
    in_token_arrays,
    in_token_record,
    side_effect_record,
    stored_rows,
    transaction_record,
)
from adapters.postgres.sql import attempt, batch, writes
from adapters.postgres.sweeper_queries import PostgresSweeperQueries
from adapters.postgres.token_store import envelope_of_row
from application.codec import decode_state, from_jsonable, to_jsonable
from application.errors import Conflict, TransientError
from application.ports import (
    Clear,
    Clock,
    CommitRequest,
    Committed,
    Loaded,
    TransactionalStore,
)
from application.records import (
    ProcessedMessage,
    SideEffectRecord,
    TransactionRecord,
)
from domain.decisions import Reply


class PostgresTransactionalStore(PostgresSweeperQueries, TransactionalStore):
    """Rows of endpoint `endpoint` in the `eo_*` tables (several endpoints may share one
    database); the sweeper's queries and the gauges are `PostgresSweeperQueries`'. The
    business state is JSONB in the transaction record's row, so a state and
    the version it belongs to are read together, and every optimistic check is a single
    statement (`WHERE version = $n AND message_id IS NULL`). `state_type` is the dataclass the
    JSON decodes to. Times come from `clock`, so tests control them."""

    def __init__(self, pool: asyncpg.Pool, endpoint: str, state_type: type, clock: Clock,
                 holds_tokens: bool = False) -> None:
        """`holds_tokens`: the token store is this database's `eo_token` (protocol 3.2's
        co-located fast path: token checks, inserts and deletes join this store's
        statements)."""
        super().__init__(pool, endpoint)
        self.state_type, self.clock, self.holds_tokens = state_type, clock, holds_tokens

    def session(self) -> Session:
        return Session(self.pool)

    async def load(self, partition: str, token: uuid.UUID | None = None) -> Loaded:
        token = token if self.holds_tokens else None
        async with translated():
            row = await db(self.pool).fetchrow(attempt.LOAD, self.endpoint, partition, token)
            if not row["tr_exists"] and row["token_exists"] is False:  # a duplicate: no TR
                return Loaded(TransactionRecord(partition, None, None, 0), None, False)
            if not row["tr_exists"]:  # first message of the partition
                row = await db(self.pool).fetchrow(attempt.INSERT_LOAD, self.endpoint,
                                                   partition, token)
            if row is None:  # a concurrent first insert won: visible to a new statement
                row = await db(self.pool).fetchrow(attempt.LOAD, self.endpoint, partition, token)
        if row is None or row.get("tr_exists") is False:
            raise TransientError(f"partition {partition}: transaction record not found")
        return self._loaded(partition, token, row)

    def _loaded(self, partition: str, token: uuid.UUID | None, row: Any) -> Loaded:
        """`Loaded` of a LOAD-shaped row: TR, state, and the token's existence and message."""
        stored = None
        if token is not None and row["token_body"] is not None:
            stored = envelope_of_row(token, {"type": row["token_type"], "body": row["token_body"],
                                             "headers": row["token_headers"]})
        return Loaded(transaction_record(partition, row),
                      decode_state(self.state_type, row["state"], partition),
                      row["token_exists"], stored)

    async def load_many(self, partitions: Sequence[str], tokens: Sequence[uuid.UUID | None]
                        ) -> list[Loaded]:
        checks = list(tokens) if self.holds_tokens else [None] * len(partitions)
        rows: dict[str, Any] = {}
        duplicates: set[str] = set()  # no TR and an absent token: as `load`, none created
        async with translated():
            for statement in (batch.LOAD_MANY, batch.INSERT_LOAD_MANY, batch.LOAD_MANY):
                # then the first messages of new partitions; then those a concurrent batch
                # created first (not in the insert's snapshot)
                missing = [(p, t) for p, t in zip(partitions, checks, strict=True)
                           if p not in rows and p not in duplicates]
                if not missing:
                    break
                for r in await db(self.pool).fetch(statement, self.endpoint,
                                               [p for p, _ in missing], [t for _, t in missing]):
                    if r["tr_exists"]:
                        rows[r["partition_key"]] = r
                    elif r["token_exists"] is False:
                        duplicates.add(r["partition_key"])
        if len(rows) + len(duplicates) < len(partitions):
            raise TransientError(f"partitions {sorted(set(partitions) - set(rows) - duplicates)}: "
                                 "transaction records not found")
        return [self._loaded(p, t, rows[p]) if p in rows
                else Loaded(TransactionRecord(p, None, None, 0), None, False)
                for p, t in zip(partitions, checks, strict=True)]

    async def load_tr(self, partition: str) -> TransactionRecord:
        async with translated():
            row = await db(self.pool).fetchrow(attempt.SELECT_TR, self.endpoint, partition)
            if row is None:  # first message of the partition
                row = await db(self.pool).fetchrow(attempt.INSERT_TR, self.endpoint, partition)
            if row is None:  # a concurrent first insert won: visible to a new statement
                row = await db(self.pool).fetchrow(attempt.SELECT_TR, self.endpoint, partition)
        if row is None:
            raise TransientError(f"partition {partition}: transaction record not found")
        return transaction_record(partition, row)

    async def load_tr_with_records(
        self, partition: str
    ) -> tuple[TransactionRecord, tuple[SideEffectRecord, ...]]:
        async with translated():
            row = await db(self.pool).fetchrow(attempt.SELECT_TR_WITH_RECORDS, self.endpoint,
                                               partition)
            if row is not None and row["message_id"] is not None:
                # a committed attempt, which `finish` publishes: durable first (sql/attempt.py)
                await db(self.pool).execute(attempt.DURABLE, self.endpoint, partition)
        if row is None:
            return TransactionRecord(partition, None, None, 0), ()
        tr = transaction_record(partition, row)
        return tr, (*(side_effect_record(partition, r) for r in row["records"]),
                    *(in_token_record(tr, t) for t in row["in_tokens"]))

    async def register(self, record: SideEffectRecord, expected_version: int) -> int:
        async with translated():
            version = await db(self.pool).fetchval(
                attempt.REGISTER, self.endpoint, record.partition, expected_version,
                str(record.kind), record.key, record.incoming_id, record.attempt_id, record.seq,
                dict(record.payload), record.registered_at or self.clock.now())
        if version is None:
            raise Conflict(f"partition {record.partition}: register at v{expected_version}")
        return int(version)

    async def registration_valid(self, record: SideEffectRecord) -> bool:
        async with translated():
            return bool(await db(self.pool).fetchval(
                attempt.REGISTRATION_VALID, self.endpoint, record.partition, str(record.kind),
                record.key, record.attempt_id))

    async def commit(self, request: CommitRequest) -> Committed:
        r = request
        if r.tokens and not self.holds_tokens:
            raise ValueError("tokens passed to commit, but the token store is not co-located")
        now = self.clock.now()
        processed, reply, tokens = r.processed, r.reply, r.tokens
        in_ids, in_seqs = in_token_arrays(r.records)
        rows = stored_rows(r.records)
        head = (self.endpoint, r.partition, r.expected_version, to_jsonable(r.state),
                r.message_id, r.attempt_id, now)
        token_columns = ([d for d, _ in tokens], [e.message_id for _, e in tokens],
                         [e.type for _, e in tokens], [e.body for _, e in tokens],
                         [dict(e.headers) for _, e in tokens])
        async with translated():
            if tokens and not rows and reply is None and processed is None:
                row = await db(self.pool).fetchrow(  # the plain co-located case
                    writes.COMMIT_TOKENS, *head, *token_columns, in_ids or None, in_seqs or None)
            else:
                try:
                    row = await db(self.pool).fetchrow(
                        writes.COMMIT, *head, processed is not None,
                        *writes.record_arrays(rows, now),
                        reply.status if reply else None, dict(reply.body) if reply else None,
                        [dict(o) for o in processed.outgoing] if processed else [],
                        *token_columns, processed.body_sha256 if processed else None,
                        in_ids or None, in_seqs or None,
                        processed.producer if processed else "",
                        processed.digest if processed else None)
                except asyncpg.UniqueViolationError as exc:
                    if exc.constraint_name != writes.PROCESSED_KEY:
                        raise
                    # another partition's commit claimed the ID first: this one rolled back
                    # whole; the retry finds the claim (a duplicate, or an ID reused)
                    raise Conflict(f"message {r.message_id}: claimed by a concurrent commit "
                                   "on another partition") from exc
        if row is None:
            raise Conflict(f"partition {r.partition}: commit at v{r.expected_version} refused "
                           "(version moved, transaction pending, or message processed)")
        existing = tuple(side_effect_record(r.partition, x) for x in row["records"])
        return Committed(row["version"], existing + tuple(r.records))

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[Committed | None]:
        if any(r.reply is not None or r.processed is not None for r in requests):
            raise ValueError("commit_many commits the token path's requests: replies and "
                             "processed-message rows are committed one at a time")
        if any(r.tokens for r in requests) and not self.holds_tokens:
            raise ValueError("tokens passed to commit, but the token store is not co-located")
        if not requests:
            return []
        async with translated():
            rows = await db(self.pool).fetch(batch.COMMIT_MANY, *batch.commit_many_arguments(
                self.endpoint, requests, self.clock.now()))
        done = {row["partition_key"]: row for row in rows}
        committed: list[Committed | None] = []
        for r in requests:
            row = done.get(r.partition)
            committed.append(None if row is None else Committed(
                row["version"],
                tuple(side_effect_record(r.partition, x) for x in row["records"])
                + tuple(r.records)))
        return committed

    async def clear_many(self, clears: Sequence[Clear]) -> list[bool]:
        if any(c.consume is not None for c in clears) and not self.holds_tokens:
            raise ValueError("consume passed to clear, but the token store is not co-located")
        if not clears:
            return []
        async with translated():
            rows = await db(self.pool).fetch(
                batch.CLEAR_MANY, *batch.clear_many_arguments(self.endpoint, clears))
        cleared = {row["partition_key"] for row in rows}
        return [c.partition in cleared for c in clears]

    async def clear(self, clear: Clear) -> bool:
        consume = clear.consume
        if consume is not None and not self.holds_tokens:
            raise ValueError("consume passed to clear, but the token store is not co-located")
        records, aborted = stored_rows(clear.records), clear.aborted
        async with translated():
            if consume is not None and not records and not aborted:  # the plain co-located case
                return bool(await db(self.pool).fetchval(writes.CLEAR_CONSUMING, self.endpoint,
                                                     clear.partition, clear.expected_version,
                                                     consume))
            cleared = await db(self.pool).fetchval(
                writes.CLEAR, self.endpoint, clear.partition, clear.expected_version,
                [str(r.kind) for r in records], [r.key for r in records],
                [str(r.kind) for r in aborted], [r.key for r in aborted],
                [dict(r.payload) for r in aborted], clear.cleanup_due, consume)
        return bool(cleared)

    async def processed(self, message_id: uuid.UUID, producer: str = ""
                        ) -> ProcessedMessage | None:
        async with translated():
            row = await db(self.pool).fetchrow(attempt.SELECT_PROCESSED, self.endpoint,
                                               message_id, producer)
        if row is None:
            return None
        return ProcessedMessage(message_id, row["partition_key"], tuple(row["outgoing"]),
                                row["processed_at"], row["body_sha256"], row["digest"],
                                producer)

    async def stored_reply(self, message_id: uuid.UUID) -> Reply | None:
        async with translated():
            row = await db(self.pool).fetchrow(attempt.SELECT_REPLY, self.endpoint, message_id)
        return None if row is None else Reply(row["status"], row["body"])

    async def delete_reply(self, message_id: uuid.UUID) -> None:
        async with translated():
            await db(self.pool).execute(attempt.DELETE_REPLY, self.endpoint, message_id)

    async def states(self, limit: int | None = None, partition: str | None = None
                     ) -> dict[str, Any]:
        """Every partition's business state (oracles, audits, the demo's report); with
        `limit`, the first `limit` partitions in key order (`eo states`); with `partition`,
        that one only (nothing when it has no state)."""
        query = ("SELECT partition_key, state FROM eo_transaction_record "
                 "WHERE endpoint = $1 AND state IS NOT NULL")
        args: list[Any] = [self.endpoint]
        if partition is not None:
            args.append(partition)
            query += f" AND partition_key = ${len(args)}"
        if limit is not None:
            args.append(limit)
            query += f" ORDER BY partition_key LIMIT ${len(args)}"
        async with translated():
            rows = await db(self.pool).fetch(query, *args)
        return {r["partition_key"]: from_jsonable(self.state_type, r["state"]) for r in rows}

    async def seed_states(self, states: dict[str, Any]) -> None:
        """Write initial business states of idle partitions (opening accounts, fixtures)."""
        async with translated():
            await db(self.pool).execute(
                """INSERT INTO eo_transaction_record (endpoint, partition_key, state)
                   SELECT $1, p, s FROM unnest($2::text[], $3::jsonb[]) AS x(p, s)
                   ON CONFLICT (endpoint, partition_key) DO UPDATE SET state = excluded.state,
                     version = eo_transaction_record.version + 1
                   WHERE eo_transaction_record.message_id IS NULL""",
                self.endpoint, list(states), [to_jsonable(s) for s in states.values()])

    async def record_count(self) -> int:
        """Side-effect records still stored for this endpoint."""
        async with translated():
            return int(await db(self.pool).fetchval(
                "SELECT count(*) FROM eo_side_effect_record WHERE endpoint = $1", self.endpoint))
