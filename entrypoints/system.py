"""A service's endpoints wired on one profile's adapters: stores shared by every worker, and
factories for workers (processors, consumers, callees, relays, sweepers). Everything per
endpoint is derived from the registry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta

from adapters.memory.http import InProcessHttp
from application.assembly import build_callee, build_finisher, build_processor, build_sweeper
from application.dead_letters import DeadLetters, EndpointAccess
from application.errors import PermanentError
from application.failpoints import Failpoints, or_no_failpoints
from application.handler_runner import HandlerRunner
from application.http_callee import HttpCallee
from application.inbox_relay import InboxRelay
from application.null_tracer import NULL_TRACER
from application.ports import (
    ApiPolicy,
    ApiResult,
    BlobStore,
    Clock,
    DeadLetterPublisher,
    DeadLetterStore,
    DocumentRenderer,
    EventSink,
    HttpRequests,
    IdGenerator,
    Inbox,
    MessageDispatcher,
    Ports,
    RequestStore,
    StateStream,
    ThirdPartyApis,
    TokenStore,
    Tracer,
    TransactionalStore,
)
from application.processor import Processor
from application.registry import Registration, Registry, Role
from application.settlement import Settler
from application.side_effects import SideEffects
from application.state_path import StateRetention
from application.strategy import Strategy
from application.sweeper import Sweeper
from entrypoints.settings import Service, Settings

#: Base URL scheme of a callee served inside the calling process.
IN_PROCESS = "inproc://"


def api_policies(registry: Registry, settings: Settings) -> dict[str, ApiPolicy]:
    """How the endpoints call each declared third-party API: the registry's key retention
    (shortened by `EO_APIS__<NAME>__KEY_RETENTION_S`) and tries."""
    policies = {}
    for api in registry.apis:
        retention = api.key_retention
        own = settings.api(api.name).key_retention_s
        if own is not None:
            retention = min(retention, timedelta(seconds=own))
        policies[api.name] = ApiPolicy(key_retention=retention, tries=api.tries)
    return policies


class RoutedApis(ThirdPartyApis):
    """`ThirdPartyApis` by API name: each API to the adapter `routes` gives it."""

    def __init__(self, routes: Mapping[str, ThirdPartyApis]) -> None:
        self.routes = dict(routes)

    async def send(self, api: str, method: str, path: str, body: bytes | None,
                   idempotency_key: str) -> ApiResult:
        route = self.routes.get(api)
        if route is None:
            raise PermanentError(f"third-party API {api!r} is not declared")
        return await route.send(api, method, path, body, idempotency_key)


class System:
    """The service `service` on one set of adapters (the composition root of a profile gives
    them). Each call of `processor(name)` or `consumer(name)` is a separate worker with its
    own partition locks, as a separate process would be: competing workers of one endpoint
    meet only in the stores, through optimistic concurrency.

    - `stores`, `requests`, `inboxes`, `streams`: per endpoint (every endpoint, callees,
      gateways and `state` endpoints respectively);
    - `http`: the HTTP client of callees served elsewhere (`EO_CALLEES__<NAME>__URL`), None
      when every callee runs in this process; `urls`: the base URLs of those callees;
    - `blobs`, `renderer`: given to the endpoints that declare `blobs`.
    Raises ValueError when an endpoint lacks a store it needs.
    """

    def __init__(
        self,
        service: Service,
        settings: Settings,
        clock: Clock,
        ids: IdGenerator,
        events: EventSink,
        dispatcher: MessageDispatcher,
        tokens: TokenStore,
        stores: Mapping[str, TransactionalStore],
        requests: Mapping[str, RequestStore],
        inboxes: Mapping[str, Inbox],
        streams: Mapping[str, StateStream],
        blobs: BlobStore | None,
        failpoints: Failpoints | None = None,
        colocated_tokens: bool = False,
        http: HttpRequests | None = None,
        urls: Mapping[str, str] | None = None,
        renderer: DocumentRenderer | None = None,
        dead_letters: DeadLetterPublisher | None = None,
        tracer: Tracer = NULL_TRACER,
        apis: ThirdPartyApis | None = None,
    ) -> None:
        """`dead_letters`: where the gateways' inbox relays dead-letter the rows they cannot
        relay (None: such a row stays pending); `tracer`: the endpoints' spans
        (`NULL_TRACER`: tracing is off); `failpoints`: None for none configured; `apis`: the
        third-party APIs the registry declares (protocol 12), called with the policies of
        `api_policies`."""
        self.service, self.registry, self.settings = service, service.registry, settings
        self.clock, self.ids, self.events, self.dispatcher = clock, ids, events, dispatcher
        self.tokens, self.blobs, self.renderer = tokens, blobs, renderer
        self.stores, self.requests = dict(stores), dict(requests)
        self.inboxes, self.streams = dict(inboxes), dict(streams)
        self.failpoints = or_no_failpoints(failpoints)
        self.colocated_tokens = colocated_tokens
        self.dead_letter_publisher = dead_letters
        self.tracer = tracer
        self.apis = apis
        self.api_policies = api_policies(service.registry, settings)
        self._check()
        urls = dict(urls or {})
        #: callee name -> base URL (`inproc://<name>` for a callee of this process)
        self.services = {name: urls.get(name, f"{IN_PROCESS}{name}")
                         for name in self.registry.names(Role.CALLEE)}
        self.callees: dict[str, HttpCallee] = {}
        self.http: HttpRequests = InProcessHttp(self.callees, http)
        callee_fp = self.failpoints.scoped("callee.")
        for name in self.registry.names(Role.CALLEE):
            registration = self.registry[name]
            self.callees[name] = build_callee(
                registration.endpoint, self.ports(name), self.requests[name],
                registration.stored_request, callee_fp, settings.conflict_retries, self.grace,
                settings.max_state_bytes or None)

    def _check(self) -> None:
        for r in self.registry:
            missing = [what for what, ok in (
                ("a transactional store", r.name in self.stores),
                ("a request store", r.role is not Role.CALLEE or r.name in self.requests),
                ("an inbox", r.role is not Role.GATEWAY or r.name in self.inboxes),
                ("a state stream", self.service.strategy(r.name) is not Strategy.STATE
                 or r.name in self.streams),
                ("a blob store", not r.blobs or self.blobs is not None),
            ) if not ok]
            if missing:
                raise ValueError(f"endpoint {r.name} needs {', '.join(missing)}")

    @property
    def grace(self) -> timedelta:
        """The deferred clean-up grace period (`EO_CLEANUP_GRACE_S`)."""
        return timedelta(seconds=self.settings.cleanup_grace_s)

    def ports(self, name: str) -> Ports:
        """The ports of endpoint `name`'s workers: what its registration declares (a blob
        store when it makes blobs, the HTTP client and its callees' URLs when it calls any;
        a callee's stored requests as its tokens; the endpoints that receive tokens)."""
        r: Registration = self.registry[name]
        callee = r.role is Role.CALLEE
        return Ports(
            tokens=self.tokens,
            incoming=self.requests[name] if callee else None,
            token_receivers=self.token_receivers,
            store=self.stores[name], dispatcher=self.dispatcher, clock=self.clock,
            ids=self.ids, events=self.events,
            blobs=self.blobs if r.blobs else None,
            http=self.http if r.callees else None,
            services={c: self.services[c] for c in r.callees},
            renderer=self.renderer if r.blobs else None,
            # a callee's "tokens" are its stored requests: never the co-located token table
            colocated_tokens=self.colocated_tokens and not callee,
            state_stream=self.streams.get(name), tracer=self.tracer,
            apis=self.apis if r.apis else None,
            api_policies={api: self.api_policies[api] for api in r.apis})

    @property
    def token_receivers(self) -> frozenset[str]:
        """The endpoints whose messages carry tokens: those on the `token` strategy."""
        return frozenset(n for n in self.registry.consuming()
                         if self.service.strategy(n) is Strategy.TOKEN)

    def processor(self, name: str) -> Processor:
        """A new worker of consuming endpoint `name` with its configured strategy."""
        return build_processor(self.registry[name].endpoint, self.ports(name),
                               self.service.strategy(name), self.failpoints,
                               self.settings.conflict_retries, self.grace,
                               self.settings.max_state_bytes or None)

    def consumer(self, name: str) -> Settler:
        """A new consumer (its own processor) of endpoint `name`."""
        settings = self.settings
        return Settler(self.processor(name), settings.max_attempts, settings.retry_delays_s,
                       self.failpoints, settings.dead_letter_body_bytes, settings.batch_size,
                       settings.batch_wait_ms / 1000)

    def relay(self, name: str) -> InboxRelay:
        """A new inbox relay of gateway `name`: its inbox rows to its work queue."""
        s = self.settings
        return InboxRelay(name, self.inboxes[name], self.dispatcher, self.events,
                          s.inbox_batch, self.dead_letter_publisher,
                          None if self.dead_letter_publisher is None else self.clock,
                          s.max_body_bytes, s.dead_letter_body_bytes)

    def dead_letters(self, store: DeadLetterStore) -> DeadLetters:
        """The operations on the service's dead letters kept in `store`
        (application/dead_letters.py), with every consuming endpoint's handler and store,
        the side effects' clean-up, and `EO_DEAD_LETTER_RETENTION_DAYS`."""
        endpoints = {name: EndpointAccess(HandlerRunner(self.registry[name].endpoint),
                                          self.stores[name],
                                          self.service.strategy(name) is Strategy.TOKEN)
                     for name in self.registry.consuming()}
        effects = SideEffects(self.tokens, self.dispatcher, self.blobs, self.http)
        return DeadLetters(store, self.tokens, endpoints, effects, self.dispatcher, self.clock,
                           self.events, self.grace,
                           timedelta(days=self.settings.dead_letter_retention_days))

    def state_retention(self, name: str, clock: Clock | None = None) -> StateRetention:
        """Retention of a `state` endpoint's stream (`retention_days`); KeyError otherwise."""
        return StateRetention(self.streams[name], clock or self.clock,
                              timedelta(days=self.settings.retention_days))

    def sweeper(self, name: str, clock: Clock | None = None) -> Sweeper:
        """The sweeper of endpoint `name` (any role), optionally on another clock (the
        sweeper's own: `finish` keeps the real one, so its deferred clean-ups fall due after
        the grace period as usual)."""
        s, ports = self.settings, self.ports(name)
        callee = self.callees.get(name)
        finisher = ((callee.processor.finisher if callee is not None else None)
                    or build_finisher(name, ports, self.failpoints, self.grace,
                                      self.service.strategy(name)))
        if clock is not None:
            ports = replace(ports, clock=clock)
        registration = self.registry[name]
        return build_sweeper(
            name, ports, finisher, timedelta(seconds=s.stale_after_s), self.grace,
            timedelta(days=s.retention_days),
            self.requests.get(name) if registration.role is Role.CALLEE else None,
            self.inboxes.get(name) if registration.role is Role.GATEWAY else None)
