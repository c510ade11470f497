"""The transactional store's other roles (processed messages, stored replies, the sweeper's
queries, gauges), the store as all of them, and the state strategy's state stream."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from application.ports.partitions import PartitionStore
from application.records import (
    Abandoned,
    DeferredCleanup,
    ProcessedMessage,
    StateEntry,
    TransactionRecord,
)
from domain.decisions import Reply


class ProcessedMessages(Protocol):
    """Processed-message rows of the positive-proof path (protocol 4), written by `commit`."""

    async def processed(self, message_id: uuid.UUID, producer: str = ""
                        ) -> ProcessedMessage | None:
        """The processed-message row of `message_id` sent by `producer` (its authenticated
        identity, "" for none: `Envelope.producer`), or None."""


class StoredReplies(Protocol):
    """An HTTP callee's stored business responses (protocol 6), written by `commit`."""

    async def stored_reply(self, message_id: uuid.UUID) -> Reply | None:
        """The stored response to request `message_id`, or None."""

    async def delete_reply(self, message_id: uuid.UUID) -> None:
        """Delete a stored response (idempotent)."""


class SweeperQueries(Protocol):
    """What the sweeper (protocol 8) reads and repairs. Each method is one transaction."""

    async def committed_before(self, cutoff: datetime) -> Sequence[TransactionRecord]:
        """Transaction records committed before `cutoff` (sweeper step 1)."""

    async def due_cleanups(self, now: datetime) -> Sequence[DeferredCleanup]:
        """Deferred clean-ups whose due time has passed (sweeper step 2)."""

    async def drop_cleanups(self, cleanup_ids: Sequence[int]) -> None:
        """Forget deferred clean-ups once their artifacts are deleted."""

    async def abandoned(self, cutoff: datetime) -> Sequence[Abandoned]:
        """Registrations on idle TRs made before `cutoff` (sweeper step 3)."""

    async def take_over(self, abandoned: Abandoned, cleanup_due: datetime) -> bool:
        """In one optimistic write (bump the version, delete the records, list them for
        deferred clean-up) take abandoned registrations over. Returns False on conflict."""

    async def purge_processed(self, before: datetime) -> int:
        """Delete processed-message rows written before `before`; returns how many (sweeper
        step 4)."""


class StoreGauges(Protocol):
    """Counts for gauges and checks at rest."""

    async def unfinished_count(self) -> int:
        """Committed-but-unfinished transaction records."""

    async def cleanup_count(self) -> int:
        """Deferred clean-ups still listed (aborted artifacts not yet deleted for good)."""


class TransactionalStore(PartitionStore, ProcessedMessages, StoredReplies, SweeperQueries,
                         StoreGauges, Protocol):
    """The endpoint's transactional store: business state and protocol state per partition,
    in one database. Adapters implement every role; each collaborator of the protocol is
    given only the role it uses (application/assembly.py)."""


class StateStream(Protocol):
    """An append-only stream of state snapshots per partition, for one endpoint (the state
    strategy, application/state_path.py). Every method is one atomic read or write. Raises
    `TransientError` when unreachable."""

    async def load(
        self, partition: str, message_id: uuid.UUID
    ) -> tuple[Any, int, StateEntry | None]:
        """One consistent read. When `message_id` has no entry: (newest state or None,
        newest version or 0, None). Otherwise: (the state just before that entry, its
        version - 1, the entry); raises `OutsideRetention` when that earlier entry was
        truncated."""

    async def append(
        self,
        partition: str,
        expected_version: int,
        message_id: uuid.UUID,
        state: Any,
        recorded: Mapping[str, Any],
    ) -> int:
        """Append entry `expected_version + 1`, only while the newest version is
        `expected_version` and `message_id` has no entry; returns the new version, raises
        `Conflict` otherwise, and `MessageIdReused` when another partition's entry holds
        `message_id` (an entry claims its ID for the endpoint: another body under it)."""

    async def truncate(self, before: datetime) -> int:
        """Drop every entry whose next entry was appended before `before` (the newest entry
        of a partition always stays). Returns how many were dropped."""
