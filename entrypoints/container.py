"""The composition root: one dependency-injector container per profile."""

from __future__ import annotations

import os
import uuid

from dependency_injector import containers, providers

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.broker import MemoryBroker
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.token_store import MemoryTokenStore
from adapters.system.clock import SystemClock
from application.failpoints import Failpoints
from application.observability import CountingSink
from application.ports import MessageDispatcher
from entrypoints.embedded import SampleSystem
from entrypoints.settings import Settings


def crash_process(name: str) -> None:
    """The `crash` failpoint action in a process: exit at once, no clean-up, no ack."""
    os.write(2, f"failpoint {name}: crash\n".encode())
    os._exit(70)


def failpoints_from(settings: Settings) -> Failpoints | None:
    """Active failpoints of `EO_FAILPOINTS`, or None (zero cost) when unset."""
    return Failpoints.from_spec(settings.failpoints, crash_process)


class EmbeddedContainer(containers.DeclarativeContainer):
    """The `embedded` profile: memory stores and broker, blobs in a local directory, the
    payments callee in-process. Nothing is built before a provider is called; tests
    override providers (`container.clock.override(...)`) rather than patch."""

    settings = providers.Dependency(instance_of=Settings)
    clock = providers.Singleton(SystemClock)
    ids = providers.Object(uuid.uuid4)
    events = providers.Singleton(CountingSink)
    failpoints = providers.Singleton(failpoints_from, settings)
    broker = providers.Singleton(MemoryBroker)
    dispatcher: providers.Object[MessageDispatcher | None] = providers.Object(None)
    tokens = providers.Singleton(MemoryTokenStore)
    requests = providers.Singleton(MemoryRequestStore)
    blobs = providers.Singleton(LocalDirectoryBlobStore, root=settings.provided.blob_dir)
    system = providers.Singleton(
        SampleSystem,
        settings=settings, clock=clock, ids=ids, events=events, broker=broker, tokens=tokens,
        blobs=blobs, requests=requests, failpoints=failpoints, dispatcher=dispatcher,
    )
