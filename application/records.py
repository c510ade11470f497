"""Protocol state kept in the transactional store: transaction and side-effect records."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any


class Kind(StrEnum):
    """Side-effect kinds (protocol 5), in the order `finish` publishes and cleans them."""

    HTTP_DELETE = "http_delete"
    HTTP_REQUEST = "http_request"
    BLOB = "blob"
    MESSAGE = "message"


@dataclass(frozen=True)
class TransactionRecord:
    """One row per partition (protocol 2).

    `message_id`/`attempt_id` are both None while idle and name the committed transaction
    otherwise; `version` is bumped by every write and checked by every optimistic write;
    `committed_at` is the commit time (UTC) while committed.
    """

    partition: str
    message_id: uuid.UUID | None
    attempt_id: uuid.UUID | None
    version: int
    committed_at: datetime | None = None

    @property
    def is_committed(self) -> bool:
        """True while a committed transaction waits to be finished."""
        return self.message_id is not None


@dataclass(frozen=True)
class SideEffectRecord:
    """An artifact an attempt will create or has created (protocol 2, "side-effect record").

    - `key`: the artifact's name: a message ID, a blob key, a request URL.
    - `seq`: position in the attempt's decision, so publication keeps the handler's order.
    - `payload`: what publication needs (for a message: destination, type, body, headers).
    - `registered_at`: UTC time of registration, used by the sweeper's grace period.
    - `in_token`: a message record that its outgoing token stands for (co-located tokens,
      protocol 3.2's fast path): the commit that inserts the token writes no record row, only
      the message's ID and `seq` on the transaction record, and the store reads the record
      back from the token while the transaction is committed and the token exists (a
      consumed token was delivered: nothing is left to publish). Such a record read back
      has the commit time as `registered_at`.
    """

    partition: str
    kind: Kind
    key: str
    incoming_id: uuid.UUID
    attempt_id: uuid.UUID
    seq: int
    payload: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    registered_at: datetime | None = None
    in_token: bool = False


@dataclass(frozen=True)
class DeferredCleanup:
    """An aborted artifact to delete again once `due` (UTC) has passed (protocol 8, step 2)."""

    cleanup_id: int
    kind: Kind
    key: str
    payload: Mapping[str, str]
    due: datetime


@dataclass(frozen=True)
class ProcessedMessage:
    """Processed-message row of the positive-proof path (protocol 4): the proof that
    `message_id` was processed, with the stored outgoing messages.

    `outgoing` holds (destination, envelope fields) per message, byte-identical on every
    re-publication; `digest` the processed message's `Envelope.digest` (type and body), so
    a known ID with another type or body is told from a copy; `body_sha256` the body's
    SHA-256, kept for workers before revision 0010 (rows they wrote have no digest, rows
    from before 0005 neither). `producer` is the authenticated producer the row's message
    ID belongs to (`Envelope.producer`): the row claims (producer, message ID).
    """

    message_id: uuid.UUID
    partition: str
    outgoing: tuple[Mapping[str, str], ...]
    processed_at: datetime
    body_sha256: str | None = None
    digest: str | None = None
    producer: str = ""


@dataclass(frozen=True)
class Abandoned:
    """Registrations on an idle transaction record older than the grace period (protocol 8.3)."""

    partition: str
    version: int
    records: tuple[SideEffectRecord, ...]


@dataclass(frozen=True)
class StateEntry:
    """One entry of a partition's state stream (state strategy): the message applied at
    `version` (1, 2, ...), the state after it, and the context recorded at its first
    processing (`now`, `attempt_id`)."""

    partition: str
    version: int
    message_id: uuid.UUID
    state: Any
    recorded: Mapping[str, Any]
    appended_at: datetime


class DeadLetterStatus(StrEnum):
    """Where a dead letter stands: waiting for an operator (`dead`), republished to its
    endpoint (`replayed`: it is `dead` again if it fails again), or `discarded`."""

    DEAD = "dead"
    REPLAYED = "replayed"
    DISCARDED = "discarded"


@dataclass(frozen=True)
class DeadLetterReason:
    """One time a message was dead-lettered: when (UTC), why, and on which attempt."""

    at: datetime
    reason: str
    attempt: int


@dataclass(frozen=True)
class DeadLetter:
    """A message an endpoint dead-lettered (protocol 7), as the dead-letter store keeps it.

    - `dead_letter_id`: the store's number for it (0 before it is stored);
    - `message_id`: None when the message had no valid one (`raw_message_id`: what it had);
    - `producer`, `type`, `body`, `headers`: the message to replay (`headers` without the
      dead-letter ones); `digest`: what tells it from another message under its ID
      (`application.dead_letter_copies.letter_digest`: its type and body, or the whole body's
      SHA-256 when the body was clipped), None without a message ID;
    - `replayable`: False when the body was clipped (malformed, of no known type), or when
      a text of it had to be kept escaped;
    - `originals`: the bytes of each text kept escaped (`application.wire_text.escaped`:
      bytes that were not UTF-8, U+0000), by field: `message_id`, `type`, `producer`,
      `header <name>`, `header name <name>` (the name escaped); empty for most;
    - `origin_id`, `origin_producer`: the outside producer's message its chain started from
      (lineage headers, protocol 9), or its own ID and producer;
    - `reasons`: every time it was dead-lettered, oldest first;
    - `status`, `replays`, `acted_at`, `acted_by`, `discard_reason`: what operators did.
    """

    endpoint: str
    message_id: uuid.UUID | None
    raw_message_id: str | None
    producer: str
    type: str | None
    body: bytes
    headers: Mapping[str, str]
    digest: str | None
    replayable: bool
    origin_id: str | None
    origin_producer: str | None
    reasons: tuple[DeadLetterReason, ...]
    dead_letter_id: int = 0
    status: DeadLetterStatus = DeadLetterStatus.DEAD
    replays: int = 0
    acted_at: datetime | None = None
    acted_by: str | None = None
    discard_reason: str | None = None
    originals: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def first_at(self) -> datetime:
        """When it was first dead-lettered."""
        return self.reasons[0].at

    @property
    def last_at(self) -> datetime:
        """When it was last dead-lettered (its age counts from then)."""
        return self.reasons[-1].at

    @property
    def reason(self) -> str:
        """The latest reason."""
        return self.reasons[-1].reason
