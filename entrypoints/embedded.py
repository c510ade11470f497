"""The `embedded` profile: every endpoint of the service in one process on the memory adapters
(stores, broker, inboxes, state streams), blobs in a local directory, callees in-process."""

from __future__ import annotations

import uuid

from dependency_injector import containers, providers

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.apis import SandboxApis
from adapters.memory.broker import MemoryBroker
from adapters.memory.http import InProcessHttp
from adapters.memory.inbox import MemoryInbox
from adapters.memory.inspection import MemoryInspection
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.state_stream import MemoryStateStream
from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.pdf import document_renderer
from adapters.routed_apis import RoutedApis
from adapters.system.clock import SystemClock
from application.failpoints import Failpoints
from application.http_callee import HttpCallee
from application.observability import CountingSink
from application.ports import (
    BlobStore,
    Clock,
    DeadLetterPublisher,
    EventSink,
    IdGenerator,
    MessageDispatcher,
)
from application.ports.null_tracer import NULL_TRACER
from application.registry import Role
from application.strategy import Strategy
from application.wiring import Adapters
from entrypoints.composition import tunables_of, workers_of
from entrypoints.faults import failpoints_from
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from entrypoints.tracing import Tracing, tracing_resource


def memory_adapters(
    service: Service,
    clock: Clock,
    ids: IdGenerator,
    events: EventSink,
    dispatcher: MessageDispatcher,
    tokens: MemoryTokenStore,
    blobs: BlobStore | None,
    failpoints: Failpoints | None = None,
    dead_letters: DeadLetterPublisher | None = None,
    tracing: Tracing | None = None,
) -> Adapters:
    """The service's adapters on memory stores: a transactional store per endpoint, a state
    stream per `state` endpoint, a request store per callee (served in this process), an
    inbox per gateway, an in-process sandbox provider per third-party API; traced when
    `tracing` is on."""
    registry = service.registry
    stores = {name: MemoryTransactionalStore(clock) for name in registry.names()}
    streams = {name: MemoryStateStream(clock) for name in registry.names()
               if service.strategy(name) is Strategy.STATE}
    requests = {name: MemoryRequestStore() for name in registry.names(Role.CALLEE)}
    inboxes = {name: MemoryInbox(clock) for name in registry.names(Role.GATEWAY)}
    callees: dict[str, HttpCallee] = {}
    return Adapters(
        clock=clock, ids=ids, events=events, dispatcher=dispatcher, tokens=tokens,
        stores=stores, inspection=MemoryInspection(tokens, stores, streams, requests, inboxes),
        requests=requests, inboxes=inboxes, streams=streams, blobs=blobs,
        renderer=document_renderer() if any(r.blobs for r in registry) else None,
        http=InProcessHttp(callees), local_callees=callees,
        dead_letter_publisher=dead_letters, failpoints=failpoints,
        tracer=tracing.tracer if tracing else NULL_TRACER,
        apis=RoutedApis({api.name: SandboxApis(apis=[api.name], timeout_s=api.timeout_s)
                         for api in registry.apis})
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
        MemoryBroker, dead_letter_max_bytes=settings.provided.rabbitmq.dead_letter_max_bytes)
    dispatcher = providers.Callable(lambda broker: broker, broker)
    tokens = providers.Singleton(MemoryTokenStore)
    blobs = providers.Singleton(LocalDirectoryBlobStore, root=settings.provided.blobs.blob_dir)
    #: OpenTelemetry from the `OTEL_*` variables, or None (off)
    tracing = providers.Resource(tracing_resource, providers.Object("eo-embedded"))
    adapters = providers.Singleton(
        memory_adapters, service=service, clock=clock, ids=ids, events=events,
        dispatcher=dispatcher, tokens=tokens, blobs=blobs, failpoints=failpoints,
        dead_letters=broker, tracing=tracing)
    tunables = providers.Singleton(tunables_of, settings)
    #: the service's workers (`application.workers.Workers`)
    workers = providers.Singleton(workers_of, service, adapters, tunables)
