"""One partition's protocol state: the transaction record, the business state and the
side-effect records, read and written atomically (protocol 3.1), one or many at a time."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from application.envelope import Envelope
from application.records import (
    ProcessedMessage,
    SideEffectRecord,
    TransactionRecord,
)
from domain.decisions import Reply


@dataclass(frozen=True)
class Loaded:
    """One read of a partition: its transaction record, its business state (None when never
    written) and, when asked and co-located, whether a token exists (None: not checked) and
    the message it holds (`token`: None when it does not exist or was not asked)."""

    tr: TransactionRecord
    state: Any
    token_exists: bool | None = None
    token: Envelope | None = None


@dataclass(frozen=True)
class Committed:
    """A successful commit: the TR's new version and the partition's side-effect records."""

    version: int
    records: tuple[SideEffectRecord, ...]


@dataclass(frozen=True)
class CommitRequest:
    """Everything one commit writes (protocol 3.1), in one transaction:

    - `partition`, `expected_version`: the optimistic check (the TR idle at that version);
    - `state`: the partition's new business state;
    - `message_id`, `attempt_id`: the TR becomes committed to them;
    - `records`: side-effect records needing no artifact (inserted by the commit); those
      `in_token` are stood for by their message's token in `tokens` (no row of their own);
    - `reply`: an HTTP callee's stored business response (protocol 6);
    - `processed`: the processed-message row (positive-proof path, protocol 4);
    - `tokens`: outgoing tokens the commit inserts itself (co-located fast path, 3.2), as
      (destination endpoint, envelope): each addressed to its destination.

    Raises ValueError when an `in_token` record's message has no token in `tokens`: nothing
    would hold it.
    """

    partition: str
    expected_version: int
    state: Any
    message_id: uuid.UUID
    attempt_id: uuid.UUID
    records: Sequence[SideEffectRecord] = ()
    reply: Reply | None = None
    processed: ProcessedMessage | None = None
    tokens: Sequence[tuple[str, Envelope]] = ()

    def __post_init__(self) -> None:
        held = [x.key for x in self.records if x.in_token]
        if held and not set(held) <= {e.id_text for _, e in self.tokens}:
            raise ValueError(f"partition {self.partition}: in-token records without their "
                             "token in the commit")


@dataclass(frozen=True)
class Clear:
    """One compare-and-clear (`PartitionStore.clear`, `clear_many`): the partition, the TR
    version it expects, the records it deletes, the losers' records it defers for clean-up
    at `cleanup_due`, and the token it consumes (co-located tokens), if any."""

    partition: str
    expected_version: int
    records: Sequence[SideEffectRecord]
    aborted: Sequence[SideEffectRecord]
    cleanup_due: datetime
    consume: uuid.UUID | None = None


class PartitionStore(Protocol):
    """Processing one partition (protocol 3): the transaction record, the business state and
    the side-effect records, read and written atomically. Optimistic writes take the TR
    version the caller loaded and raise `Conflict` when it moved. Raises `TransientError`
    when the store is unreachable or a commit's outcome is unknown."""

    #: Whether tokens live in this store's database (protocol 3.2's co-located fast path):
    #: then `load` can check a token, `commit` can insert tokens and `clear` can consume one,
    #: each inside the same statement.
    holds_tokens: bool

    def session(self) -> AbstractAsyncContextManager[None]:
        """A block whose calls from the entering task share one connection of the store (an
        attempt's load, commit and clear: one pool round trip instead of three); a store
        without connections returns a block that does nothing. Calls from other tasks,
        including those the block creates, do not share it."""

    async def load(self, partition: str, token: uuid.UUID | None = None) -> Loaded:
        """The transaction record (created idle when missing) and the business state, in one
        read; with `token` and `holds_tokens`, also whether that token, addressed to this
        store's endpoint, exists and the message it holds (same snapshot:
        `finish` consumes a token before it clears the TR, so a reader never sees an idle TR
        beside the token of a finished message). A missing TR is not created when that
        token does not exist (a duplicate, or a message nobody sent, writes nothing): the
        idle TR at version 0 is returned unstored."""

    async def load_tr(self, partition: str) -> TransactionRecord:
        """The partition's transaction record, created idle at version 0 when missing."""

    async def load_tr_with_records(
        self, partition: str
    ) -> tuple[TransactionRecord, tuple[SideEffectRecord, ...]]:
        """The transaction record and all side-effect records of the partition, in one read,
        returned only once what it saw is as durable as a commit of this store (`finish`
        publishes a committed attempt's side effects from it: a commit that a failover may
        still lose must not be published). PostgreSQL: a committed transaction visible on
        the primary need not be on its synchronous standby yet (its wait was cancelled, or
        the primary restarted during it); a barrier commit after the read waits until it is.
        Raises `TransientError` when that wait fails or times out."""

    async def register(self, record: SideEffectRecord, expected_version: int) -> int:
        """Insert `record` and bump the version, only while the TR is idle at
        `expected_version`. Returns the new version; raises `Conflict` otherwise."""

    async def registration_valid(self, record: SideEffectRecord) -> bool:
        """The re-check of protocol 3.2: the record still exists and the TR is idle."""

    async def commit(self, request: CommitRequest) -> Committed:
        """Write everything of `request` in one transaction (see `CommitRequest`). Raises
        `Conflict` unless the TR is idle at `expected_version` (and, with `processed`, the
        message has no processed-message row yet). The processed-message row claims the
        message ID for the endpoint: of two concurrent commits of one ID on two partitions,
        one commits and the other writes nothing and raises `Conflict` (protocol 4).
        Returns the committed TR's version and
        every side-effect record of the partition (the transaction's and its losers'): what
        `finish` would read."""

    async def clear(self, clear: Clear) -> bool:
        """Compare-and-clear (protocol 3.1): only if the TR of `clear.partition` is still at
        `clear.expected_version`, make it idle, bump the version, delete exactly
        `clear.records` and list `clear.aborted` for deferred clean-up at
        `clear.cleanup_due`; with `clear.consume` (and `holds_tokens`) delete that token,
        addressed to this store's endpoint, in the same transaction. Returns whether it
        cleared; raises ValueError for `consume` without `holds_tokens`."""

    # The batched token path (application/token_batch.py): each call is ONE statement for
    # many partitions, with per-partition outcomes exactly those of the single calls above.

    async def load_many(self, partitions: Sequence[str], tokens: Sequence[uuid.UUID | None]
                        ) -> list[Loaded]:
        """`load(partitions[i], tokens[i])` for every i, in one read (one snapshot): the
        transaction records and states, and with `holds_tokens` each token's existence and
        message; the partitions are distinct."""

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[Committed | None]:
        """`commit(request)` for every request, in one transaction, each guarded on its own:
        None in place of the `Conflict` that `commit` would raise, and that partition writes
        nothing (the others commit). The partitions are distinct. Transaction records are
        locked in partition order, so two concurrent batches never deadlock."""

    async def clear_many(self, clears: Sequence[Clear]) -> list[bool]:
        """`clear(...)` for every item of `clears`, in one transaction, each compared on its
        own version; returns whether each cleared. The partitions are distinct; records are
        locked in partition order."""
