"""The sample service on memory adapters for tests: the embedded profile's `Workers`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.broker import MemoryBroker
from adapters.memory.http import InProcessHttp
from adapters.memory.token_store import MemoryTokenStore
from adapters.system.clock import ManualClock, SeededIds
from application.failpoints import Failpoints
from application.http_callee import HttpCallee
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
from application.workers import Workers
from entrypoints.composition import tunables_of, workers_of
from entrypoints.embedded import memory_adapters
from entrypoints.settings import Settings, resolve_service
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
) -> Workers:
    """The sample's endpoints (service/registry.py) on memory stores: a manual clock, seeded
    IDs, a memory broker, token and blob stores unless given. With `http` and `urls`, the
    callees named in `urls` are called over `http` (e.g. an `httpx.MockTransport`)."""
    settings = settings or ToolSettings()
    service = resolve_service(settings, REGISTRY)
    adapters = memory_adapters(
        service, clock or ManualClock(), ids or SeededIds(5), events or CountingSink(),
        dispatcher or MemoryBroker(), tokens or MemoryTokenStore(), blobs or MemoryBlobStore(),
        failpoints)
    if http is not None or urls:
        callees: dict[str, HttpCallee] = {}
        adapters = replace(adapters, http=InProcessHttp(callees, http),
                           callee_urls=dict(urls or {}), local_callees=callees)
    return workers_of(service, adapters, tunables_of(settings))
