"""The service's main process: one endpoint's consumer on RabbitMQ and PostgreSQL, its
sweeper, its status port, and a graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import UTC, datetime
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import structlog
import uvicorn

from adapters.postgres.migrate import upgrade_async
from adapters.rabbitmq import topology
from adapters.rabbitmq.consumer import RabbitSource
from application.errors import PermanentError, TransientError
from application.sweeper import Sweeper
from entrypoints.embedded import BOUNDARY, ENDPOINTS, SampleSystem
from entrypoints.http_status import EmbeddedServer, Metrics, StatusServer, status_app
from entrypoints.local import LocalContainer
from entrypoints.logging import configure_logging
from entrypoints.payments_app import create_payments_app
from entrypoints.settings import Settings

log = structlog.get_logger("eo.service")


async def preflight(settings: Settings) -> None:
    """Fail fast, naming what is wrong, before any resource starts: the databases exist and
    answer, RabbitMQ answers. Raises `PermanentError` (missing database: run `eo migrate`)
    or `TransientError` (a server does not answer)."""
    for dsn in dict.fromkeys([settings.database(), settings.tokens_database()]):
        name = urlsplit(dsn).path.lstrip("/")
        try:
            conn = await asyncio.wait_for(asyncpg.connect(dsn), 10)
        except asyncpg.InvalidCatalogNameError as exc:
            raise PermanentError(f"database {name!r} does not exist: run `eo migrate`") from exc
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            raise TransientError(f"PostgreSQL database {name!r}: {type(exc).__name__}: "
                                 f"{exc}") from exc
        await conn.close()
    try:
        connection = await asyncio.wait_for(aio_pika.connect(settings.amqp()), 10)
    except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as exc:
        raise TransientError(f"RabbitMQ: {type(exc).__name__}: {exc}") from exc
    await connection.close()


async def migrate(settings: Settings) -> None:
    """Apply the schema migrations to the endpoint database and, if separate, the token store."""
    for dsn in dict.fromkeys([settings.database(), settings.tokens_database()]):
        await upgrade_async(dsn)


async def _sweep_forever(sweeper: Sweeper, system: SampleSystem, metrics: Metrics,
                         interval_s: float) -> None:
    name = sweeper.endpoint
    retention = system.state_retention(name) if name in system.streams else None
    while True:
        try:
            report = await sweeper.sweep()
            if any(vars(report).values()):
                log.info("sweeper.swept", endpoint=name, **vars(report))
            if retention is not None:  # a state endpoint: its stream is the dedup window
                dropped = await retention.sweep()
                if dropped:
                    log.info("sweeper.state_truncated", endpoint=name, entries=dropped)
            metrics.tokens.set(await system.tokens.count())
            stale = await sweeper.store.committed_before(datetime.now(UTC))
            oldest = min((t.committed_at for t in stale if t.committed_at), default=None)
            age = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
            metrics.oldest.labels(sweeper.endpoint).set(age)
        except Exception as exc:  # noqa: BLE001 - the sweeper must outlive a bad round
            log.warning("sweeper.failed", endpoint=sweeper.endpoint, error=str(exc))
        await asyncio.sleep(interval_s)


async def run_consumer(settings: Settings, endpoint: str) -> None:
    """Consume `endpoint`'s work queue until SIGTERM or SIGINT: then stop consuming, let the
    deliveries in flight finish, and close. The gateway also relays its inbox to its work
    queue every `inbox_poll_s` seconds (a relay cancelled mid-round leaves its claimed rows
    pending: they are published again, and the gateway drops the copy). Raises
    `TransientError` when PostgreSQL or RabbitMQ cannot be reached at start."""
    configure_logging(settings.log_level)
    if settings.migrate_on_start:
        await migrate(settings)
    await preflight(settings)
    container = LocalContainer(settings=settings)
    await container.init_resources()  # type: ignore[misc]
    try:
        rabbit = await container.rabbit()  # type: ignore[misc]
        for name in dict.fromkeys([endpoint, *ENDPOINTS[endpoint].outputs]):
            await topology.declare(rabbit.channel, name, settings.retry_delays_s,
                                   settings.delivery_limit)
        system: SampleSystem = await container.system()  # type: ignore[misc]
        metrics: Metrics = container.metrics()
        source = RabbitSource(rabbit, endpoint, settings.retry_delays_s,
                              settings.max_body_bytes, system.events)
        consumer = system.consumer(endpoint)
        started = asyncio.Event()

        async def ready() -> dict[str, bool]:
            checks = {"consuming": started.is_set()}
            try:
                await system.stores[endpoint].load_tr("__ready__")
                checks["postgres"] = True
            except Exception:  # noqa: BLE001 - any failure means "not ready"
                checks["postgres"] = False
            return checks

        server = None
        if settings.metrics_port:
            server = StatusServer(status_app(metrics, ready), settings.metrics_host,
                                  settings.metrics_port)
            server.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(source.stop()))
        background = [asyncio.create_task(_sweep_forever(
            system.sweeper(endpoint), system, metrics, settings.sweep_interval_s))]
        if endpoint == BOUNDARY:  # outside producers' commands: inbox rows to the work queue
            background.append(asyncio.create_task(system.relay().run(settings.inbox_poll_s)))
        log.info("consumer.started", endpoint=endpoint, prefetch=settings.prefetch)
        started.set()
        await consumer.serve(source.deliveries(settings.prefetch), settings.prefetch)
        log.info("consumer.stopped", endpoint=endpoint,
                 **{str(k): v for k, v in consumer.counts.items()}, rejected=source.rejected)
        for task in background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if server is not None:
            await server.stop()
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


async def run_payments(settings: Settings) -> None:
    """Serve the payments callee (protocol 6) over HTTP with uvicorn until SIGTERM/SIGINT
    (uvicorn's graceful shutdown: in-flight requests finish), with the payments sweeper
    (stale committed transactions, tombstone retention). Raises `SettingsError`-like
    ValueError when `EO_PAYMENTS_TOKEN` is missing."""
    if settings.payments_token is None:
        raise ValueError("EO_PAYMENTS_TOKEN is required to serve payments")
    configure_logging(settings.log_level)
    if settings.migrate_on_start:
        await migrate(settings)
    await preflight(settings)
    # the callee itself calls nobody over HTTP, and blobs are none of its business
    container = LocalContainer(settings=settings.model_copy(
        update={"payments_url": None, "blob_store": "directory"}))
    await container.init_resources()  # type: ignore[misc]
    try:
        system: SampleSystem = await container.system()  # type: ignore[misc]
        app = create_payments_app(system.callee, settings.payments_token.get_secret_value(),
                                  settings.payments_max_body_bytes)
        server = EmbeddedServer(uvicorn.Config(app, host=settings.payments_host,
                                               port=settings.payments_port,
                                               log_level="warning", lifespan="off",
                                               timeout_graceful_shutdown=20))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # finish in-flight requests, exit 0
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        sweeper = asyncio.create_task(_sweep_forever(
            system.sweeper("payments"), system, container.metrics(), settings.sweep_interval_s))
        log.info("payments.serving", host=settings.payments_host, port=settings.payments_port)
        await server.serve()
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
    finally:
        await container.shutdown_resources()  # type: ignore[misc]
