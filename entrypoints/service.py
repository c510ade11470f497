"""The service's processes: one endpoint's consumer on RabbitMQ and PostgreSQL (its sweeper,
its status port, a gateway's inbox relay), or one HTTP callee served with uvicorn; both stop
gracefully on SIGTERM. They only run what the composition root (entrypoints/local.py)
builds: lifecycle, signals, upkeep loops."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from functools import partial

import structlog
import uvicorn

from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.errors import BrokerUnavailable
from application.consumer_process import cancelled
from application.outcome import Outcome
from application.ports import TransactionalStore
from application.registry import Role
from application.workers import Workers
from entrypoints.callee_app import create_callee_app
from entrypoints.resources import provided, shutdown_resources
from entrypoints.service_spec import Service
from entrypoints.settings import FIRST_STATUS_PORT, Settings, SettingsError
from entrypoints.startup import started_container, waiting_for
from entrypoints.status import (
    EmbeddedServer,
    Metrics,
    StatusServer,
    bound_port,
    listening_socket,
    status_app,
)
from entrypoints.tracing import Tracing
from entrypoints.upkeep import dead_letters_forever, report_stopping, sweep_forever
from entrypoints.version import versions

log = structlog.get_logger("eo.service")
#: Exit status of a consumer whose broker stayed unreachable (or whose work queue could not
#: be consumed) for `EO_BROKER_GIVE_UP_S`, and of a process whose start-up waited that long
#: for PostgreSQL or RabbitMQ: EX_UNAVAILABLE of sysexits.h. Restart it.
EXIT_BROKER_UNAVAILABLE = 69


def readiness(source: RabbitSource, rabbit: RabbitConnection, store: TransactionalStore
              ) -> Callable[[], Awaitable[dict[str, bool]]]:
    """The consumer's readiness checks (the status server's `/ready`): consuming, a live
    consumer on the work queue; publishing, the connection and its publisher-confirm channel
    are open (outputs, retries, dead letters); dead_letter_queue, room for dead letters (else
    the endpoint takes nothing new); postgres, the endpoint's store answers."""

    async def ready() -> dict[str, bool]:
        checks = {"consuming": source.consuming, "publishing": rabbit.connected,
                  "dead_letter_queue": not source.dead_letters_blocked}
        try:
            await store.load_tr("__ready__")
            checks["postgres"] = True
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            checks["postgres"] = False
        return checks

    return ready


async def run_consumer(settings: Settings, service: Service, endpoint: str) -> None:
    """Consume `endpoint`'s work queue until SIGTERM or SIGINT: then stop consuming, let the
    deliveries in flight finish, and close. A gateway also relays its inbox to its work
    queue every `inbox_poll_s` seconds (a relay cancelled mid-round leaves its claimed rows
    pending: they are published again, and the gateway drops the copy). The status server
    listens on `EO_METRICS_PORT`, or on the first free port from 9464 when unset (printed in
    `consumer.started`). Raises `SettingsError` when `endpoint` has no work queue or the
    status port is taken, `PermanentError` when start-up finds what no wait fixes (a missing
    database or schema, refused credentials), `GaveUpWaiting` when PostgreSQL or RabbitMQ
    stayed away for `EO_BROKER_GIVE_UP_S` from the start (start-up waits for them as a
    running consumer does), and `BrokerUnavailable` (after the deliveries in flight
    finished) when consumption could not be restored within `EO_BROKER_GIVE_UP_S` (the
    CLI exits 69 for both)."""
    registration = service.registry[endpoint]
    if registration.role is Role.CALLEE:
        raise SettingsError(f"{endpoint} is an HTTP callee: serve it with `eo serve "
                            f"--endpoint {endpoint}`")
    sock = None
    if settings.operator.metrics_port != 0:
        try:
            sock = listening_socket(settings.operator.metrics_host, settings.operator.metrics_port,
                                    FIRST_STATUS_PORT)
        except OSError as exc:
            raise SettingsError(f"invalid setting {exc}") from exc
    deadline = asyncio.get_running_loop().time() + settings.rabbitmq.broker_give_up_s
    container = await started_container(settings, service, endpoint, deadline, consumer=True)
    lost: BrokerUnavailable | None = None
    # the stops' tasks, held: the event loop keeps only weak references to tasks, and one
    # suspended on a future nothing else holds (a channel the broker closed) would be
    # collected mid-stop, leaving the consumer to wait for ever
    stops: list[asyncio.Task[None]] = []
    reports: list[asyncio.Task[None]] = []  # says what the stop waits for, while it waits
    try:
        rabbit: RabbitConnection = await provided(container.rabbit)
        for name in service.registry.queues_of(endpoint):
            await waiting_for(f"RabbitMQ: the queues of {name!r}", partial(
                topology.declare, rabbit, name, settings.protocol.retry_delays_s,
                settings.rabbitmq.delivery_limit, settings.rabbitmq.dead_letter_max_bytes,
                inbound=service.registry[name].role is Role.GATEWAY), deadline,
                endpoint=endpoint)
        workers: Workers = await provided(container.workers)
        metrics: Metrics = container.metrics()
        source: RabbitSource = await provided(container.source)
        collector = await provided(container.collector)
        operations = await provided(container.dead_letter_operations)
        upkeep = [partial(sweep_forever, workers.sweeper(endpoint), workers, metrics,
                          settings.protocol.sweep_interval_s),
                  partial(dead_letters_forever, collector, operations, workers, metrics,
                          endpoint, settings.protocol.sweep_interval_s)]
        if registration.role is Role.GATEWAY:  # batch producers' commands: inbox to queue
            upkeep.append(partial(workers.relay(endpoint).run, settings.protocol.inbox_poll_s))
        process = workers.consumer_process(endpoint, source, upkeep)
        ready = readiness(source, rabbit, workers.stores[endpoint])
        server = None
        if sock is not None:
            server = StatusServer(status_app(metrics, ready), sock)
            server.start()
        loop = asyncio.get_running_loop()
        def stop() -> None:
            stops.append(asyncio.ensure_future(process.stop()))
            if not reports:
                reports.append(asyncio.create_task(report_stopping(endpoint)))

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        await waiting_for(f"RabbitMQ: a consumer on {endpoint!r}", process.start, deadline,
                          endpoint=endpoint)
        status = f"http://{settings.operator.metrics_host}:{server.port}" if server else None
        log.info("consumer.started", endpoint=endpoint, prefetch=process.prefetch,
                 batch_size=process.batch_size, strategy=str(service.strategy(endpoint)),
                 status_url=status, **versions())
        try:
            await process.run()
        except BrokerUnavailable as exc:
            lost = exc
            log.error("consumer.broker_unavailable", endpoint=endpoint, reason=str(exc))
        settled = process.settled()
        log.info("consumer.stopped", endpoint=endpoint, **{str(s): settled[s] for s in Outcome},
                 restarts=source.restarts)
        if server is not None:
            await server.stop()
    finally:
        await shutdown_resources(container)
        for report in reports:
            report.cancel()
    if lost is not None:
        raise lost


