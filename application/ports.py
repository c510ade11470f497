"""Ports: what the protocol needs from the outside world, with the guarantees it relies on."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from application.envelope import Envelope
from application.records import (
    Abandoned,
    DeadLetter,
    DeadLetterStatus,
    DeferredCleanup,
    ProcessedMessage,
    SideEffectRecord,
    StateEntry,
    TransactionRecord,
)
from domain.decisions import Reply
from domain.documents import Document


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


class TokenStore(Protocol):
    """Tokens: a row per in-flight message whose existence authorises processing it.

    A token is *addressed*: it names the endpoint the message was sent to, and only that
    endpoint may read, check or consume it (every method takes the `endpoint`). A message ID
    alone never reaches another endpoint's token, so a delivery to one endpoint whose ID
    equals another's live token (an outside producer can read IDs in logs) finds no token
    (project amendment to protocol 3; tokens written before the amendment have no address
    and stay readable by any endpoint of the token path until they drain). The row holds the
    message (claim check), so reading the body and checking the token are one read. All
    methods are idempotent. Raises `TransientError` when the store is unreachable.
    """

    async def create(self, endpoint: str, envelopes: Sequence[Envelope]) -> None:
        """Create a token addressed to `endpoint` per envelope; an existing token is left as
        it is."""

    async def get(self, endpoint: str, message_id: uuid.UUID) -> Envelope | None:
        """The stored message of the token addressed to `endpoint`, or None when there is no
        such token (a duplicate, consumed, or addressed to another endpoint)."""

    async def exists(self, endpoint: str, message_id: uuid.UUID) -> bool:
        """Whether the token addressed to `endpoint` exists."""

    async def delete(self, endpoint: str, message_id: uuid.UUID) -> None:
        """Delete the token addressed to `endpoint` (consume); a missing token is a no-op."""

    async def count(self) -> int:
        """Tokens in flight, all endpoints (a gauge, and the I9 check)."""

    async def count_of(self, addresses: Sequence[tuple[str, uuid.UUID]]) -> int:
        """How many of these tokens, each (endpoint, message ID), exist (the tokens that
        dead letters keep: `application.dead_letters.DeadLetters.gauges`)."""


class IncomingTokens(Protocol):
    """The tokens one endpoint may consume: what its token path reads, checks after the TR
    load, and deletes last in `finish` (protocol 3.1). For a consumer, its addressed tokens
    in the `TokenStore` (`application.token_path.AddressedTokens`); for an HTTP callee, its
    stored requests (`RequestStore`). Raises `TransientError` when unreachable."""

    async def get(self, message_id: uuid.UUID) -> Envelope | None:
        """The stored message, or None when no token exists (duplicate or consumed)."""

    async def exists(self, message_id: uuid.UUID) -> bool:
        """Whether the token exists."""

    async def delete(self, message_id: uuid.UUID) -> None:
        """Consume the token; a missing token is a no-op."""


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
        """The transaction record and all side-effect records of the partition, in one read."""

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


class MessageDispatcher(Protocol):
    """Publishes messages to endpoint queues.

    `dispatch` returns only once the broker confirmed the message (publisher confirm); raises
    `TransientError` otherwise. Re-dispatching an ID is harmless: receivers drop copies.
    """

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        """Publish `envelope` persistently to the queue of endpoint `destination`."""


class DeadLetterPublisher(Protocol):
    """Dead letters published outside a delivery (the inbox relay's rows that cannot be
    relayed)."""

    async def dead_letter(self, endpoint: str, envelope: Envelope) -> None:
        """Publish `envelope` (a dead-letter copy: its headers say why) to `endpoint`'s
        dead-letter queue, confirmed. Raises `TransientError` when the broker fails or the
        queue is full (the caller tries again later)."""


class InboxClaim(Protocol):
    """Pending inbox rows held by one relay until its claim ends: no other claim sees them
    meanwhile. `mark_relayed` takes effect when the claim ends without an exception; when it
    ends with one (a crash) nothing is marked and the rows are pending again."""

    #: the claimed rows, oldest first: natural message ID, type, body (no headers) and the
    #: producer that added the row (`Envelope.producer`)
    envelopes: Sequence[Envelope]

    async def mark_relayed(self, rows: Sequence[Envelope]) -> None:
        """Mark these claimed rows (by producer and message ID; others are ignored) relayed:
        published and confirmed by the broker, to the work queue or, for a row that cannot
        be relayed, to the dead-letter queue."""


class Inbox(Protocol):
    """A boundary endpoint's inbox (protocol 4): commands of outside producers under their
    natural message IDs, waiting to be relayed to the endpoint's work queue.

    The producer and its natural ID are the key: adding an ID that producer added before,
    relayed or not, is a no-op, so a re-run producer adds no duplicate, and no producer can
    squat another's IDs. The producer is the identity the store authenticated: PostgreSQL's
    role that inserted the row (`current_user`); the memory adapter takes the envelope's
    `producer` as given. Relayed rows stay (with their relay time) until the
    retention purge; that window is the one in which a re-run is recognised. Relaying is
    at least once: the endpoint's own outbox deduplication drops a re-published copy.
    Raises `TransientError` when the store is unreachable.
    """

    async def add(self, envelopes: Sequence[Envelope]) -> int:
        """Insert the rows whose (producer, message ID) are new; returns how many were
        new."""

    def claim(self, limit: int) -> AbstractAsyncContextManager[InboxClaim]:
        """Claim up to `limit` (>= 1) pending rows, oldest first, skipping rows another
        claim holds; an empty claim when none is pending."""

    async def purge_relayed(self, before: datetime) -> int:
        """Delete rows relayed before `before` (never a pending one); returns how many."""

    async def count_pending(self) -> int:
        """Rows not relayed yet."""


class Delivery(Protocol):
    """One broker delivery of an envelope, to be settled exactly once. A copy (retry or dead
    letter) carries the envelope's headers (the protocol's and the kept ones, each capped:
    `application.envelope.known_headers`) plus its own, every value capped too."""

    envelope: Envelope
    #: 1 on first delivery, incremented by each delayed redelivery.
    attempt: int

    async def ack(self) -> None:
        """Remove the delivery from the queue."""

    async def retry(self, delay_s: float, reason: str) -> None:
        """Redeliver after `delay_s` seconds (delayed-retry queue), counting an attempt."""

    async def dead_letter(self, reason: str, endpoint: str, body_limit: int | None = None
                          ) -> None:
        """Move to the dead-letter queue with reason, endpoint, attempt and time headers
        (`application.envelope.dead_letter_headers`); with `body_limit`, the copy carries
        at most that many bytes of the body plus its size and SHA-256
        (`application.envelope.clipped_body`: a message no replay can use). While the
        dead-letter queue is full this waits, holding the delivery, and the endpoint takes
        no new delivery; raises `TransientError` when the broker fails or the delivery is
        given back meanwhile (the broker redelivers it)."""


class BlobStore(Protocol):
    """Blobs (S3 objects or files). `put` overwrites, `delete` is idempotent."""

    async def put(self, key: str, content: bytes, media_type: str) -> None:
        """Store `content` under `key`."""

    async def delete(self, key: str) -> None:
        """Delete `key`; a missing key is a no-op."""

    async def exists(self, key: str) -> bool:
        """Whether `key` exists."""

    async def keys(self, prefix: str = "") -> list[str]:
        """All keys under `prefix`, sorted."""


@dataclass(frozen=True)
class HttpResult:
    """A callee's answer: status, JSON body and whether it is a stored business response
    (header `EO-Stored-Response: true`, protocol 6)."""

    status: int
    body: Mapping[str, Any]
    stored: bool


class HttpRequests(Protocol):
    """The caller's side of the HTTP protocol (protocol 6). Raises `TransientError` on network
    errors and 5xx; `put` raises `RequestDeleted` (a `Conflict`) on 410 (the attempt's own
    request was deleted by a winner's clean-up) and `PermanentError` on any other non-2xx
    (409 other body, 401, 413: the caller PUTs a fresh ID each attempt); `delete` accepts
    2xx and 404."""

    async def put(self, url: str, body: bytes) -> None:
        """Store the request body under `url` (create-only on the callee)."""

    async def post(self, url: str) -> HttpResult:
        """Ask the callee to process the stored request; returns its answer as is."""

    async def delete(self, url: str) -> None:
        """Delete the request and its response (idempotent on the callee)."""


@dataclass(frozen=True)
class ApiResult:
    """A third-party API's answer: HTTP `status`, JSON `body` (an object; anything else is
    wrapped), and its `Retry-After` in seconds when it sent one."""

    status: int
    body: Mapping[str, Any]
    retry_after_s: float | None = None


class ThirdPartyApis(Protocol):
    """The third-party HTTP APIs of protocol 12, by name: base URL and credential come from
    configuration, never from a message."""

    async def send(self, api: str, method: str, path: str, body: bytes | None,
                   idempotency_key: str) -> ApiResult:
        """Send `method` `path` (under `api`'s base URL) with JSON `body` and the header
        `Idempotency-Key: <idempotency_key>`; the answer as it came. Raises
        `TransientError` on a network error or a timeout, `PermanentError` for an API not
        configured."""


@dataclass(frozen=True)
class ApiPolicy:
    """How an endpoint calls one third-party API (protocol 12): the provider's
    `key_retention`, and `tries` sends per attempt, waiting `backoff_s[i]` seconds before
    try i + 2 (the last value repeats) or the provider's `Retry-After` (at most
    `max_retry_after_s`)."""

    key_retention: timedelta
    tries: int = 3
    backoff_s: tuple[float, ...] = (0.2, 1.0)
    max_retry_after_s: float = 30.0


class DocumentRenderer(Protocol):
    """Turns a handler's `Document` into bytes, deterministically (same document, same
    bytes), so a blob's content depends only on the decision."""

    media_type: str

    def render(self, document: Document) -> bytes:
        """The document's bytes (e.g. a PDF); raises ValueError for an unprintable one."""


