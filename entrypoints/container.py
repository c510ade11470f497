"""The composition root: one dependency-injector container per profile."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

from dependency_injector import containers, providers

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.broker import MemoryBroker
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.token_store import MemoryTokenStore
from adapters.system.clock import SystemClock
from application.failpoints import Failpoints
from application.observability import FAULT_INJECTED, CountingSink
from application.ports import EventSink, MessageDispatcher
from entrypoints.embedded import SampleSystem
from entrypoints.settings import Settings

#: The exit status of a process ended by a `crash` failpoint (EX_SOFTWARE of sysexits.h).
CRASH_EXIT = 70


def crash_process(name: str) -> None:
    """The `crash` failpoint action in a process: exit at once, no clean-up, no ack."""
    os.write(2, f"failpoint {name}: crash\n".encode())
    os._exit(CRASH_EXIT)


def fault_logger(events: EventSink) -> Callable[[str, str], None]:
    """The failpoints' `on_fire` hook: a `fault.injected` event (failpoint, action), emitted
    before the action runs (a `crash` exits right after the line is written)."""
    def on_fire(name: str, action: str) -> None:
        events.emit(FAULT_INJECTED, failpoint=name, action=action)
    return on_fire


def failpoints_from(settings: Settings, events: EventSink) -> Failpoints | None:
    """Active failpoints of `EO_FAILPOINTS`, or None (zero cost) when unset."""
    return Failpoints.from_spec(settings.failpoints, crash_process,
                                on_fire=fault_logger(events))


class EmbeddedContainer(containers.DeclarativeContainer):
    """The `embedded` profile: memory stores and broker, blobs in a local directory, the
    payments callee in-process. Nothing is built before a provider is called; tests
    override providers (`container.clock.override(...)`) rather than patch."""

    settings = providers.Dependency(instance_of=Settings)
    clock = providers.Singleton(SystemClock)
    ids = providers.Object(uuid.uuid4)
    events = providers.Singleton(CountingSink)
    failpoints = providers.Singleton(failpoints_from, settings, events)
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
