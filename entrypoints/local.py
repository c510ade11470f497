"""The `local` and `production` profiles: PostgreSQL and RabbitMQ (blobs and the payments
callee stay in the process until the S3 and HTTP adapters exist)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from dependency_injector import containers, providers

from adapters.http.client import HttpxRequests, http_client_resource
from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.postgres.inbox import PostgresInbox
from adapters.postgres.pool import create_pool
from adapters.postgres.request_store import PostgresRequestStore
from adapters.postgres.state_stream import PostgresStateStream
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import SystemClock
from application.failpoints import Failpoints
from application.observability import CountingSink
from application.ports import BlobStore, Clock, EventSink, HttpRequests, MessageDispatcher
from application.processor import Strategy
from domain.sample import PAYMENTS
from entrypoints.container import crash_process, fault_logger
from entrypoints.embedded import BOUNDARY, ENDPOINTS, SampleSystem
from entrypoints.http_status import Metrics
from entrypoints.logging import StructlogEventSink
from entrypoints.settings import Settings


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


async def blob_resource(settings: Settings) -> AsyncIterator[BlobStore]:
    """dependency-injector `Resource`: the blob store. S3 at `EO_S3_ENDPOINT_URL`; in the
    local profile without an endpoint, a moto server this process starts (and stops); in
    production without one, AWS. A directory when `EO_BLOB_STORE=directory`."""
    if not settings.blobs_in_s3():
        yield LocalDirectoryBlobStore(settings.blob_dir)
        return
    moto = None
    endpoint = settings.s3_endpoint_url
    access = settings.s3_access_key.get_secret_value() if settings.s3_access_key else None
    secret = settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None
    if endpoint is None and settings.profile == "local":
        moto = MotoServer()
        endpoint = moto.start()
        access, secret = access or "local", secret or "local"
    try:
        async with s3_client_resource(endpoint, settings.s3_region, access, secret) as client:
            await ensure_bucket(client, settings.s3_bucket)
            yield S3BlobStore(client, settings.s3_bucket)
    finally:
        if moto is not None:
            moto.stop()


async def rabbit_resource(url: str) -> AsyncIterator[RabbitConnection]:
    """dependency-injector `Resource`: a started robust connection, closed on shutdown."""
    connection = RabbitConnection(url)
    await connection.start()
    try:
        yield connection
    finally:
        await connection.close()


def postgres_stores(pool: Any, clock: Clock, holds_tokens: bool = False
                    ) -> dict[str, PostgresTransactionalStore]:
    """One store per sample endpoint (payments included), sharing the pool; `holds_tokens`
    when the token store is the same database (protocol 3.2's fast path)."""
    endpoints = {**ENDPOINTS, "payments": PAYMENTS}
    return {name: PostgresTransactionalStore(pool, name, endpoint.state_type, clock,
                                             holds_tokens=holds_tokens and name != "payments")
            for name, endpoint in endpoints.items()}


class DuplicatingDispatcher:
    """Fault injection (`EO_DUPLICATE_RATE`): publishes a share of dispatches twice in a row
    with the same message ID, so two consumers may get concurrent copies. Each copy emits
    `fault.duplicate_injected`."""

    def __init__(self, inner: MessageDispatcher, rate: float, events: EventSink) -> None:
        self.inner, self.rate, self.events = inner, rate, events
        self._count = 0

    async def dispatch(self, destination: str, envelope: Any) -> None:
        await self.inner.dispatch(destination, envelope)
        self._count += 1
        # deterministic spacing: every 1/rate-th dispatch is doubled
        if int(self._count * self.rate) != int((self._count - 1) * self.rate):
            await self.inner.dispatch(destination, envelope)
            self.events.emit("fault.duplicate_injected", destination=destination,
                             message_id=str(envelope.message_id))


def dispatcher(rabbit: RabbitConnection, settings: Settings,
               events: EventSink) -> MessageDispatcher:
    """The RabbitMQ dispatcher, wrapped by duplicate injection when configured."""
    real = RabbitDispatcher(rabbit)
    if not settings.duplicate_rate:
        return real
    return DuplicatingDispatcher(real, settings.duplicate_rate, events)


def failpoints(settings: Settings, rabbit: RabbitConnection, events: EventSink
               ) -> Failpoints | None:
    """`EO_FAILPOINTS` with `crash` exiting the process and `drop_conn` dropping RabbitMQ;
    each firing is logged first as `fault.injected` (name, action)."""
    return Failpoints.from_spec(settings.failpoints, crash_process, rabbit.drop,
                                on_fire=fault_logger(events))


def postgres_streams(pool: Any, clock: Clock, settings: Settings
                     ) -> dict[str, PostgresStateStream]:
    """The state streams (`eo_state_entry`) of the endpoints configured as `state`."""
    return {name: PostgresStateStream(pool, name, endpoint.state_type, clock)
            for name, endpoint in ENDPOINTS.items()
            if settings.strategy(name) is Strategy.STATE}


def http_requests(settings: Settings, client: Any) -> HttpRequests | None:
    """The HTTP caller when payments is a separate service (`EO_PAYMENTS_URL`), else None
    (in-process callee)."""
    if not settings.payments_url or settings.payments_token is None:
        return None
    return HttpxRequests(client, settings.payments_token.get_secret_value(),
                         allowed_bases=[settings.payments_url])


def services(settings: Settings) -> dict[str, str] | None:
    """Base URLs of the HTTP callees, or None for the in-process ones."""
    return {"payments": settings.payments_url} if settings.payments_url else None


class LocalContainer(containers.DeclarativeContainer):
    """Pools and the broker connection are async resources (`init_resources()` on start,
    `shutdown_resources()` on stop); nothing is created at import time."""

    settings = providers.Dependency(instance_of=Settings)
    clock = providers.Singleton(SystemClock)
    ids = providers.Object(uuid.uuid4)
    metrics = providers.Singleton(Metrics, inner=providers.Singleton(StructlogEventSink))
    events = providers.Singleton(CountingSink, inner=metrics)
    pools = providers.Resource(pools_resource, settings)
    pool = providers.Callable(lambda pools: pools.endpoint, pools)
    token_pool = providers.Callable(lambda pools: pools.tokens, pools)
    rabbit = providers.Resource(rabbit_resource, settings.provided.amqp.call())
    failpoints = providers.Singleton(failpoints, settings, rabbit, events)
    dispatcher = providers.Singleton(dispatcher, rabbit, settings, events)
    tokens = providers.Singleton(PostgresTokenStore, token_pool)
    requests = providers.Singleton(PostgresRequestStore, pool, "payments")
    inbox = providers.Singleton(PostgresInbox, pool, BOUNDARY, clock)
    colocated = providers.Callable(lambda pools: pools.colocated, pools)
    stores = providers.Singleton(postgres_stores, pool, clock, colocated)
    blobs = providers.Resource(blob_resource, settings)
    http_client = providers.Resource(http_client_resource, settings.provided.http_timeout_s)
    http = providers.Callable(http_requests, settings, http_client)
    system = providers.Singleton(
        SampleSystem, settings=settings, clock=clock, ids=ids, events=events, broker=None,
        http=http, services=providers.Callable(services, settings),
        streams=providers.Callable(postgres_streams, pool, clock, settings),
        tokens=tokens, blobs=blobs, requests=requests, failpoints=failpoints,
        dispatcher=dispatcher, stores=stores, colocated_tokens=colocated, inbox=inbox,
    )