class Clock(Protocol):
    """Wall-clock time, injected so the protocol and its tests control it."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class IdGenerator(Protocol):
    """Fresh attempt, message and artifact IDs (uuid4 in production, seeded in tests)."""

    def __call__(self) -> uuid.UUID:
        """A new unique ID."""


class EventSink(Protocol):
    """Structured events of protocol 9 (logged as JSON and counted as metrics)."""

    def emit(self, event: str, **fields: object) -> None:
        """Record `event` with its fields (endpoint, message_id, attempt_id, partition, ...)."""


class SpanKind(enum.StrEnum):
    """What a span stands for, as OpenTelemetry's span kinds: a message processed
    (`CONSUMER`), a message published (`PRODUCER`), a request to another service
    (`CLIENT`), a step inside either (`INTERNAL`)."""

    INTERNAL = "internal"
    CONSUMER = "consumer"
    PRODUCER = "producer"
    CLIENT = "client"


#: A span attribute's value (OpenTelemetry's primitive attribute types).
SpanValue = str | int | bool


class Span(Protocol):
    """One span of a `Tracer`, started and not yet ended."""

    def set(self, name: str, value: SpanValue) -> None:
        """Set attribute `name` (e.g. `eo.outcome`)."""

    def current(self) -> AbstractContextManager[None]:
        """Make this span the current one inside the `with` block (its children, and the
        trace context `Tracer.headers` gives, are this span's); it does not end it."""

    def end(self, error: BaseException | None = None) -> None:
        """End the span; `error` marks it failed and is recorded as an exception event."""


class Tracer(Protocol):
    """Spans of the protocol's steps (OpenTelemetry: adapters/tracing.py). Where tracing is
    off there is no tracer (`Ports.tracer` is None) and the steps do nothing for it.

    A message's trace context travels in its headers (`TRACE_HEADERS`: W3C `traceparent`
    and `tracestate`), written when the message is prepared, so it is part of the committed
    message: every delivery of a message, on every attempt, continues the trace of the
    attempt that committed it."""

    def start(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
              attributes: Mapping[str, SpanValue] | None = None,
              parent: Mapping[str, str] | None = None,
              links: Sequence[Mapping[str, str]] = ()) -> Span:
        """A new span, not yet current. `parent`: message headers whose trace context is
        the span's parent (without one, the current span is); `links`: message headers
        whose trace contexts the span links to (a batch links each message's)."""

    def span(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
             attributes: Mapping[str, SpanValue] | None = None,
             parent: Mapping[str, str] | None = None,
             links: Sequence[Mapping[str, str]] = ()) -> AbstractContextManager[Span]:
        """`start`, current inside the `with` block and ended at its exit (failed when the
        block raises)."""

    def headers(self) -> dict[str, str]:
        """The current trace context as message headers (`TRACE_HEADERS`); empty when no
        span is current."""


class PutResult(enum.StrEnum):
    """Outcome of storing a request on the HTTP callee (protocol 6, PUT)."""

    CREATED = "created"
    SAME = "same"  # same body stored before: 200
    DIFFERENT = "different"  # another body under this ID: 409
    GONE = "gone"  # deleted before (tombstone): 410


class RequestStore(IncomingTokens, Protocol):
    """The HTTP callee's stored requests. As its `IncomingTokens` a request is a token: `get`
    and `exists` see it while stored and not answered, `delete` marks it answered (the
    consume step). Tombstones of deleted requests are kept for the retention window."""

    async def put(self, request_id: uuid.UUID, envelope: Envelope) -> PutResult:
        """Store a request create-only; see `PutResult`."""

    async def known(self, request_id: uuid.UUID) -> bool:
        """Whether the request is stored, answered or not (not deleted)."""

    async def remove(self, request_id: uuid.UUID, now: datetime) -> None:
        """Delete the request and keep a tombstone, also for an unknown ID (idempotent)."""

    async def purge_tombstones(self, before: datetime) -> int:
        """Drop tombstones made before `before`; returns how many."""

    async def count(self) -> int:
        """Requests stored, answered or not (what the caller has yet to DELETE)."""


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


@dataclass(frozen=True)
class DeadLetterQuery:
    """Which dead letters: those of `endpoints` (all when empty), with `ids` (any when
    empty), in `status` (any when None), whose latest reason contains `reason` (case
    apart), last dead-lettered before `before` and from `after` on (UTC; None: no bound);
    at most `limit` (>= 1), oldest first."""

    endpoints: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    status: DeadLetterStatus | None = DeadLetterStatus.DEAD
    reason: str | None = None
    before: datetime | None = None
    after: datetime | None = None
    limit: int = 100


class HeldDeadLetter(Protocol):
    """A dead letter held for one operator's action (`DeadLetterStore.hold`): no other hold
    gets it meanwhile. The mark takes effect when the hold ends without an exception."""

    letter: DeadLetter

    async def replayed(self, by: str) -> None:
        """Mark it republished by `by`."""

    async def discarded(self, by: str, why: str) -> None:
        """Mark it discarded by `by`, for `why`."""


class DeadLetterStore(Protocol):
    """The dead letters of a service's endpoints, kept until an operator acts on them
    (application/dead_letters.py) and purged after the retention window. Raises
    `TransientError` when unreachable."""

    async def add(self, letter: DeadLetter) -> int:
        """Keep `letter`; returns its `dead_letter_id`. A replayable message already kept
        under the same endpoint, producer, message ID and digest is the same dead letter
        dead-lettered again: its reasons are appended (a reason already there, same time
        and text, is not repeated: the collector is at least once) and it is `dead` again."""

    async def find(self, query: DeadLetterQuery) -> list[DeadLetter]:
        """The dead letters `query` selects, oldest first."""

    def hold(self, dead_letter_id: int) -> AbstractAsyncContextManager[HeldDeadLetter | None]:
        """Hold dead letter `dead_letter_id` for an action; None when it does not exist or
        another hold has it (two operators, one action)."""

    async def waiting(self) -> list[tuple[str, uuid.UUID]]:
        """(endpoint, message ID) of the `dead` ones with a message ID (the gauges: the
        tokens that dead letters keep)."""

    async def counts(self) -> dict[str, dict[str, int]]:
        """Per endpoint, how many dead letters are in each status."""

    async def purge(self, before: datetime) -> int:
        """Delete the replayed and discarded ones acted on before `before` (the record of
        what operators did stays a retention window); returns how many."""


@dataclass
class Ports:
    """The adapters one endpoint is assembled from (application/assembly.py hands each
    collaborator only the ports it uses). Built by the composition root per profile."""

    tokens: TokenStore
    store: TransactionalStore
    dispatcher: MessageDispatcher
    clock: Clock
    ids: IdGenerator
    events: EventSink
    blobs: BlobStore | None = None
    http: HttpRequests | None = None
    #: callee name -> base URL of its HTTP callee (protocol 6), e.g. {"payments": "http://..."}
    services: dict[str, str] = field(default_factory=dict)
    #: renders `Document` blob contents (PDF); required only by handlers that ask for one
    renderer: DocumentRenderer | None = None
    #: `tokens` is the token table of `store`'s database (`store.holds_tokens`): the
    #: co-located fast path of protocol 3.2 (tokens checked, created and consumed inside the
    #: store's own statements). False keeps the general path.
    colocated_tokens: bool = False
    #: the endpoint's state stream; required by (and used only by) `Strategy.STATE`
    state_stream: StateStream | None = None
    #: the tokens this endpoint consumes when they are not its addressed tokens in `tokens`:
    #: an HTTP callee's stored requests (`RequestStore`)
    incoming: IncomingTokens | None = None
    #: the endpoints that receive messages with tokens (the `token` strategy): only those
    #: get a token per message; the others (outbox, state) deduplicate by message ID and
    #: consume no token. None: every destination gets one.
    token_receivers: frozenset[str] | None = None
    #: spans of the protocol's steps; None: tracing is off (nothing is traced)
    tracer: Tracer | None = None
    #: the third-party APIs this endpoint calls (protocol 12), and how, by API name
    apis: ThirdPartyApis | None = None
    api_policies: Mapping[str, ApiPolicy] = field(default_factory=dict)
