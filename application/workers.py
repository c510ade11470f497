"""A service's endpoints assembled on one profile's `Adapters` with the `Tunables`: the stores
every worker shares, and a new worker (processor, consumer, callee, relay, sweeper, dead-letter
operations) per call. Everything per endpoint is derived from the registry."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import replace

from application.assembly import build_callee, build_finisher, build_processor, build_sweeper
from application.consumer_process import ConsumerProcess, Upkeep
from application.dead_letters import DeadLetters, EndpointAccess
from application.failpoints import or_no_failpoints
from application.handler_runner import HandlerRunner
from application.http_callee import HttpCallee
from application.inbox_relay import InboxRelay
from application.ports import ApiPolicy, Clock, DeadLetterStore, DeliverySource, Ports
from application.processor import Processor
from application.registry import Registration, Registry, Role
from application.settlement import Settler, default_prefetch
from application.side_effects import SideEffects
from application.state_path import StateRetention
from application.strategy import Strategy
from application.sweeper import Sweeper
from application.wiring import Adapters, Tunables

#: Base URL scheme of a callee served inside the calling process.
IN_PROCESS = "inproc://"


def api_policies(registry: Registry, tunables: Tunables) -> dict[str, ApiPolicy]:
    """How the endpoints call each declared third-party API: the registry's key retention
    (shortened by `tunables.api_key_retention`, never lengthened) and tries."""
    policies = {}
    for api in registry.apis:
        retention = min(api.key_retention,
                        tunables.api_key_retention.get(api.name, api.key_retention))
        policies[api.name] = ApiPolicy(key_retention=retention, tries=api.tries)
    return policies


class Workers:
    """The endpoints of `registry` with their `strategies` on `adapters`. Each call of
    `processor(name)` or `consumer(name)` is a separate worker with its own partition locks,
    as a separate process would be: competing workers of one endpoint meet only in the
    stores, through optimistic concurrency. Every callee gets its `HttpCallee` here
    (registered in `adapters.local_callees`, where the in-process HTTP finds it; a callee at
    an `adapters.callee_urls` URL is called there). Raises ValueError when an endpoint lacks
    a store it needs."""

    def __init__(self, registry: Registry, strategies: Mapping[str, Strategy],
                 adapters: Adapters, tunables: Tunables) -> None:
        self.registry, self.strategies = registry, dict(strategies)
        self.adapters, self.tunables = adapters, tunables
        a = adapters
        self.clock, self.ids, self.events, self.dispatcher = a.clock, a.ids, a.events, a.dispatcher
        self.tokens, self.stores, self.requests = a.tokens, a.stores, a.requests
        self.inboxes, self.streams, self.blobs, self.http = a.inboxes, a.streams, a.blobs, a.http
        self.inspection, self.apis = a.inspection, a.apis
        self.failpoints = or_no_failpoints(a.failpoints)
        self.grace = tunables.cleanup_grace
        self.api_policies = api_policies(registry, tunables)
        self._check()
        #: callee name -> base URL (`inproc://<name>` for a callee of this process)
        self.services = {name: a.callee_urls.get(name, f"{IN_PROCESS}{name}")
                         for name in registry.names(Role.CALLEE)}
        self.callees: MutableMapping[str, HttpCallee] = a.local_callees
        callee_fp = self.failpoints.scoped("callee.")
        for name in registry.names(Role.CALLEE):
            r = registry[name]
            self.callees[name] = build_callee(
                r.endpoint, self.ports(name), a.requests[name], r.stored_request, callee_fp,
                tunables.conflict_retries, self.grace, tunables.max_state_bytes)

    def _check(self) -> None:
        for r in self.registry:
            missing = [what for what, ok in (
                ("a transactional store", r.name in self.stores),
                ("a request store", r.role is not Role.CALLEE or r.name in self.requests),
                ("an inbox", r.role is not Role.GATEWAY or r.name in self.inboxes),
                ("a state stream", self.strategies[r.name] is not Strategy.STATE
                 or r.name in self.streams),
                ("a blob store", not r.blobs or self.blobs is not None),
                ("an HTTP client", not r.callees or self.http is not None),
            ) if not ok]
            if missing:
                raise ValueError(f"endpoint {r.name} needs {', '.join(missing)}")

    def strategy(self, name: str) -> Strategy:
        """The strategy of endpoint `name` (KeyError when it is not registered)."""
        return self.strategies[name]

    def ports(self, name: str) -> Ports:
        """The ports of endpoint `name`'s workers: what its registration declares (a blob
        store when it makes blobs, the HTTP client and its callees' URLs when it calls any;
        a callee's stored requests as its tokens; the endpoints that receive tokens)."""
        a, r = self.adapters, self.registry[name]
        callee = r.role is Role.CALLEE
        return Ports(
            tokens=a.tokens, incoming=a.requests[name] if callee else None,
            token_receivers=self.token_receivers,
            store=a.stores[name], dispatcher=a.dispatcher, clock=a.clock, ids=a.ids,
            events=a.events, blobs=a.blobs if r.blobs else None,
            http=a.http if r.callees else None,
            services={c: self.services[c] for c in r.callees},
            renderer=a.renderer if r.blobs else None,
            # a callee's "tokens" are its stored requests: never the co-located token table
            colocated_tokens=a.colocated_tokens and not callee,
            state_stream=a.streams.get(name), tracer=a.tracer,
            apis=a.apis if r.apis else None,
            api_policies={api: self.api_policies[api] for api in r.apis})

    @property
    def token_receivers(self) -> frozenset[str]:
        """The endpoints whose messages carry tokens: those on the `token` strategy."""
        return frozenset(n for n in self.registry.consuming()
                         if self.strategies[n] is Strategy.TOKEN)

    def processor(self, name: str) -> Processor:
        """A new worker of consuming endpoint `name` with its configured strategy."""
        t = self.tunables
        return build_processor(self.registry[name].endpoint, self.ports(name),
                               self.strategies[name], self.failpoints, t.conflict_retries,
                               self.grace, t.max_state_bytes)

    def consumer(self, name: str) -> Settler:
        """A new consumer (its own processor) of endpoint `name`."""
        t = self.tunables
        return Settler(self.processor(name), t.max_attempts, t.retry_delays_s,
                       self.failpoints, t.dead_letter_body_bytes, t.batch_size,
                       t.batch_wait_s)

    def consumer_process(self, name: str, source: DeliverySource,
                         upkeep: Sequence[Upkeep] = ()) -> ConsumerProcess:
        """A new consumer process of endpoint `name` on `source` (RabbitMQ's or the memory
        broker's), with `upkeep` loops beside it; its prefetch is `tunables.prefetch`, else
        `default_prefetch` for its consumer."""
        settler = self.consumer(name)
        prefetch = self.tunables.prefetch
        if prefetch is None:
            prefetch = default_prefetch(settler.batches, settler.batch_size)
        return ConsumerProcess(name, settler, source, prefetch, upkeep)

    def relay(self, name: str) -> InboxRelay:
        """A new inbox relay of gateway `name`: its inbox rows to its work queue."""
        a, t = self.adapters, self.tunables
        publisher = a.dead_letter_publisher
        return InboxRelay(name, a.inboxes[name], a.dispatcher, a.events, t.inbox_batch,
                          publisher, None if publisher is None else a.clock,
                          t.max_body_bytes, t.dead_letter_body_bytes)

    def dead_letters(self, store: DeadLetterStore) -> DeadLetters:
        """The operations on the service's dead letters kept in `store`
        (application/dead_letters.py), with every consuming endpoint's handler and store,
        the side effects' clean-up, and the dead letters' retention."""
        a = self.adapters
        endpoints = {name: EndpointAccess(HandlerRunner(self.registry[name].endpoint),
                                          a.stores[name],
                                          self.strategies[name] is Strategy.TOKEN)
                     for name in self.registry.consuming()}
        effects = SideEffects(a.tokens, a.dispatcher, a.blobs, a.http)
        return DeadLetters(store, a.tokens, endpoints, effects, a.dispatcher, a.clock,
                           a.events, self.grace, self.tunables.dead_letter_retention)

    def state_retention(self, name: str, clock: Clock | None = None) -> StateRetention:
        """Retention of a `state` endpoint's stream; KeyError otherwise."""
        return StateRetention(self.streams[name], clock or self.clock,
                              self.tunables.retention)

    def sweeper(self, name: str, clock: Clock | None = None) -> Sweeper:
        """The sweeper of endpoint `name` (any role), optionally on another clock (the
        sweeper's own: `finish` keeps the real one, so its deferred clean-ups fall due after
        the grace period as usual)."""
        t, ports = self.tunables, self.ports(name)
        callee = self.callees.get(name)
        finisher = ((callee.processor.finisher if callee is not None else None)
                    or build_finisher(name, ports, self.failpoints, self.grace,
                                      self.strategies[name]))
        if clock is not None:
            ports = replace(ports, clock=clock)
        registration: Registration = self.registry[name]
        return build_sweeper(
            name, ports, finisher, t.stale_after, self.grace, t.retention,
            self.requests.get(name) if registration.role is Role.CALLEE else None,
            self.inboxes.get(name) if registration.role is Role.GATEWAY else None)
