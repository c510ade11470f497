"""The sample service wired on memory adapters: the embedded profile's composition."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from adapters.memory.broker import MemoryBroker
from adapters.memory.http import InProcessHttp
from adapters.memory.inbox import MemoryInbox
from adapters.memory.state_stream import MemoryStateStream
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.pdf.renderer import PdfRenderer
from application.consumer import Consumer
from application.failpoints import Failpoints
from application.http_callee import HttpCallee
from application.inbox_relay import InboxRelay
from application.ports import (
    BlobStore,
    Clock,
    EventSink,
    HttpRequests,
    IdGenerator,
    Inbox,
    MessageDispatcher,
    RequestStore,
    TokenStore,
    TransactionalStore,
)
from application.processor import Ports, Processor, Strategy
from application.state_based import StateRetention, StateStream
from application.sweeper import Sweeper
from domain.decisions import Endpoint
from domain.sample import LEDGER, ORDERS, PAYMENTS
from domain.sample.gateway import GATEWAY
from entrypoints.settings import Settings

ENDPOINTS: dict[str, Endpoint[Any]] = {"gateway": GATEWAY, "orders": ORDERS, "ledger": LEDGER}
#: The boundary endpoint whose inbox outside producers (the Spark ingest) write into.
BOUNDARY = "gateway"
#: The payments callee's request type (the body of a stored request).
PAYMENT_REQUEST = "PaymentRequest"


class StreamStatesStore(MemoryTransactionalStore):
    """The (unused) transactional store of a `state` endpoint in the embedded profile: its
    `states()` are its state stream's newest snapshots, so reports and oracles read one
    place whatever the strategy."""

    def __init__(self, clock: Clock, stream: MemoryStateStream) -> None:
        super().__init__(clock)
        self.stream = stream

    def states(self) -> dict[str, Any]:
        return self.stream.states()


class SampleSystem:
    """Stores shared by every worker of the sample service, and factories for workers.

    Memory stores by default (embedded profile); the local and production profiles pass
    `stores` (PostgreSQL), their token and request stores, the gateway's `inbox` and the
    RabbitMQ dispatcher.

    Each call of `processor(name)` or `consumer(name)` is a separate worker with its own
    partition locks, as a separate process would be: competing workers on one queue meet
    only in the stores, through optimistic concurrency. `dispatcher` is the broker, or a
    wrapper of it (the demo's duplicate injection).
    """

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        ids: IdGenerator,
        events: EventSink,
        broker: MemoryBroker | None,
        tokens: TokenStore,
        blobs: BlobStore,
        requests: RequestStore,
        failpoints: Failpoints | None,
        dispatcher: MessageDispatcher | None = None,
        stores: Mapping[str, TransactionalStore] | None = None,
        colocated_tokens: bool = False,
        http: HttpRequests | None = None,
        services: Mapping[str, str] | None = None,
        streams: Mapping[str, StateStream] | None = None,
        inbox: Inbox | None = None,
    ) -> None:
        self.settings, self.clock, self.ids, self.events = settings, clock, ids, events
        self.broker, self.tokens, self.blobs, self.requests = broker, tokens, blobs, requests
        self.failpoints = failpoints
        #: the gateway's inbox of outside producers' commands (memory unless given)
        self.inbox: Inbox = inbox if inbox is not None else MemoryInbox(clock)
        self.colocated_tokens = colocated_tokens
        if dispatcher is None and broker is None:
            raise ValueError("SampleSystem needs a broker or a dispatcher")
        self.dispatcher: MessageDispatcher = dispatcher or broker  # type: ignore[assignment]
        self.stores: dict[str, Any] = dict(stores) if stores is not None else {
            name: MemoryTransactionalStore(clock) for name in [*ENDPOINTS, "payments"]}
        #: the state streams of `state` endpoints (memory unless given)
        self.streams: dict[str, StateStream] = dict(streams or {})
        for name in ENDPOINTS:
            if settings.strategy(name) is Strategy.STATE and name not in self.streams:
                stream = MemoryStateStream(clock)
                self.streams[name] = stream
                if stores is None:
                    self.stores[name] = StreamStatesStore(clock, stream)
        callee_fp = failpoints.scoped("callee.") if failpoints else None
        payments = Processor(PAYMENTS, self._ports("payments", tokens=requests), Strategy.TOKEN,
                             callee_fp, settings.conflict_retries, self._grace)
        self.callee = HttpCallee(payments, requests, PAYMENT_REQUEST, callee_fp)
        # callers reach payments over HTTP when given a client, else in this process
        self.http: HttpRequests = http or InProcessHttp({"payments": self.callee})
        self.services = dict(services or {"payments": "inproc://payments"})

    @property
    def _grace(self) -> timedelta:
        return timedelta(seconds=self.settings.cleanup_grace_s)

    def ports(self, name: str, tokens: Any = None) -> Ports:
        """The ports of endpoint `name`'s workers (`tokens` replaces the token store)."""
        return self._ports(name, tokens)

    def _ports(self, name: str, tokens: Any = None) -> Ports:
        # the callee's "tokens" are its stored requests: never the co-located token table
        colocated = self.colocated_tokens and tokens is None
        return Ports(tokens=tokens or self.tokens, store=self.stores[name],
                     colocated_tokens=colocated,
                     dispatcher=self.dispatcher, clock=self.clock, ids=self.ids,
                     events=self.events, blobs=self.blobs,
                     http=getattr(self, "http", None), renderer=PdfRenderer(),
                     services=getattr(self, "services", {}),
                     state_stream=getattr(self, "streams", {}).get(name))

    def processor(self, name: str) -> Processor:
        """A new worker for endpoint `name` with the configured strategy."""
        return Processor(ENDPOINTS[name], self._ports(name), self.settings.strategy(name),
                         self.failpoints, self.settings.conflict_retries, self._grace)

    def consumer(self, name: str) -> Consumer:
        """A new consumer (its own processor) for endpoint `name`."""
        return Consumer(self.processor(name), self.settings.max_attempts,
                        self.settings.retry_delays_s, self.failpoints)

    def relay(self) -> InboxRelay:
        """A new inbox relay: the gateway's inbox rows to the gateway's work queue."""
        return InboxRelay(BOUNDARY, self.inbox, self.dispatcher, self.events,
                          self.settings.inbox_batch)

    def state_retention(self, name: str, clock: Clock | None = None) -> StateRetention:
        """Retention of a `state` endpoint's stream (`retention_days`); KeyError otherwise."""
        return StateRetention(self.streams[name], clock or self.clock,
                              timedelta(days=self.settings.retention_days))

    def sweeper(self, name: str, clock: Clock | None = None) -> Sweeper:
        """The sweeper of endpoint `name` (`payments` included), optionally on another clock."""
        s = self.settings
        if name == "payments":
            finisher = self.callee.processor.finisher
        else:
            finisher = self.processor(name).finisher
        return Sweeper(name, self.stores[name], finisher, clock or self.clock, self.events,
                       timedelta(seconds=s.stale_after_s), self._grace,
                       timedelta(days=s.retention_days),
                       self.requests if name == "payments" else None,
                       self.inbox if name == BOUNDARY else None)