async def run_callee(settings: Settings, service: Service, endpoint: str) -> None:
    """Serve callee `endpoint` (protocol 6) over HTTP with uvicorn until SIGTERM/SIGINT
    (uvicorn's graceful shutdown: in-flight requests finish), with its sweeper (stale
    committed transactions, tombstone retention), on `EO_CALLEES__<NAME>__HOST` / `PORT`
    (port 0: a free one, printed in `callee.serving`). Raises `SettingsError` when
    `endpoint` is not a callee, its token is missing or its port is taken; at start-up,
    `PermanentError` and `GaveUpWaiting` as `run_consumer`."""
    registration = service.registry[endpoint]
    if registration.role is not Role.CALLEE:
        raise SettingsError(f"{endpoint} is not an HTTP callee: consume it with `eo consume "
                            f"--endpoint {endpoint}`")
    own = settings.callee(endpoint)
    variable = f"EO_CALLEES__{endpoint.upper()}"
    if own.token is None:
        raise SettingsError(f"invalid setting {variable}__TOKEN: required to serve {endpoint}")
    try:
        sock = listening_socket(own.host, own.port, setting=f"{variable}__PORT")
    except OSError as exc:
        raise SettingsError(f"invalid setting {exc}") from exc
    # a callee serving its own requests does not call itself over HTTP
    settings = settings.replaced(callees={
        name: c for name, c in settings.http.callees.items() if name != endpoint})
    deadline = asyncio.get_running_loop().time() + settings.rabbitmq.broker_give_up_s
    container = await started_container(settings, service, endpoint, deadline)
    try:
        workers: Workers = await provided(container.workers)
        app = create_callee_app(workers.callees[endpoint], own.token.get_secret_value(),
                                own.max_body_bytes)
        tracing: Tracing | None = await provided(container.tracing)
        if tracing is not None:  # server spans continuing the callers' traces
            tracing.instrumentation.app(app)
        server = EmbeddedServer(uvicorn.Config(app, log_level="warning", lifespan="off",
                                               timeout_graceful_shutdown=20))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # finish in-flight requests, exit 0
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        sweeper = asyncio.create_task(sweep_forever(
            workers.sweeper(endpoint), workers, container.metrics(),
            settings.protocol.sweep_interval_s))
        log.info("callee.serving", endpoint=endpoint,
                 url=f"http://{own.host}:{bound_port(sock)}", **versions())
        await server.serve(sockets=[sock])
        await cancelled([sweeper])
    finally:
        await shutdown_resources(container)
