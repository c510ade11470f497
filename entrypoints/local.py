"""The `local` and `production` profiles: PostgreSQL, RabbitMQ, an S3 API for blobs, HTTP
callees in-process or over HTTP (`EO_CALLEES__<NAME>__URL`)."""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from dependency_injector import containers, providers

from adapters.http.apis import ApiEndpoint, HttpxApis
from adapters.http.client import HttpxRequests, http_client_resource
from adapters.memory.apis import SandboxApis
from adapters.memory.http import InProcessHttp
from adapters.pdf import document_renderer
from adapters.postgres.dead_letter_store import PostgresDeadLetterStore
from adapters.postgres.inbox import PostgresInbox
from adapters.postgres.inspection import PostgresInspection
from adapters.postgres.request_store import PostgresRequestStore
from adapters.postgres.state_stream import PostgresStateStream
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.dead_letter_queue import DeadLetterCollector
from adapters.rabbitmq.dispatcher import RabbitDeadLetters, RabbitDispatcher
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
    HttpRequests,
    MessageDispatcher,
    ThirdPartyApis,
)
from application.ports.null_tracer import NULL_TRACER
from application.registry import Registry, Role
from application.strategy import Strategy
from application.wiring import Adapters
from entrypoints.composition import tunables_of, workers_of
from entrypoints.faults import failpoints_from, with_duplicates
from entrypoints.logs import StructlogEventSink
from entrypoints.pools import Pools, dead_letter_store_of, pools_resource
from entrypoints.resources import (
    blob_resource,
    broker_user,
    rabbit_resource,
)
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from entrypoints.status import Metrics
from entrypoints.tracing import Tracing, tracing_resource

log = structlog.get_logger("eo.local")


def postgres_stores(pool: Any, clock: Clock, registry: Registry, holds_tokens: bool = False
                    ) -> dict[str, PostgresTransactionalStore]:
    """One store per endpoint of `registry` (callees included), sharing the pool;
    `holds_tokens` when the token store is the same database (protocol 3.2's fast path; a
    callee's tokens are its stored requests, never the token table)."""
    return {r.name: PostgresTransactionalStore(
                pool, r.name, r.endpoint.state_type, clock,
                holds_tokens=holds_tokens and r.role is not Role.CALLEE)
            for r in registry}


def postgres_streams(pool: Any, clock: Clock, service: Service
                     ) -> dict[str, PostgresStateStream]:
    """The state streams (`eo_state_entry`) of the endpoints whose strategy is `state`."""
    return {r.name: PostgresStateStream(pool, r.name, r.endpoint.state_type, clock)
            for r in service.registry if service.strategy(r.name) is Strategy.STATE}


def callee_urls(settings: Settings) -> dict[str, str]:
    """Base URLs of the callees served elsewhere (`EO_CALLEES__<NAME>__URL`)."""
    return {name: c.url for name, c in settings.http.callees.items() if c.url}


def http_requests(settings: Settings, client: Any) -> HttpRequests | None:
    """The HTTP client of the callees served elsewhere, each with its own bearer token; None
    when every callee runs in this process."""
    credentials = {c.url: c.token.get_secret_value() for c in settings.http.callees.values()
                   if c.url and c.token is not None}
    return HttpxRequests(client, credentials) if credentials else None


def third_party_apis(settings: Settings, registry: Registry, client: Any,
                     consumer: str | None = None) -> ThirdPartyApis | None:
    """The declared third-party APIs (protocol 12): those with `EO_APIS__<NAME>__URL` over
    httpx on `client`, the others on an in-process sandbox provider (the embedded and
    local profiles; production requires every URL: `resolve_service`). None when the
    registry declares none. `consumer`: the endpoint this process consumes, if any; it alone
    calls APIs (only a consumer may: `Registry`), so only its own APIs on a sandbox are
    logged (`api.sandbox`), not in an operator's command that calls none."""
    if not registry.apis:
        return None
    called = set(registry[consumer].apis) if consumer is not None else set()
    endpoints = {}
    routes: dict[str, ThirdPartyApis] = {}
    for api in registry.apis:
        own = settings.api(api.name)
        if own.url is None:
            routes[api.name] = SandboxApis(apis=[api.name],
                                           timeout_s=own.timeout_s or api.timeout_s)
            if api.name in called:
                log.warning("api.sandbox", api=api.name, endpoint=consumer,
                            reason=f"EO_APIS__{api.name.upper()}__URL is not set: calls go to "
                                   "an in-process sandbox, whose keys this process alone "
                                   "knows")
        else:
            endpoints[api.name] = ApiEndpoint(
                own.url, own.token.get_secret_value() if own.token else None,
                own.timeout_s or api.timeout_s)
    over_http = HttpxApis(client, endpoints)
    return RoutedApis({api.name: routes.get(api.name, over_http) for api in registry.apis})


