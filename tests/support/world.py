"""An endpoint on memory adapters, with recording hooks the invariant checks read."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.state_stream import MemoryStateStream
from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.system.clock import ManualClock, SeededIds
from application.assembly import build_processor, build_sweeper
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from application.errors import Crash
from application.failpoints import Failpoints
from application.observability import CountingSink
from application.ports import ApiPolicy, Ports, ThirdPartyApis
from application.processor import Processor
from application.strategy import Strategy
from application.sweeper import Sweeper
from domain.decisions import Endpoint
from tests.support.set_algebra import SET_ALGEBRA


@dataclass
class RecordingDispatcher:
    """Keeps every dispatch; `on_dispatch` lets a test check I4 at the moment of publication."""

    sent: list[tuple[str, Envelope]] = field(default_factory=list)
    on_dispatch: Callable[[str, Envelope], None] | None = None

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        if self.on_dispatch is not None:
            self.on_dispatch(destination, envelope)
        self.sent.append((destination, envelope))


def crash(name: str) -> None:
    """The `crash` failpoint action in tests: raise `Crash` (the test plays the dead
    process)."""
    raise Crash(name)


@dataclass
class World:
    """One endpoint's stores, shared by every worker (each worker its own `Processor`)."""

    endpoint: Endpoint[Any]
    strategy: Strategy = Strategy.TOKEN
    seed: int = 0
    clock: ManualClock = field(default_factory=ManualClock)
    tokens: MemoryTokenStore = field(default_factory=MemoryTokenStore)
    blobs: MemoryBlobStore = field(default_factory=MemoryBlobStore)
    dispatcher: RecordingDispatcher = field(default_factory=RecordingDispatcher)
    events: CountingSink = field(default_factory=CountingSink)
    #: protocol 3.2's fast path: tokens co-located with the transactional store
    colocated: bool = False
    #: third-party APIs (protocol 12) and the endpoint's policies for them, by name
    apis: ThirdPartyApis | None = None
    api_policies: dict[str, ApiPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store = MemoryTransactionalStore(self.clock,
                                              self.tokens if self.colocated else None,
                                              self.endpoint.name)
        self.ids = SeededIds(self.seed)

    def use_tokens(self, tokens: MemoryTokenStore) -> None:
        """Replace the token store (a probing one), keeping the co-location."""
        self.tokens = tokens
        if self.colocated:
            self.store.tokens = tokens

    def ports(self, wrap: Callable[[str, Any], Any] = lambda _name, port: port,
              general: bool = False) -> Ports:
        """Ports of one worker; `wrap(name, port)` may interpose (the scheduler's gates);
        `general`: this worker takes the general path even where tokens are co-located."""
        return Ports(tokens=wrap("tokens", self.tokens), store=wrap("store", self.store),
                     dispatcher=wrap("dispatcher", self.dispatcher), clock=self.clock,
                     ids=self.ids, events=self.events, blobs=wrap("blobs", self.blobs),
                     colocated_tokens=self.colocated and not general,
                     apis=wrap("apis", self.apis) if self.apis else None,
                     api_policies=self.api_policies)

    def processor(self, failpoints: str | None = None, **kwargs: Any) -> Processor:
        """A worker; `failpoints` is an `EO_FAILPOINTS` spec whose `crash` raises `Crash`;
        `wrap=` and `general=` as `ports` takes them."""
        wrap = kwargs.pop("wrap", lambda _name, port: port)
        general = kwargs.pop("general", False)
        return build_processor(self.endpoint, self.ports(wrap, general), self.strategy,
                               Failpoints.from_spec(failpoints, crash),
                               cleanup_grace=timedelta(minutes=30), **kwargs)

    async def send(self, message: Any, message_id: uuid.UUID | None = None) -> Envelope:
        """What a token-based sender does: create the token, return the envelope to deliver."""
        envelope = Envelope(message_id or uuid.uuid5(uuid.NAMESPACE_OID, json.dumps(
            [type(message).__name__, encode(message).decode(), len(self.tokens.rows)])),
            type(message).__name__, encode(message), MappingProxyType({TOKEN_HEADER: "1"}))
        if self.strategy is Strategy.TOKEN:
            await self.tokens.create(self.endpoint.name, [envelope])
        return envelope

    def sweeper(self, processor: Processor) -> Sweeper:
        """A sweeper finishing through `processor`'s finisher (30 s stale, 30 min grace)."""
        assert processor.finisher is not None
        return build_sweeper(self.endpoint.name, self.ports(), processor.finisher,
                             stale_after=timedelta(seconds=30), grace=timedelta(minutes=30))

    async def quiesce(self) -> None:
        """Let time pass beyond every threshold and sweep: what a live service reaches."""
        self.clock.advance(timedelta(hours=1))
        await self.sweeper(self.processor()).sweep()
        self.clock.advance(timedelta(hours=1))
        await self.sweeper(self.processor()).sweep()


@dataclass
class StateWorld:
    """One state endpoint's stores, shared by every worker."""

    endpoint: Endpoint[Any] = SET_ALGEBRA
    clock: ManualClock = field(default_factory=ManualClock)
    tokens: MemoryTokenStore = field(default_factory=MemoryTokenStore)
    dispatcher: RecordingDispatcher = field(default_factory=RecordingDispatcher)
    events: CountingSink = field(default_factory=CountingSink)

    def __post_init__(self) -> None:
        self.stream = MemoryStateStream(self.clock)
        self.ids = SeededIds(3)

    def processor(self, wrap: Callable[[str, Any], Any] = lambda _n, port: port) -> Processor:
        ports = Ports(tokens=wrap("tokens", self.tokens),
                      store=MemoryTransactionalStore(self.clock),
                      dispatcher=wrap("dispatcher", self.dispatcher), clock=self.clock,
                      ids=self.ids, events=self.events,
                      state_stream=wrap("stream", self.stream))
        return build_processor(self.endpoint, ports, Strategy.STATE)

    async def envelope(self, message: Any, n: int, token: bool = False) -> Envelope:
        headers = {TOKEN_HEADER: "1"} if token else {}
        env = Envelope(uuid.UUID(int=n), type(message).__name__, encode(message),
                       MappingProxyType(headers))
        if token:  # a token of this ID addressed to another endpoint (it must survive)
            await self.tokens.create("elsewhere", [env])
        return env

    def published(self, message_id: uuid.UUID) -> list[tuple[Any, ...]]:
        """(destination, type, body, headers) of every dispatch of `message_id`."""
        return [(dest, e.type, e.body, tuple(sorted(e.headers.items())))
                for dest, e in self.dispatcher.sent
                if e.message_id == message_id]

    def state(self, partition: str = "p") -> Any:
        return self.stream.states().get(partition)
