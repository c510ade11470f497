"""The sample service on memory adapters for tests: the embedded profile's `System`."""

from __future__ import annotations

from collections.abc import Mapping

from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.broker import MemoryBroker
from adapters.memory.token_store import MemoryTokenStore
from adapters.system.clock import ManualClock, SeededIds
from application.failpoints import Failpoints
from application.observability import CountingSink
from application.ports import (
    BlobStore,
    Clock,
    EventSink,
    HttpRequests,
    IdGenerator,
    MessageDispatcher,
    TokenStore,
)
from entrypoints.embedded import embedded_system
from entrypoints.settings import Settings, resolve_service
from entrypoints.system import System
from service.registry import REGISTRY
from tools.settings import ToolSettings


def sample_system(
    settings: Settings | None = None,
    clock: Clock | None = None,
    ids: IdGenerator | None = None,
    events: EventSink | None = None,
    dispatcher: MessageDispatcher | None = None,
    tokens: TokenStore | None = None,
    blobs: BlobStore | None = None,
    failpoints: Failpoints | None = None,
    http: HttpRequests | None = None,
    urls: Mapping[str, str] | None = None,
) -> System:
    """The sample's endpoints (service/registry.py) on memory stores: a manual clock, seeded
    IDs, a memory broker, token and blob stores unless given. With `http` and `urls`, the
    callees named in `urls` are called over `http` (e.g. an `httpx.MockTransport`)."""
    settings = settings or ToolSettings()
    service = resolve_service(settings, REGISTRY)
    system = embedded_system(
        service, settings, clock or ManualClock(), ids or SeededIds(5),
        events or CountingSink(), dispatcher or MemoryBroker(), tokens or MemoryTokenStore(),
        blobs or MemoryBlobStore(), failpoints)
    if http is None and not urls:
        return system
    return System(service, settings, system.clock, system.ids, system.events,
                  system.dispatcher, system.tokens, system.stores, system.requests,
                  system.inboxes, system.streams, system.blobs, failpoints, http=http,
                  urls=urls, renderer=system.renderer, apis=system.apis)
