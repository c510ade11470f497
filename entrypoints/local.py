"""The `local` and `production` profiles: PostgreSQL, RabbitMQ, an S3 API for blobs, HTTP
callees in-process or over HTTP (`EO_CALLEES__<NAME>__URL`)."""

from __future__ import annotations

import importlib.util
import inspect
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import structlog
from dependency_injector import containers, providers
from yarl import URL

from adapters.http.apis import ApiEndpoint, HttpxApis
from adapters.http.client import HttpxRequests, http_client_resource
from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.apis import SandboxApis
from adapters.pdf import document_renderer
from adapters.postgres.dead_letter_store import PostgresDeadLetterStore
from adapters.postgres.inbox import PostgresInbox
from adapters.postgres.pool import create_pool
from adapters.postgres.request_store import PostgresRequestStore
from adapters.postgres.state_stream import PostgresStateStream
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDeadLetters, RabbitDispatcher
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from adapters.system.clock import SystemClock
from application.null_tracer import NULL_TRACER
from application.observability import CountingSink
from application.ports import BlobStore, Clock, HttpRequests, ThirdPartyApis
from application.registry import Registry, Role
from application.strategy import Strategy
from entrypoints.faults import failpoints_from, with_duplicates
from entrypoints.logs import StructlogEventSink
from entrypoints.settings import Service, Settings, SettingsError
from entrypoints.status import Metrics
from entrypoints.system import RoutedApis, System
from entrypoints.tracing import Tracing, tracing_resource

log = structlog.get_logger("eo.local")


@dataclass(frozen=True)
class Pools:
    """The endpoint database's pool and the token store's (the same one when co-located)."""

    endpoint: Any
    tokens: Any

    @property
    def colocated(self) -> bool:
        """Whether tokens live in the endpoint database (protocol 3.2's fast path)."""
        return self.endpoint is self.tokens


async def pools_resource(settings: Settings) -> AsyncIterator[Pools]:
    """dependency-injector `Resource`: one pool per distinct DSN, closed on shutdown."""
    endpoint = await create_pool(settings.database(), max_size=settings.pool_size)
    tokens = endpoint
    try:
        if settings.tokens_database() != settings.database():
            tokens = await create_pool(settings.tokens_database(), max_size=settings.pool_size)
        yield Pools(endpoint, tokens)
    finally:
        if tokens is not endpoint:
            await tokens.close()
        await endpoint.close()


async def blob_resource(settings: Settings, registry: Registry
                        ) -> AsyncIterator[BlobStore | None]:
    """dependency-injector `Resource`: the blob store, None when no endpoint makes blobs.
    S3 at `EO_S3_ENDPOINT_URL`; in the local profile without an endpoint, a moto server this
    process starts (and stops: moto is a development dependency); in production without
    one, AWS. A directory when `EO_BLOB_STORE=directory`. Raises `SettingsError` naming
    `EO_S3_ENDPOINT_URL` when the local profile would start moto and moto is not installed
    (the image has no development dependencies)."""
    if not any(r.blobs for r in registry):
        yield None
        return
    if not settings.blobs_in_s3():
        yield LocalDirectoryBlobStore(settings.blob_dir)
        return
    moto = None
    endpoint = settings.s3_endpoint_url
    access = settings.s3_access_key.get_secret_value() if settings.s3_access_key else None
    secret = settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None
    if endpoint is None and settings.profile == "local":
        if importlib.util.find_spec("moto") is None:
            raise SettingsError(
                "invalid setting EO_S3_ENDPOINT_URL: unset, so the local profile would start "
                "an S3 API of its own (moto), which is not installed here (a development "
                "dependency: the image has none). Set EO_S3_ENDPOINT_URL to an S3 API "
                "(MinIO, a moto server of its own), or EO_BLOB_STORE=directory")
        from adapters.s3.moto_server import MotoServer

        moto = MotoServer()
        endpoint = moto.start()
        access, secret = access or "local", secret or "local"
    try:
        bucket, owner = settings.bucket(), settings.s3_expected_bucket_owner
        async with s3_client_resource(endpoint, settings.s3_region, access, secret) as client:
            # production finds its bucket (a typo must not create a new one); local makes it
            await ensure_bucket(client, bucket, owner, create=settings.profile != "production")
            yield S3BlobStore(client, bucket, expected_owner=owner)
    finally:
        if moto is not None:
            moto.stop()


