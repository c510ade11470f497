"""The service's processes: one endpoint's consumer on RabbitMQ and PostgreSQL (its sweeper,
its status port, a gateway's inbox relay), or one HTTP callee served with uvicorn; both stop
gracefully on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import structlog
import uvicorn

from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.dead_letter_queue import DeadLetterCollector
from adapters.rabbitmq.errors import BrokerUnavailable
from application.dead_letters import DeadLetters
from application.outcome import Outcome
from application.records import DeadLetterStatus
from application.registry import Role
from application.sweeper import Sweeper
from entrypoints.callee_app import create_callee_app
from entrypoints.dead_letter_api import create_dead_letter_app
from entrypoints.local import provided, shutdown_resources
from entrypoints.settings import FIRST_STATUS_PORT, Service, Settings, SettingsError
from entrypoints.startup import started_container, waiting_for
from entrypoints.status import (
    EmbeddedServer,
    Metrics,
    StatusServer,
    bound_port,
    listening_socket,
    status_app,
)
from entrypoints.system import System
from entrypoints.tracing import Tracing

log = structlog.get_logger("eo.service")
#: Exit status of a consumer whose broker stayed unreachable (or whose work queue could not
#: be consumed) for `EO_BROKER_GIVE_UP_S`, and of a process whose start-up waited that long
#: for PostgreSQL or RabbitMQ: EX_UNAVAILABLE of sysexits.h. Restart it.
EXIT_BROKER_UNAVAILABLE = 69


async def _sweep_forever(sweeper: Sweeper, system: System, metrics: Metrics,
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
            stale = await sweeper.store.committed_before(datetime.now(UTC))
            oldest = min((t.committed_at for t in stale if t.committed_at), default=None)
            age = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
            metrics.oldest.labels(sweeper.endpoint).set(age)
        except Exception as exc:  # noqa: BLE001 - the sweeper must outlive a bad round
            log.warning("sweeper.failed", endpoint=sweeper.endpoint, error=str(exc))
        await asyncio.sleep(interval_s)


async def _dead_letters_forever(collector: DeadLetterCollector | None,
                                operations: DeadLetters, system: System, metrics: Metrics,
                                endpoint: str, interval_s: float) -> None:
    """Every `interval_s` seconds: move the endpoint's dead-letter queue into the store
    (with a `collector`: `EO_DEAD_LETTER_COLLECT`), discard (and forget) what the retention
    says, and set the gauges: dead letters per endpoint and status, the tokens dead letters
    keep and the tokens in flight (the others)."""
    name = endpoint
    while True:
        try:
            moved = await collector.drain() if collector is not None else 0
            discarded, purged = await operations.expire()
            if moved or discarded or purged:
                log.info("dead_letters.kept", endpoint=name, moved=moved,
                         expired=discarded, forgotten=purged)
            gauges = await operations.gauges()
            for endpoint, counts in gauges.counts.items():
                for status in DeadLetterStatus:
                    metrics.dead_letters.labels(endpoint, str(status)).set(
                        counts.get(str(status), 0))
            metrics.dead_letter_tokens.set(gauges.tokens)
            metrics.tokens.set(await system.tokens.count() - gauges.tokens)
        except Exception as exc:  # noqa: BLE001 - the upkeep must outlive a bad round
            log.warning("dead_letters.failed", endpoint=name, error=str(exc))
        await asyncio.sleep(interval_s)


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
    if settings.metrics_port != 0:
        try:
            sock = listening_socket(settings.metrics_host, settings.metrics_port,
                                    FIRST_STATUS_PORT)
        except OSError as exc:
            raise SettingsError(f"invalid setting {exc}") from exc
    deadline = asyncio.get_running_loop().time() + settings.broker_give_up_s
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
                topology.declare, rabbit, name, settings.retry_delays_s,
                settings.delivery_limit, settings.dead_letter_max_bytes,
                inbound=service.registry[name].role is Role.GATEWAY), deadline,
                endpoint=endpoint)
        system: System = await provided(container.system)
        metrics: Metrics = container.metrics()
        service_user: str = container.service_user()
        gateway = registration.role is Role.GATEWAY
        source = RabbitSource(rabbit, endpoint, settings.retry_delays_s,
                              settings.max_body_bytes, system.events,
                              watchdog_s=settings.consumer_watchdog_s,
                              dead_letter_body_bytes=settings.dead_letter_body_bytes,
                              kept_headers=settings.kept_headers, service_user=service_user,
                              require_producer=gateway and settings.profile == "production"
                              and not settings.allow_anonymous_producers)
        consumer = system.consumer(endpoint)

        async def ready() -> dict[str, bool]:
            # consuming: a live consumer on the work queue; publishing: the connection and
            # its publisher-confirm channel are open (outputs, retries, dead letters);
            # dead_letter_queue: room for dead letters (else the endpoint takes nothing new)
            checks = {"consuming": source.consuming, "publishing": rabbit.connected,
                      "dead_letter_queue": not source.dead_letters_blocked}
            try:
                await system.stores[endpoint].load_tr("__ready__")
                checks["postgres"] = True
            except Exception:  # noqa: BLE001 - any failure means "not ready"
                checks["postgres"] = False
            return checks

        server = None
        if sock is not None:
            server = StatusServer(status_app(metrics, ready), sock)
            server.start()
        loop = asyncio.get_running_loop()
        def stop() -> None:
            stops.append(asyncio.ensure_future(source.stop()))
            if not reports:
                reports.append(asyncio.create_task(_report_stopping(endpoint)))

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        kept = await provided(container.dead_letter_store)
        collector = (DeadLetterCollector(rabbit, endpoint, kept, service_user,
                                         system.events)
                     if settings.dead_letter_collect else None)
        background = [asyncio.create_task(_sweep_forever(
            system.sweeper(endpoint), system, metrics, settings.sweep_interval_s)),
            asyncio.create_task(_dead_letters_forever(
                collector, system.dead_letters(kept), system,
                metrics, endpoint, settings.sweep_interval_s))]
        if gateway:  # batch producers' commands: inbox to queue
            background.append(asyncio.create_task(
                system.relay(endpoint).run(settings.inbox_poll_s)))
        prefetch = settings.prefetch_for(consumer.batches)
        await waiting_for(f"RabbitMQ: a consumer on {endpoint!r}",
                           partial(source.start, prefetch), deadline, endpoint=endpoint)
        status = f"http://{settings.metrics_host}:{server.port}" if server else None
        log.info("consumer.started", endpoint=endpoint, prefetch=prefetch,
                 batch_size=consumer.batch_size if consumer.batches else 1,
                 strategy=str(service.strategy(endpoint)), status_url=status)
        try:
            await consumer.serve(source.deliveries(prefetch), prefetch)
        except BrokerUnavailable as exc:
            lost = exc
            log.error("consumer.broker_unavailable", endpoint=endpoint, reason=str(exc))
        settled = {str(s): consumer.counts[s] for s in Outcome}
        # one vocabulary: what the source dead-lettered before processing is dead-lettered
        settled[str(Outcome.DEAD_LETTERED)] += source.dead_lettered
        log.info("consumer.stopped", endpoint=endpoint, **settled, restarts=source.restarts)
        await cancelled(background)
        if server is not None:
            await server.stop()
    finally:
        await shutdown_resources(container)
        for report in reports:
            report.cancel()
    if lost is not None:
        raise lost


#: how often a consumer that was told to stop says what it still waits for (seconds)
STOPPING_REPORT_S = 10.0
#: how long a cancelled background task gets to end before it is cancelled again (seconds)
CANCEL_AGAIN_S = 1.0


async def cancelled(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait until every one has ended, cancelling again each one still
    running after `CANCEL_AGAIN_S`: a cancellation that arrives while a library call is in
    progress may be swallowed by it (seen: a dead-letter round finishing after its task was
    cancelled, then sleeping on), and a task that ignored one must not hold the stop for
    ever. Their results and errors are dropped (they are the process's upkeep)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" warning


def _suspended_at(task: asyncio.Task[object]) -> str:
    """Where `task` waits: its innermost coroutine frames, outermost first."""
    frames = []
    awaited: object = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return " > ".join(frames[-3:]) or repr(task.get_coro())


async def _report_stopping(endpoint: str) -> None:
    """While a stop takes longer than `STOPPING_REPORT_S`, log `consumer.stopping` every
    `STOPPING_REPORT_S` with the seconds waited and where each other task waits: a stop
    that hangs says on what (a chaos campaign found one that outlasted 30 s)."""
    started = asyncio.get_running_loop().time()
    me = asyncio.current_task()
    while True:
        await asyncio.sleep(STOPPING_REPORT_S)
        tasks = sorted(_suspended_at(t) for t in asyncio.all_tasks() if t is not me)
        log.warning("consumer.stopping", endpoint=endpoint,
                    waited_s=round(asyncio.get_running_loop().time() - started, 1),
                    tasks=tasks)


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
    settings = settings.model_copy(update={"callees": {
        name: c for name, c in settings.callees.items() if name != endpoint}})
    deadline = asyncio.get_running_loop().time() + settings.broker_give_up_s
    container = await started_container(settings, service, endpoint, deadline)
    try:
        system: System = await provided(container.system)
        app = create_callee_app(system.callees[endpoint], own.token.get_secret_value(),
                                own.max_body_bytes)
        tracing: Tracing | None = await provided(container.tracing)
        if tracing is not None:  # server spans continuing the callers' traces
            tracing.instrumentation.app(app)
        server = EmbeddedServer(uvicorn.Config(app, log_level="warning", lifespan="off",
                                               timeout_graceful_shutdown=20))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # finish in-flight requests, exit 0
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        sweeper = asyncio.create_task(_sweep_forever(
            system.sweeper(endpoint), system, container.metrics(), settings.sweep_interval_s))
        log.info("callee.serving", endpoint=endpoint,
                 url=f"http://{own.host}:{bound_port(sock)}")
        await server.serve(sockets=[sock])
        await cancelled([sweeper])
    finally:
        await shutdown_resources(container)



async def run_dead_letter_api(settings: Settings, service: Service) -> None:
    """Serve the dead letters over HTTP (entrypoints/dead_letter_api.py) with uvicorn on
    `EO_OPERATOR_HOST`:`EO_OPERATOR_PORT` (port 0: a free one, printed in
    `dead_letters.serving`) until SIGTERM/SIGINT (in-flight requests finish). Raises
    `SettingsError` when no operator token is set or the port is taken; at start-up,
    `PermanentError` and `GaveUpWaiting` as `run_consumer`."""

    @contextlib.asynccontextmanager
    async def app(dead_letters: DeadLetters, tokens: dict[str, str]) -> AsyncIterator[Any]:
        yield create_dead_letter_app(dead_letters, tokens)

    await _serve_operators(settings, service, "dead-letters", "the dead letters", app)


async def run_operator(settings: Settings, service: Service) -> None:
    """Serve the operator's page (entrypoints/operator_page.py) with uvicorn on
    `EO_OPERATOR_HOST`:`EO_OPERATOR_PORT` (port 0: a free one, printed in
    `operator.serving`) until SIGTERM/SIGINT. Raises as `run_dead_letter_api`."""
    import httpx

    from entrypoints.operator_page import Status, create_operator_app

    @contextlib.asynccontextmanager
    async def app(dead_letters: DeadLetters, tokens: dict[str, str]) -> AsyncIterator[Any]:
        async with httpx.AsyncClient() as client:  # the consumers' /metrics
            yield create_operator_app(dead_letters, tokens,
                                      Status(settings, service, dead_letters, client))

    await _serve_operators(settings, service, "operator", "the operator page", app)


async def _serve_operators(
        settings: Settings, service: Service, name: str, what: str,
        app: Callable[[DeadLetters, dict[str, str]], contextlib.AbstractAsyncContextManager[Any]],
) -> None:
    """Serve the ASGI app `app` makes (from the dead letters' operations and the operators'
    tokens) on `EO_OPERATOR_HOST`:`EO_OPERATOR_PORT`, logging `<name>.serving` with its URL,
    until SIGTERM/SIGINT. Raises `SettingsError` naming `what` when no operator token is
    set, or when the port is taken; at start-up as `run_consumer`."""
    tokens = {n: token.get_secret_value() for n, token in settings.operator_tokens.items()}
    if not tokens or not all(tokens.values()):
        raise SettingsError("invalid setting EO_OPERATOR_TOKENS: required, each token "
                            f"non-empty, to serve {what}")
    try:
        sock = listening_socket(settings.operator_host, settings.operator_port,
                                setting="EO_OPERATOR_PORT")
    except OSError as exc:
        raise SettingsError(f"invalid setting {exc}") from exc
    deadline = asyncio.get_running_loop().time() + settings.broker_give_up_s
    container = await started_container(settings, service, name, deadline)
    try:
        system: System = await provided(container.system)
        store = await provided(container.dead_letter_store)
        async with app(system.dead_letters(store), tokens) as served:
            server = EmbeddedServer(uvicorn.Config(served, log_level="warning",
                                                   lifespan="off",
                                                   timeout_graceful_shutdown=20))
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
            log.info(f"{name.replace('-', '_')}.serving", operators=sorted(tokens),
                     url=f"http://{settings.operator_host}:{bound_port(sock)}")
            await server.serve(sockets=[sock])
    finally:
        await shutdown_resources(container)
