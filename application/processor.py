"""The processing of one delivery: token path (protocol 3), positive-proof path (protocol 4)
and the state-based path (application/state_based.py)."""

from __future__ import annotations

import enum
import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from application.codec import decode
from application.envelope import REQUEST_URL_HEADER, TOKEN_HEADER, Envelope
from application.errors import (
    Conflict,
    HandlerRejected,
    MalformedMessage,
    PermanentError,
    TransientError,
    UnknownMessageType,
)
from application.failpoints import Failpoints
from application.finisher import Finisher
from application.http_caller import collect_response
from application.locks import PartitionLocks
from application.observability import (
    HANDLER_INVOKED,
    MESSAGE_DUPLICATE,
    MESSAGE_RECEIVED,
    TRANSACTION_COMMITTED,
    TRANSACTION_CONFLICT,
)
from application.ports import (
    BlobStore,
    Clock,
    DocumentRenderer,
    EventSink,
    HttpRequests,
    IdGenerator,
    Loaded,
    MessageDispatcher,
    TokenStore,
    TransactionalStore,
)
from application.preparation import Preparation
from application.records import ProcessedMessage
from application.side_effects import SideEffects, envelope_of
from application.state_based import StateBasedProcessing, StateStream
from domain.context import Context, HttpResponse
from domain.decisions import Decision, Endpoint
from domain.errors import Rejected


class Strategy(enum.StrEnum):
    """How an endpoint recognises duplicates (configuration, per endpoint)."""

    TOKEN = "token"  # protocol 3: a message may be processed only while its token exists
    OUTBOX = "outbox"  # protocol 4: positive proof, one inbox row per processed message
    STATE = "state"  # an event-sourced state stream, outputs re-derived (state_based.py)


class Outcome(enum.StrEnum):
    """How a delivery ended without error."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"


@dataclass
class Ports:
    """The adapters one endpoint's processor works through."""

    tokens: TokenStore
    store: TransactionalStore
    dispatcher: MessageDispatcher
    clock: Clock
    ids: IdGenerator
    events: EventSink
    blobs: BlobStore | None = None
    http: HttpRequests | None = None
    #: service name -> base URL of its HTTP callee (protocol 6), e.g. {"payments": "http://..."}
    services: dict[str, str] = field(default_factory=dict)
    #: renders `Document` blob contents (PDF); required only by handlers that ask for one
    renderer: DocumentRenderer | None = None
    #: `tokens` is the token table of `store`'s database (`store.holds_tokens`): the
    #: co-located fast path of protocol 3.2 (tokens checked, created and consumed inside the
    #: store's own statements). False keeps the general path.
    colocated_tokens: bool = False
    #: the endpoint's state stream; required by (and used only by) `Strategy.STATE`
    state_stream: StateStream | None = None


class _Duplicate(Exception):
    """Internal: the delivery turned out to be a duplicate; ack it."""


