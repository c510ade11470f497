"""The transactional store in memory, with atomic transactions and optimistic concurrency."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from adapters.memory.token_store import MemoryTokenStore
from application.errors import Conflict
from application.ports import (
    Clear,
    Clock,
    CommitRequest,
    Committed,
    Loaded,
    TransactionalStore,
)
from application.records import (
    Abandoned,
    DeferredCleanup,
    Kind,
    ProcessedMessage,
    SideEffectRecord,
    TransactionRecord,
)
from application.side_effects import message_payload
from domain.decisions import Reply


@dataclass
class _Partition:
    tr: TransactionRecord
    state: Any = None
    records: list[SideEffectRecord] = field(default_factory=list)
    #: the committed transaction's messages whose tokens stand for their records: (message
    #: ID, seq) each, as PostgreSQL keeps them on the transaction record
    in_tokens: tuple[tuple[uuid.UUID, int], ...] = ()


def _as_stored(record: SideEffectRecord) -> SideEffectRecord:
    """`record` as a row keeps it: its payload a plain mapping of strings (a message's is
    read back, and parsed, as PostgreSQL's would be)."""
    return replace(record, payload=MappingProxyType(dict(record.payload)))


def _same(a: SideEffectRecord, b: SideEffectRecord) -> bool:
    return (a.kind, a.key, a.attempt_id) == (b.kind, b.key, b.attempt_id)


class MemoryTransactionalStore(TransactionalStore):
    """Every method is one transaction: it yields to the event loop once (the round trip),
    then checks and writes without yielding, so it is atomic among coroutines. Conflicts
    are raised exactly where PostgreSQL's single-statement version checks raise them."""

    def __init__(self, clock: Clock, tokens: MemoryTokenStore | None = None,
                 endpoint: str = "") -> None:
        """`tokens`: the token store to treat as co-located (protocol 3.2's fast path), whose
        tokens addressed to `endpoint` (this store's) it checks and consumes."""
        if tokens is not None and not endpoint:
            raise ValueError("a co-located token store needs the store's endpoint")
        self.clock, self.endpoint = clock, endpoint
        self.tokens = tokens
        self.holds_tokens = tokens is not None
        self.partitions: dict[str, _Partition] = {}
        #: processed-message rows by (producer, message ID): the claims (protocol 4)
        self.processed_rows: dict[tuple[str, uuid.UUID], ProcessedMessage] = {}
        self.replies: dict[uuid.UUID, Reply] = {}
        self.cleanups: dict[int, DeferredCleanup] = {}
        self._cleanup_ids = itertools.count(1)

    def session(self) -> AbstractAsyncContextManager[None]:
        return nullcontext()  # no connections: every call is its own transaction

    def _partition(self, partition: str) -> _Partition:
        p = self.partitions.get(partition)
        if p is None:
            p = self.partitions[partition] = _Partition(TransactionRecord(partition, None, None, 0))
        return p

    def _bump(self, p: _Partition, **changes: Any) -> None:
        p.tr = replace(p.tr, version=p.tr.version + 1, **changes)

    def _defer(self, records: Sequence[SideEffectRecord], due: datetime) -> None:
        for rec in records:
            cid = next(self._cleanup_ids)
            self.cleanups[cid] = DeferredCleanup(cid, rec.kind, rec.key, rec.payload, due)

    def seed_state(self, partition: str, state: Any) -> None:
        """Write a partition's initial business state (opening accounts, fixtures)."""
        p = self._partition(partition)
        p.state = state
        self._bump(p)

    async def load_tr(self, partition: str) -> TransactionRecord:
        await asyncio.sleep(0)
        return self._partition(partition).tr

    async def load_tr_with_records(
        self, partition: str
    ) -> tuple[TransactionRecord, tuple[SideEffectRecord, ...]]:
        await asyncio.sleep(0)
        p = self._partition(partition)
        return p.tr, tuple(p.records) + self._read_back(p)

    def _read_back(self, p: _Partition) -> tuple[SideEffectRecord, ...]:
        """The records that `p`'s outgoing tokens stand for, of those tokens still there."""
        tr, tokens = p.tr, self.tokens
        if not p.in_tokens or tokens is None or tr.message_id is None or tr.attempt_id is None:
            return ()
        return tuple(
            SideEffectRecord(tr.partition, Kind.MESSAGE, str(m), tr.message_id, tr.attempt_id,
                             seq, message_payload(tokens.addresses[m], tokens.rows[m]),
                             tr.committed_at, in_token=True)
            for m, seq in p.in_tokens if m in tokens.rows)

    async def load(self, partition: str, token: uuid.UUID | None = None) -> Loaded:
        await asyncio.sleep(0)
        return self._load(partition, token)

    def _load(self, partition: str, token: uuid.UUID | None) -> Loaded:
        exists, stored = None, None
        if token is not None and self.tokens is not None:
            exists = self.tokens.holds(self.endpoint, token)
            stored = self.tokens.rows[token] if exists else None
            if not exists and partition not in self.partitions:  # a duplicate: no new TR
                return Loaded(TransactionRecord(partition, None, None, 0), None, False)
        p = self._partition(partition)
        return Loaded(p.tr, p.state, exists, stored)

    async def load_many(self, partitions: Sequence[str], tokens: Sequence[uuid.UUID | None]
                        ) -> list[Loaded]:
        await asyncio.sleep(0)
        return [self._load(p, t) for p, t in zip(partitions, tokens, strict=True)]

    async def register(self, record: SideEffectRecord, expected_version: int) -> int:
        await asyncio.sleep(0)
        p = self._partition(record.partition)
        if p.tr.is_committed or p.tr.version != expected_version:
            raise Conflict(f"partition {record.partition}: register at v{expected_version}, "
                           f"TR at v{p.tr.version}")
        p.records.append(_as_stored(record))
        self._bump(p)
        return p.tr.version

    async def registration_valid(self, record: SideEffectRecord) -> bool:
        await asyncio.sleep(0)
        p = self._partition(record.partition)
        return not p.tr.is_committed and any(_same(r, record) for r in p.records)

    async def commit(self, request: CommitRequest) -> Committed:
        await asyncio.sleep(0)
        return self._commit(request)

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[Committed | None]:
        await asyncio.sleep(0)
        if any(r.tokens for r in requests) and self.tokens is None:
            raise ValueError("tokens passed to commit, but no token store is co-located")
        done: list[Committed | None] = []
        for request in requests:
            try:
                done.append(self._commit(request))
            except Conflict:
                done.append(None)
        return done

    def _commit(self, request: CommitRequest) -> Committed:
        r = request
        p = self._partition(r.partition)
        if p.tr.is_committed or p.tr.version != r.expected_version:
            raise Conflict(f"partition {r.partition}: commit at v{r.expected_version}, "
                           f"TR at v{p.tr.version}")
        claim = None if r.processed is None else (r.processed.producer, r.processed.message_id)
        if claim is not None and claim in self.processed_rows:
            raise Conflict(f"message {claim[1]} already has a processed-message row")
        if r.tokens and self.tokens is None:
            raise ValueError("tokens passed to commit, but no token store is co-located")
        p.state = r.state
        p.records.extend(_as_stored(x) for x in r.records if not x.in_token)
        p.in_tokens = tuple((uuid.UUID(x.key), x.seq) for x in r.records if x.in_token)
        self._bump(p, message_id=r.message_id, attempt_id=r.attempt_id,
                   committed_at=self.clock.now())
        if r.reply is not None:
            self.replies[r.message_id] = r.reply
        if claim is not None and r.processed is not None:
            self.processed_rows[claim] = r.processed
        if self.tokens is not None:
            for destination, envelope in r.tokens:
                self.tokens.insert(destination, [envelope])
        return Committed(p.tr.version,
                         tuple(p.records) + tuple(x for x in r.records if x.in_token))

    async def clear(self, clear: Clear) -> bool:
        await asyncio.sleep(0)
        return self._clear(clear)

    async def clear_many(self, clears: Sequence[Clear]) -> list[bool]:
        await asyncio.sleep(0)
        if any(c.consume is not None for c in clears) and self.tokens is None:
            raise ValueError("consume passed to clear, but no token store is co-located")
        return [self._clear(c) for c in clears]

    def _clear(self, c: Clear) -> bool:
        partition, expected_version, records = c.partition, c.expected_version, c.records
        aborted, cleanup_due, consume = c.aborted, c.cleanup_due, c.consume
        p = self._partition(partition)
        if p.tr.version != expected_version:
            return False
        if consume is not None:
            if self.tokens is None:
                raise ValueError("consume passed to clear, but no token store is co-located")
            self.tokens.discard(self.endpoint, consume)
        p.records = [r for r in p.records if not any(_same(r, x) for x in records)]
        p.in_tokens = ()
        self._bump(p, message_id=None, attempt_id=None, committed_at=None)
        self._defer(aborted, cleanup_due)
        return True

    async def processed(self, message_id: uuid.UUID, producer: str = ""
                        ) -> ProcessedMessage | None:
        await asyncio.sleep(0)
        return self.processed_rows.get((producer, message_id))

    async def stored_reply(self, message_id: uuid.UUID) -> Reply | None:
        await asyncio.sleep(0)
        return self.replies.get(message_id)

    async def delete_reply(self, message_id: uuid.UUID) -> None:
        await asyncio.sleep(0)
        self.replies.pop(message_id, None)

    async def committed_before(self, cutoff: datetime) -> Sequence[TransactionRecord]:
        await asyncio.sleep(0)
        return [p.tr for p in self.partitions.values()
                if p.tr.committed_at is not None and p.tr.committed_at < cutoff]

    async def due_cleanups(self, now: datetime) -> Sequence[DeferredCleanup]:
        await asyncio.sleep(0)
        return [c for c in self.cleanups.values() if c.due <= now]

    async def drop_cleanups(self, cleanup_ids: Sequence[int]) -> None:
        await asyncio.sleep(0)
        for cid in cleanup_ids:
            self.cleanups.pop(cid, None)

    async def abandoned(self, cutoff: datetime) -> Sequence[Abandoned]:
        await asyncio.sleep(0)
        found = []
        for name, p in self.partitions.items():
            old = tuple(r for r in p.records
                        if r.registered_at is not None and r.registered_at < cutoff)
            if not p.tr.is_committed and old:
                found.append(Abandoned(name, p.tr.version, old))
        return found

    async def take_over(self, abandoned: Abandoned, cleanup_due: datetime) -> bool:
        await asyncio.sleep(0)
        p = self._partition(abandoned.partition)
        if p.tr.is_committed or p.tr.version != abandoned.version:
            return False
        p.records = [r for r in p.records if not any(_same(r, x) for x in abandoned.records)]
        self._bump(p)
        self._defer(abandoned.records, cleanup_due)
        return True

    async def purge_processed(self, before: datetime) -> int:
        await asyncio.sleep(0)
        old = [key for key, row in self.processed_rows.items() if row.processed_at < before]
        for key in old:
            del self.processed_rows[key]
        return len(old)

    async def unfinished_count(self) -> int:
        return sum(p.tr.is_committed for p in self.partitions.values())

    async def cleanup_count(self) -> int:
        return len(self.cleanups)

    def states(self) -> dict[str, Any]:
        """Every partition's business state (test oracles and the demo's report)."""
        return {name: p.state for name, p in self.partitions.items() if p.state is not None}

    def record_count(self) -> int:
        """Side-effect records still stored, over all partitions."""
        return sum(len(p.records) for p in self.partitions.values())
