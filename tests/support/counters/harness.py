"""The counters service on the embedded profile's composition root, made deterministic for
unit tests: a manual clock, seeded IDs, blobs in memory, failpoints whose `crash` raises
`Crash` (the test plays the dead process), and helpers to send and take messages."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.broker import MemoryBroker, MemoryDelivery
from adapters.memory.inbox import MemoryInbox
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.system.clock import ManualClock, SeededIds
from application.assembly import build_processor
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from application.failpoints import Failpoints
from application.http_callee import HttpCallee
from application.observability import HANDLER_INVOKED, CountingSink
from application.processor import Processor
from application.settlement import Settler
from application.strategy import Strategy
from application.sweeper import Sweeper
from application.workers import Workers
from entrypoints.embedded import EmbeddedContainer
from entrypoints.service_spec import resolve_service
from entrypoints.settings import load_settings
from tests.support.counters.endpoints import Account
from tests.support.counters.registry import REGISTRY
from tests.support.world import crash


@dataclass
class Counters:
    """The counters service on memory adapters (`system`), with its adapters typed for the
    tests that read them directly."""

    system: Workers
    broker: MemoryBroker
    clock: ManualClock
    events: CountingSink
    blobs: MemoryBlobStore
    tokens: MemoryTokenStore

    @property
    def bank(self) -> HttpCallee:
        """The `bank` callee (served in this process)."""
        return self.system.callees["bank"]

    @property
    def requests(self) -> MemoryRequestStore:
        """The bank's stored requests (its tokens) and tombstones."""
        requests = self.system.requests["bank"]
        assert isinstance(requests, MemoryRequestStore)
        return requests

    @property
    def inbox(self) -> MemoryInbox:
        """The inbox table of the `front` gateway."""
        inbox = self.system.inboxes["front"]
        assert isinstance(inbox, MemoryInbox)
        return inbox

    def store(self, name: str) -> Any:
        """Endpoint `name`'s memory transactional store."""
        return self.system.stores[name]

    def state(self, name: str, partition: str) -> Any:
        """The business state of `partition` at endpoint `name` (None when never written)."""
        p = self.store(name).partitions.get(partition)
        return p.state if p is not None else None

    def runs(self, name: str) -> int:
        """How many times endpoint `name`'s handler ran."""
        return self.events.counts[(name, HANDLER_INVOKED)]

    def open_account(self, account: str, balance: int) -> None:
        """Open the bank account `account` with `balance` (replacing any it had)."""
        self.store("bank").seed_state(account, Account(balance))

    def processor(self, name: str) -> Processor:
        """A new worker of endpoint `name` (the system's failpoints)."""
        return self.system.processor(name)

    def consumer(self, name: str) -> Settler:
        """A new consumer of endpoint `name` (its own processor)."""
        return self.system.consumer(name)

    def sweeper(self, name: str) -> Sweeper:
        """The sweeper of endpoint `name`."""
        return self.system.sweeper(name)

    def worker(self, name: str, failpoints: str) -> Processor:
        """A worker of endpoint `name` with failpoints of its own (`crash` raises `Crash`)."""
        s = self.system
        return build_processor(s.registry[name].endpoint, s.ports(name), s.strategy(name),
                               Failpoints.from_spec(failpoints, crash),
                               s.tunables.conflict_retries, s.grace)


def counters(failpoints: str | None = None, seed: int = 11, colocated: bool = False,
             **settings: Any) -> Counters:
    """The counters service through `EmbeddedContainer` with `settings` (keyword overrides of
    `load_settings`) and `failpoints` (an `EO_FAILPOINTS` spec, `crash` raising `Crash`);
    `colocated`: the token endpoints' stores hold the tokens (protocol 3.2's fast path, as
    the services' PostgreSQL does when `EO_TOKEN_DSN` is unset) instead of the general path."""
    loaded = load_settings(**settings)
    container = EmbeddedContainer(settings=loaded, service=resolve_service(loaded, REGISTRY))
    clock, events, blobs = ManualClock(), CountingSink(), MemoryBlobStore()
    broker, tokens = MemoryBroker(clock=clock), MemoryTokenStore()
    container.clock.override(clock)
    container.ids.override(SeededIds(seed))
    container.events.override(events)
    container.blobs.override(blobs)
    container.broker.override(broker)
    container.tokens.override(tokens)
    container.failpoints.override(Failpoints.from_spec(failpoints, crash))
    if colocated:  # before any worker is built: each takes its ports from the adapters
        adapters = container.adapters()
        stores: Any = adapters.stores  # the memory profile's dict, which inspection reads too
        for name, strategy in container.service().strategies.items():
            if strategy is Strategy.TOKEN and name in REGISTRY.consuming():
                stores[name] = MemoryTransactionalStore(clock, tokens, name)
        container.adapters.override(replace(adapters, colocated_tokens=True))
    system = container.workers()
    return Counters(system, broker, clock, events, blobs, tokens)


def token_envelope(message: object, message_id: uuid.UUID) -> Envelope:
    """What a token-based sender sends (create its token before delivering it)."""
    return Envelope(message_id, type(message).__name__, encode(message),
                    MappingProxyType({TOKEN_HEADER: "1"}))


def outside_envelope(message: object, message_id: uuid.UUID) -> Envelope:
    """What an outside producer sends to a gateway: its own message ID, no token."""
    return Envelope(message_id, type(message).__name__, encode(message), MappingProxyType({}))


async def take(broker: MemoryBroker, queue: str, consumer: str = "test",
               timeout_s: float = 2.0) -> MemoryDelivery:
    """The next delivery of `queue` for `consumer`, left unsettled."""
    deliveries = broker.consume(queue, consumer)
    try:
        return await asyncio.wait_for(anext(deliveries), timeout_s)
    finally:
        await deliveries.aclose()