def postgres_inspection(pool: Any, tokens_pool: Any, clock: Clock, service: Service
                        ) -> PostgresInspection:
    """The service's stores inspected on `pool` (the endpoint database) and `tokens_pool`:
    each endpoint's states read from its stream on the `state` strategy, else from its
    transaction records."""
    readers: dict[str, Any] = dict(postgres_stores(pool, clock, service.registry))
    readers.update(postgres_streams(pool, clock, service))
    return PostgresInspection(pool, tokens_pool, readers)


def postgres_adapters(service: Service, settings: Settings, pools: Pools, clock: Clock,
                      events: EventSink, dispatcher: MessageDispatcher,
                      failpoints: Failpoints | None, blobs: BlobStore | None,
                      http: HttpRequests | None,
                      dead_letters: DeadLetterPublisher | None = None,
                      tracing: Tracing | None = None, apis: ThirdPartyApis | None = None
                      ) -> Adapters:
    """The service's adapters on PostgreSQL (`pools`), RabbitMQ (`dispatcher`) and the blob
    store; callees at `EO_CALLEES__<NAME>__URL` over `http`, the others in this process;
    traced when `tracing` is on."""
    registry = service.registry
    callees: dict[str, HttpCallee] = {}
    return Adapters(
        clock=clock, ids=uuid.uuid4, events=events, dispatcher=dispatcher,
        tokens=PostgresTokenStore(pools.tokens),
        stores=postgres_stores(pools.endpoint, clock, registry, pools.colocated),
        inspection=postgres_inspection(pools.endpoint, pools.tokens, clock, service),
        requests={name: PostgresRequestStore(pools.endpoint, name)
                  for name in registry.names(Role.CALLEE)},
        inboxes={name: PostgresInbox(pools.endpoint, name, clock)
                 for name in registry.names(Role.GATEWAY)},
        streams=postgres_streams(pools.endpoint, clock, service),
        colocated_tokens=pools.colocated, blobs=blobs,
        renderer=document_renderer() if any(r.blobs for r in registry) else None,
        http=InProcessHttp(callees, http), callee_urls=callee_urls(settings),
        local_callees=callees, dead_letter_publisher=dead_letters, apis=apis,
        failpoints=failpoints, tracer=tracing.tracer if tracing else NULL_TRACER)


def rabbit_source(settings: Settings, service: Service, rabbit: RabbitConnection,
                  endpoint: str | None, events: EventSink, service_user: str) -> RabbitSource:
    """The deliveries of `endpoint`'s work queue: a production gateway requires each message's
    producer (`EO_ALLOW_ANONYMOUS_PRODUCERS` off). Raises ValueError without an endpoint."""
    if endpoint is None:
        raise ValueError("a RabbitMQ source needs the endpoint it consumes")
    gateway = service.registry[endpoint].role is Role.GATEWAY
    protocol = settings.protocol
    return RabbitSource(rabbit, endpoint, protocol.retry_delays_s, protocol.max_body_bytes,
                        events, watchdog_s=settings.rabbitmq.consumer_watchdog_s,
                        dead_letter_body_bytes=settings.protocol.dead_letter_body_bytes,
                        kept_headers=settings.protocol.kept_headers, service_user=service_user,
                        require_producer=gateway and settings.profile == "production"
                        and not settings.production.allow_anonymous_producers)


