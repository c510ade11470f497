"""The `embedded` profile: every endpoint of the service in one process on the memory adapters
(stores, broker, inboxes, state streams), blobs in a local directory, callees in-process."""

from __future__ import annotations

import uuid
from typing import Any

from dependency_injector import containers, providers

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.apis import SandboxApis
from adapters.memory.broker import MemoryBroker
from adapters.memory.inbox import MemoryInbox
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.state_stream import MemoryStateStream
from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.pdf import document_renderer
from adapters.system.clock import SystemClock
from application.failpoints import Failpoints
from application.null_tracer import NULL_TRACER
from application.observability import CountingSink
from application.ports import (
    BlobStore,
    Clock,
    DeadLetterPublisher,
    EventSink,
    IdGenerator,
    MessageDispatcher,
    TokenStore,
)
from application.registry import Role
from application.strategy import Strategy
from entrypoints.faults import failpoints_from
from entrypoints.settings import Service, Settings
from entrypoints.system import RoutedApis, System
from entrypoints.tracing import Tracing, tracing_resource


class StreamStatesStore(MemoryTransactionalStore):
    """The (unused) transactional store of a `state` endpoint in the embedded profile: its
    `states()` are its state stream's newest snapshots, so reports and oracles read one
    place whatever the strategy."""

    def __init__(self, clock: Clock, stream: MemoryStateStream) -> None:
        super().__init__(clock)
        self.stream = stream

    def states(self) -> dict[str, Any]:
        return self.stream.states()


def embedded_system(
    service: Service,
    settings: Settings,
    clock: Clock,
    ids: IdGenerator,
    events: EventSink,
    dispatcher: MessageDispatcher,
    tokens: TokenStore,
    blobs: BlobStore | None,
    failpoints: Failpoints | None,
    dead_letters: DeadLetterPublisher | None = None,
    tracing: Tracing | None = None,
) -> System:
    """The service on memory stores: one transactional store per endpoint (a `state`
    endpoint's reads its stream), a request store per callee, an inbox per gateway, an
    in-process sandbox provider per third-party API; traced when `tracing` is on."""
    registry = service.registry
    stores: dict[str, MemoryTransactionalStore] = {}
    streams: dict[str, MemoryStateStream] = {}
    for name in registry.names():
        if service.strategy(name) is Strategy.STATE:
            streams[name] = MemoryStateStream(clock)
            stores[name] = StreamStatesStore(clock, streams[name])
        else:
            stores[name] = MemoryTransactionalStore(clock)
    return System(
        service, settings, clock, ids, events, dispatcher, tokens, stores,
        requests={name: MemoryRequestStore() for name in registry.names(Role.CALLEE)},
        inboxes={name: MemoryInbox(clock) for name in registry.names(Role.GATEWAY)},
        streams=streams, blobs=blobs, failpoints=failpoints,
        renderer=document_renderer() if any(r.blobs for r in registry) else None,
        dead_letters=dead_letters, tracer=tracing.tracer if tracing else NULL_TRACER,
        apis=RoutedApis({api.name: SandboxApis() for api in registry.apis})
        if registry.apis else None)


class EmbeddedContainer(containers.DeclarativeContainer):
    """The `embedded` profile's composition root: memory stores and broker, blobs in a local
    directory (`EO_BLOB_DIR`), callees in-process. Nothing is built before a provider is
    called; tests override providers (`container.clock.override(...)`) rather than patch."""

    settings = providers.Dependency(instance_of=Settings)
    service = providers.Dependency(instance_of=Service)
    clock = providers.Singleton(SystemClock)
    ids = providers.Object(uuid.uuid4)
    events = providers.Singleton(CountingSink)
    failpoints = providers.Singleton(failpoints_from, settings, events)
    broker = providers.Singleton(
        MemoryBroker, dead_letter_max_bytes=settings.provided.dead_letter_max_bytes)
    dispatcher = providers.Callable(lambda broker: broker, broker)
    tokens = providers.Singleton(MemoryTokenStore)
    blobs = providers.Singleton(LocalDirectoryBlobStore, root=settings.provided.blob_dir)
    #: OpenTelemetry from the `OTEL_*` variables, or None (off)
    tracing = providers.Resource(tracing_resource, providers.Object("eo-embedded"))
    system = providers.Singleton(
        embedded_system, service=service, settings=settings, clock=clock, ids=ids,
        events=events, dispatcher=dispatcher, tokens=tokens, blobs=blobs,
        failpoints=failpoints, dead_letters=broker, tracing=tracing)