async def rabbit_resource(settings: Settings, name: str) -> AsyncIterator[RabbitConnection]:
    """dependency-injector `Resource`: a started, supervised connection named `name` (the
    broker shows it), giving up after `EO_BROKER_GIVE_UP_S`; closed on shutdown."""
    connection = RabbitConnection(settings.amqp(), give_up_after_s=settings.broker_give_up_s,
                                  name=name)
    await connection.start()
    try:
        yield connection
    finally:
        await connection.close()


def broker_user(settings: Settings) -> str:
    """The service's own RabbitMQ user: the AMQP URL's, or `guest` as aio-pika logs in
    without one. The copies the service publishes carry it as `user_id`, which is how a
    source tells them from an outside producer's messages
    (`adapters.rabbitmq.dispatcher.producer_of`)."""
    return URL(settings.amqp()).user or "guest"


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
    return {name: c.url for name, c in settings.callees.items() if c.url}


def http_requests(settings: Settings, client: Any) -> HttpRequests | None:
    """The HTTP client of the callees served elsewhere, each with its own bearer token; None
    when every callee runs in this process."""
    credentials = {c.url: c.token.get_secret_value() for c in settings.callees.values()
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
            routes[api.name] = SandboxApis()
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


def local_system(service: Service, settings: Settings, pools: Pools, clock: Clock,
                 events: Any, dispatcher: Any, failpoints: Any, blobs: BlobStore | None,
                 http: HttpRequests | None, dead_letters: Any = None,
                 tracing: Tracing | None = None, apis: ThirdPartyApis | None = None
                 ) -> System:
    """The service on PostgreSQL (`pools`), RabbitMQ (`dispatcher`) and the blob store,
    traced when `tracing` is on."""
    registry = service.registry
    return System(
        service, settings, clock, uuid.uuid4, events, dispatcher,
        tokens=PostgresTokenStore(pools.tokens),
        stores=postgres_stores(pools.endpoint, clock, registry, pools.colocated),
        requests={name: PostgresRequestStore(pools.endpoint, name)
                  for name in registry.names(Role.CALLEE)},
        inboxes={name: PostgresInbox(pools.endpoint, name, clock)
                 for name in registry.names(Role.GATEWAY)},
        streams=postgres_streams(pools.endpoint, clock, service),
        blobs=blobs, failpoints=failpoints, colocated_tokens=pools.colocated, http=http,
        urls=callee_urls(settings),
        renderer=document_renderer() if any(r.blobs for r in registry) else None,
        dead_letters=dead_letters, tracer=tracing.tracer if tracing else NULL_TRACER, apis=apis)


class LocalContainer(containers.DeclarativeContainer):
    """The `local` and `production` profiles' composition root. Pools, the broker connection,
    the blob store and the HTTP client are async resources (`init_resources()` on start,
    `shutdown_resources()` on stop); nothing is created at import time."""

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
    http_client = providers.Resource(http_client_resource, settings.provided.http_timeout_s)
    http = providers.Callable(http_requests, settings, http_client)
    #: the endpoint whose consumer this process runs (None: a callee, an operator's
    #: command): the one that calls third-party APIs
    consumer = providers.Object[str | None](None)
    apis = providers.Singleton(third_party_apis, settings, registry, http_client, consumer)
    system = providers.Singleton(
        local_system, service=service, settings=settings, pools=pools, clock=clock,
        events=events, dispatcher=dispatcher, failpoints=failpoints, blobs=blobs, http=http,
        dead_letters=providers.Singleton(RabbitDeadLetters, rabbit, service_user),
        tracing=tracing, apis=apis)
    #: the service's dead letters, in the endpoints' database
    dead_letter_store = providers.Singleton(
        lambda pools, clock: PostgresDeadLetterStore(pools.endpoint, clock), pools, clock)


T = TypeVar("T")


async def provided(provider: providers.Provider[T]) -> T:
    """What `provider` gives, awaited: a provider that depends on an async resource (the
    pools, the broker connection) returns an awaitable of it, which dependency-injector's
    type stubs cannot tell from the object itself."""
    value: Any = provider()
    if inspect.isawaitable(value):
        value = await value
    return cast(T, value)


async def init_resources(container: containers.Container) -> None:
    """Start `container`'s resources (`Container.init_resources`, awaited when one of them
    is async). Raises what a resource's start raises."""
    started: Any = container.init_resources()
    if inspect.isawaitable(started):
        await started


async def shutdown_resources(container: containers.Container) -> None:
    """Stop `container`'s resources (`Container.shutdown_resources`, awaited when one of
    them is async)."""
    stopped: Any = container.shutdown_resources()
    if inspect.isawaitable(stopped):
        await stopped