class Processor:
    """Processes deliveries for one endpoint, exactly once in effect.

    `process(envelope)` returns an `Outcome` or raises `PermanentError` (dead-letter) or
    `TransientError` (delayed redelivery; conflicts retried `conflict_retries` times first).
    `failpoints` is None when none are configured (the HTTP callee passes
    `failpoints.scoped("callee.")`). Source: protocol.md sections 3.1-3.3 and 4.
    """

    def __init__(
        self,
        endpoint: Endpoint[Any],
        ports: Ports,
        strategy: Strategy = Strategy.TOKEN,
        failpoints: Failpoints | None = None,
        conflict_retries: int = 3,
        cleanup_grace: timedelta = timedelta(minutes=30),
    ) -> None:
        self.endpoint = endpoint
        if ports.colocated_tokens and not ports.store.holds_tokens:
            raise ValueError("colocated_tokens needs a transactional store that holds tokens")
        self.ports = ports
        self.strategy = strategy
        self.conflict_retries = conflict_retries
        self._fp = failpoints
        self._locks = PartitionLocks()
        effects = SideEffects(ports.tokens, ports.dispatcher, ports.blobs, ports.http, failpoints)
        self.finisher = Finisher(endpoint.name, ports, effects, failpoints, cleanup_grace)
        self._prepare = Preparation(endpoint.name, ports, failpoints)
        self._state: StateBasedProcessing | None = None
        if strategy is Strategy.STATE:
            self._state = StateBasedProcessing(endpoint, ports, self.decode, self._handle,
                                               failpoints)

    async def _hit(self, name: str) -> None:
        if self._fp:
            await self._fp.hit(name)

    async def process(self, envelope: Envelope) -> Outcome:
        """Process one delivery; see the class docstring for the errors raised."""
        ev = self.ports.events
        # the body's digest lets an audit of the logs check I2 (every copy identical)
        ev.emit(MESSAGE_RECEIVED, endpoint=self.endpoint.name, message_id=str(envelope.message_id),
                type=envelope.type, body_sha256=hashlib.sha256(envelope.body).hexdigest()[:16])
        for _ in range(self.conflict_retries + 1):
            try:
                return await self._attempt(envelope)
            except _Duplicate:
                ev.emit(MESSAGE_DUPLICATE, endpoint=self.endpoint.name,
                        message_id=str(envelope.message_id))
                return Outcome.DUPLICATE
            except Conflict as exc:
                ev.emit(TRANSACTION_CONFLICT, endpoint=self.endpoint.name,
                        message_id=str(envelope.message_id), reason=str(exc))
        raise TransientError(f"optimistic-concurrency conflict {self.conflict_retries + 1} times")

    async def _load(self, envelope: Envelope) -> Envelope:
        if self.strategy is Strategy.OUTBOX:
            return await self._trusted_request_url(envelope)
        if envelope.header(TOKEN_HEADER) is None:
            raise MalformedMessage("no token header: the sender did not create a token")
        stored = await self.ports.tokens.get(envelope.message_id)
        await self._hit("after_token_load")
        if stored is None:
            raise _Duplicate
        return stored

    async def _trusted_request_url(self, envelope: Envelope) -> Envelope:
        """The outbox path's delivery with its `eo-request-url` only when a sender of ours
        wrote that URL: in the message's token row (the claim check). An outside producer's
        header is dropped: it would make this endpoint POST and DELETE any URL with the
        callee's credential, and ack the command as a duplicate on the 404."""
        url = envelope.header(REQUEST_URL_HEADER)
        if url is None:
            return envelope
        stored = None
        if envelope.header(TOKEN_HEADER) is not None:
            stored = await self.ports.tokens.get(envelope.message_id)
        if stored is not None and stored.header(REQUEST_URL_HEADER) == url:
            return envelope
        return envelope.without(REQUEST_URL_HEADER)

    async def _still_pending(self, m: uuid.UUID, loaded: Loaded) -> None:
        """The check after the TR load: token exists (token path) or no inbox row (outbox)."""
        if self.strategy is Strategy.TOKEN:
            exists = loaded.token_exists  # read with the TR when tokens are co-located
            if exists is None:
                exists = await self.ports.tokens.exists(m)
            if not exists:
                raise _Duplicate
            return
        row = await self.ports.store.processed(m)
        if row is not None:
            # processed before: re-publish the stored, byte-identical copies (protocol 4)
            for stored in row.outgoing:
                destination, env = envelope_of(stored["message_id"], stored)
                await self.ports.dispatcher.dispatch(destination, env)
            raise _Duplicate

    def decode(self, envelope: Envelope) -> Any:
        """The domain message of `envelope`; raises `UnknownMessageType` / `MalformedMessage`."""
        cls = self.endpoint.messages.get(envelope.type)
        if cls is None:
            raise UnknownMessageType(f"unknown message type {envelope.type!r}")
        return decode(cls, envelope.body)

    async def _attempt(self, envelope: Envelope) -> Outcome:
        if self._state is not None:
            if not await self._state.attempt(envelope):
                raise _Duplicate
            return Outcome.PROCESSED
        m = envelope.message_id
        stored = await self._load(envelope)
        message = self.decode(stored)
        partition = self.endpoint.partition_of(message)
        async with self._locks.hold(partition):
            loaded = await self._settle_committed(partition, m)
            await self._still_pending(m, loaded)
            await self._hit("after_token_check")
            return await self._run(stored, message, partition, loaded)

    async def _settle_committed(self, partition: str, m: uuid.UUID) -> Loaded:
        """Load the TR (with the state, and the token when co-located) and finish whatever
        transaction is committed on it (3.1)."""
        check = m if self.strategy is Strategy.TOKEN and self.ports.colocated_tokens else None
        loaded = await self.ports.store.load(partition, check)
        await self._hit("after_tr_load")
        while (tr := loaded.tr).message_id is not None and tr.attempt_id is not None:
            await self.finisher.finish(partition, tr.message_id, tr.attempt_id)
            if tr.message_id == m:
                raise _Duplicate  # it was ours: committed earlier, now finished
            loaded = await self.ports.store.load(partition, check)
        return loaded

    async def _run(self, stored: Envelope, message: Any, partition: str, loaded: Loaded
                   ) -> Outcome:
        ports, name, m, tr = self.ports, self.endpoint.name, stored.message_id, loaded.tr
        attempt = ports.ids()
        response = await self._follow_up_response(stored, partition)
        context = Context(message_id=m, attempt_id=attempt, now=ports.clock.now(),
                          http_response=response)
        ports.events.emit(HANDLER_INVOKED, endpoint=name, message_id=str(m),
                          attempt_id=str(attempt), partition=partition)
        try:
            decision = self._handle(loaded.state, message, context)
        except PermanentError:
            # a rejection judged on a state another attempt has since replaced (maybe by
            # committing this very message) is a conflict, not a verdict
            if (await ports.store.load_tr(partition)).version != tr.version:
                raise Conflict(f"partition {partition} changed while the handler ran") from None
            raise
        await self._hit("after_handler")
        prepared = await self._prepare.run(partition, tr.version, stored, attempt, decision)
        processed = None
        if self.strategy is Strategy.OUTBOX:
            processed = ProcessedMessage(m, partition, prepared.outgoing, ports.clock.now())
        await self._hit("before_commit")
        committed = await ports.store.commit(
            partition, prepared.version, decision.state, m, attempt, prepared.records,
            decision.reply, processed, prepared.tokens)
        ports.events.emit(TRANSACTION_COMMITTED, endpoint=name, message_id=str(m),
                          attempt_id=str(attempt), partition=partition)
        await self._hit("after_commit")
        # the commit returned what finish would read: nothing can add records while the TR
        # is committed, so the committer skips that read (a stale copy is fenced as usual)
        await self.finisher.finish(partition, m, attempt, committed)
        return Outcome.PROCESSED

    def _handle(self, state: Any, message: Any, context: Context) -> Decision[Any]:
        try:
            return self.endpoint.handle(state, message, context)
        except Rejected as exc:
            raise HandlerRejected(f"rejected by handler: {exc.reason}") from exc
        except Exception as exc:  # a pure handler's failure is deterministic: retrying won't help
            raise PermanentError(f"handler failed: {type(exc).__name__}: {exc}") from exc

    async def _follow_up_response(
        self, stored: Envelope, partition: str
    ) -> HttpResponse | None:
        url = stored.header(REQUEST_URL_HEADER)
        if url is None:
            return None
        if self.ports.http is None:
            raise PermanentError("HTTP follow-up received but no HTTP client is configured")
        result = await collect_response(self.ports.http, url, self._fp)
        if result is None:  # 404 without a stored response
            # Another copy may have committed this follow-up and be between the DELETE and
            # the token delete of its finish: a duplicate, which the conflict retry finds.
            # The TR is read BEFORE the token: finish consumes the token before it clears the
            # TR, so an idle TR with the token still there means the request is really
            # unknown. (Protocol 6 checks the token alone, which races with finish.)
            if (await self.ports.store.load_tr(partition)).is_committed:
                raise Conflict(f"request {url} deleted by a committed copy")
            if not await self.ports.tokens.exists(stored.message_id):
                raise _Duplicate
            raise PermanentError(f"request {url} unknown on the callee")
        return result

