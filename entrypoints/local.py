"""The `local` and `production` profiles: PostgreSQL and RabbitMQ (blobs and the payments
callee stay in the process until the S3 and HTTP adapters exist)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from dependency_injector import containers, providers

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.postgres.pool import pool_resource
from adapters.postgres.request_store import PostgresRequestStore
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.system.clock import SystemClock
from application.failpoints import Failpoints
from application.observability import CountingSink
from application.ports import Clock, MessageDispatcher
from domain.sample import PAYMENTS
from entrypoints.container import crash_process
from entrypoints.embedded import ENDPOINTS, SampleSystem
from entrypoints.http_status import Metrics
from entrypoints.logging import StructlogEventSink
from entrypoints.settings import Settings


async def rabbit_resource(url: str) -> AsyncIterator[RabbitConnection]:
    """dependency-injector `Resource`: a started robust connection, closed on shutdown."""
    connection = RabbitConnection(url)
    await connection.start()
    try:
        yield connection
    finally:
        await connection.close()


def postgres_stores(pool: Any, clock: Clock) -> dict[str, PostgresTransactionalStore]:
    """One store per sample endpoint (payments included), sharing the pool."""
    endpoints = {**ENDPOINTS, "payments": PAYMENTS}
    return {name: PostgresTransactionalStore(pool, name, endpoint.state_type, clock)
            for name, endpoint in endpoints.items()}


class DuplicatingDispatcher:
    """Fault injection (`EO_DUPLICATE_RATE`): publishes a share of dispatches twice in a row
    with the same message ID, so two consumers may get concurrent copies."""

    def __init__(self, inner: MessageDispatcher, rate: float) -> None:
        self.inner, self.rate = inner, rate
        self._count = 0

    async def dispatch(self, destination: str, envelope: Any) -> None:
        await self.inner.dispatch(destination, envelope)
        self._count += 1
        # deterministic spacing: every 1/rate-th dispatch is doubled
        if self.rate > 0 and int(self._count * self.rate) != int((self._count - 1) * self.rate):
            await self.inner.dispatch(destination, envelope)


def dispatcher(rabbit: RabbitConnection, settings: Settings) -> MessageDispatcher:
    """The RabbitMQ dispatcher, wrapped by duplicate injection when configured."""
    real = RabbitDispatcher(rabbit)
    return DuplicatingDispatcher(real, settings.duplicate_rate) if settings.duplicate_rate else real


def failpoints(settings: Settings, rabbit: RabbitConnection) -> Failpoints | None:
    """`EO_FAILPOINTS` with `crash` exiting the process and `drop_conn` dropping RabbitMQ."""
    return Failpoints.from_spec(settings.failpoints, crash_process, rabbit.drop)


class LocalContainer(containers.DeclarativeContainer):
    """Pools and the broker connection are async resources (`init_resources()` on start,
    `shutdown_resources()` on stop); nothing is created at import time."""

    settings = providers.Dependency(instance_of=Settings)
    clock = providers.Singleton(SystemClock)
    ids = providers.Object(uuid.uuid4)
    metrics = providers.Singleton(Metrics, inner=providers.Singleton(StructlogEventSink))
    events = providers.Singleton(CountingSink, inner=metrics)
    pool = providers.Resource(pool_resource, settings.provided.database.call(),
                              max_size=settings.provided.pool_size)
    token_pool = providers.Resource(pool_resource, settings.provided.tokens_database.call(),
                                    max_size=settings.provided.pool_size)
    rabbit = providers.Resource(rabbit_resource, settings.provided.amqp.call())
    failpoints = providers.Singleton(failpoints, settings, rabbit)
    dispatcher = providers.Singleton(dispatcher, rabbit, settings)
    tokens = providers.Singleton(PostgresTokenStore, token_pool)
    requests = providers.Singleton(PostgresRequestStore, pool, "payments")
    stores = providers.Singleton(postgres_stores, pool, clock)
    blobs = providers.Singleton(LocalDirectoryBlobStore, root=settings.provided.blob_dir)
    system = providers.Singleton(
        SampleSystem, settings=settings, clock=clock, ids=ids, events=events, broker=None,
        tokens=tokens, blobs=blobs, requests=requests, failpoints=failpoints,
        dispatcher=dispatcher, stores=stores,
    )