def dead_letter_collector(settings: Settings, rabbit: RabbitConnection, endpoint: str | None,
                          store: PostgresDeadLetterStore, service_user: str,
                          events: EventSink) -> DeadLetterCollector | None:
    """What moves `endpoint`'s dead-letter queue into the store (None when
    `EO_DEAD_LETTER_COLLECT` is off). Raises ValueError without an endpoint."""
    if endpoint is None:
        raise ValueError("a dead-letter collector needs the endpoint whose queue it drains")
    if not settings.dead_letters.dead_letter_collect:
        return None
    return DeadLetterCollector(rabbit, endpoint, store, service_user, events)


class LocalContainer(containers.DeclarativeContainer):
    """The `local` and `production` profiles' composition root: the adapters (`adapters`),
    the service's workers on them (`workers`), and what a process runs beside them (the
    RabbitMQ `source` and dead-letter `collector` of the endpoint it consumes, the dead
    letters' `store` and `operations`, the stores' `inspection`). Pools, the broker
    connection, the blob store and the HTTP client are async resources started on first use
    (`provided`) and stopped by `shutdown_resources`: a command opens only what the
    providers it calls need (the dead-letter store: one pool, no broker connection);
    nothing is created at import time."""

    settings = providers.Dependency(instance_of=Settings)
    service = providers.Dependency(instance_of=Service)
    registry = providers.Callable(lambda service: service.registry, service)
    clock = providers.Singleton(SystemClock)
    metrics = providers.Singleton(Metrics, inner=providers.Singleton(StructlogEventSink))
    events = providers.Singleton(CountingSink, inner=metrics)
    #: the process's endpoint (or command): tracing's default `service.name`
    process_name = providers.Object("eo")
    #: OpenTelemetry from the `OTEL_*` variables, or None (off); started first, so that the
    #: libraries are instrumented before the pools and clients exist
    tracing = providers.Resource(tracing_resource, process_name)
    pools = providers.Resource(pools_resource, settings)
    #: the name the broker shows for this process's connection
    connection_name = providers.Object("eo")
    rabbit = providers.Resource(rabbit_resource, settings, connection_name)
    failpoints = providers.Singleton(
        failpoints_from, settings, events, rabbit.provided.drop)
    #: the service's broker user (`broker_user`)
    service_user = providers.Callable(broker_user, settings)
    dispatcher = providers.Singleton(
        with_duplicates, providers.Singleton(RabbitDispatcher, rabbit, service_user), settings,
        events)
    blobs = providers.Resource(blob_resource, settings, registry)
    http_client = providers.Resource(http_client_resource, settings.provided.http.http_timeout_s)
    http = providers.Callable(http_requests, settings, http_client)
    #: the endpoint whose consumer this process runs (None: a callee, an operator's
    #: command): the one that calls third-party APIs
    consumer = providers.Object[str | None](None)
    apis = providers.Singleton(third_party_apis, settings, registry, http_client, consumer)
    adapters = providers.Singleton(
        postgres_adapters, service=service, settings=settings, pools=pools, clock=clock,
        events=events, dispatcher=dispatcher, failpoints=failpoints, blobs=blobs, http=http,
        dead_letters=providers.Singleton(RabbitDeadLetters, rabbit, service_user),
        tracing=tracing, apis=apis)
    tunables = providers.Singleton(tunables_of, settings)
    #: the service's workers (`application.workers.Workers`)
    workers = providers.Singleton(workers_of, service, adapters, tunables)
    #: the stores' read-only views (one pool or two: no broker connection)
    inspection = providers.Singleton(
        lambda pools, clock, service: postgres_inspection(pools.endpoint, pools.tokens, clock,
                                                          service), pools, clock, service)
    #: the service's dead letters, in the endpoints' database
    dead_letter_store = providers.Singleton(
        lambda pools, clock: dead_letter_store_of(pools.endpoint, clock), pools, clock)
    #: the operations on them (replay, discard, expiry, gauges)
    dead_letter_operations = providers.Singleton(
        lambda workers, store: workers.dead_letters(store), workers, dead_letter_store)
    source = providers.Singleton(rabbit_source, settings, service, rabbit, consumer, events,
                                 service_user)
    collector = providers.Singleton(dead_letter_collector, settings, rabbit, consumer,
                                    dead_letter_store, service_user, events)
