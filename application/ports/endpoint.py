"""`Ports`: the adapters one endpoint is assembled from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from application.ports.messaging import MessageDispatcher
from application.ports.null_tracer import NULL_TRACER
from application.ports.observability import Clock, EventSink, IdGenerator, Tracer
from application.ports.side_effects import (
    ApiPolicy,
    BlobStore,
    DocumentRenderer,
    HttpRequests,
    ThirdPartyApis,
)
from application.ports.stores import StateStream, TransactionalStore
from application.ports.tokens import IncomingTokens, TokenStore


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
    #: spans of the protocol's steps; `NULL_TRACER` where tracing is off (nothing is traced)
    tracer: Tracer = NULL_TRACER
    #: the third-party APIs this endpoint calls (protocol 12), and how, by API name
    apis: ThirdPartyApis | None = None
    api_policies: Mapping[str, ApiPolicy] = field(default_factory=dict)
