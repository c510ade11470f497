"""The service's own HTTP port: Prometheus metrics, readiness and liveness (uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from application.observability import (
    CONSUMER_RESTARTED,
    DEAD_LETTER_QUEUE_FULL,
    DEAD_LETTER_QUEUE_ROOM,
)


class Metrics:
    """Protocol counts (section 9) as `eo_events_total{endpoint, event}`, the gauges
    `eo_tokens_in_flight` (tokens of messages in flight: not those dead letters keep),
    `eo_dead_letter_tokens` (tokens that dead letters keep),
    `eo_dead_letters{endpoint, status}`, `eo_dead_letter_queue_full{endpoint}` (1 while a
    dead letter waits for room and the endpoint takes no new delivery) and
    `eo_oldest_unfinished_transaction_seconds{endpoint}`, and
    `eo_consumer_restarts_total{endpoint, reason}` (work-queue consumers re-created).
    Also an `EventSink`: `emit` counts the event and forwards it to `inner`."""

    def __init__(self, inner: object | None = None) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter("eo_events", "Protocol events by endpoint and name",
                              ["endpoint", "event"], registry=self.registry)
        self.tokens = Gauge("eo_tokens_in_flight", "Tokens of messages in flight (not those "
                            "that dead letters keep)", registry=self.registry)
        self.dead_letter_tokens = Gauge("eo_dead_letter_tokens", "Tokens that dead letters "
                                        "keep (until replayed, discarded or expired)",
                                        registry=self.registry)
        self.dead_letters = Gauge("eo_dead_letters", "Dead letters kept, by endpoint and "
                                  "status (dead: waiting for an operator)",
                                  ["endpoint", "status"], registry=self.registry)
        self.dead_letter_queue_full = Gauge(
            "eo_dead_letter_queue_full", "1 while the endpoint's dead-letter queue is full "
            "and the endpoint takes no new delivery", ["endpoint"], registry=self.registry)
        self.oldest = Gauge("eo_oldest_unfinished_transaction_seconds",
                            "Age of the oldest committed-but-unfinished transaction",
                            ["endpoint"], registry=self.registry)
        self.consumer_restarts = Counter(
            "eo_consumer_restarts", "Work-queue consumers re-created after they were lost, "
            "by reason (channel_closed, cancelled, no_consumer, stalled)",
            ["endpoint", "reason"], registry=self.registry)
        self._inner = inner

    def emit(self, event: str, **fields: object) -> None:
        endpoint = str(fields.get("endpoint", ""))
        self.events.labels(endpoint, event).inc()
        if event == CONSUMER_RESTARTED:
            self.consumer_restarts.labels(endpoint, str(fields.get("reason", ""))).inc()
        elif event in (DEAD_LETTER_QUEUE_FULL, DEAD_LETTER_QUEUE_ROOM):
            self.dead_letter_queue_full.labels(endpoint).set(event == DEAD_LETTER_QUEUE_FULL)
        emit = getattr(self._inner, "emit", None)
        if emit is not None:
            emit(event, **fields)


def status_app(metrics: Metrics, ready: Callable[[], Awaitable[dict[str, bool]]]) -> Starlette:
    """`/metrics` (Prometheus text format), `/ready` (200 when every check of `ready()` is
    true, else 503 with the checks), `/health` (200 while the process runs)."""

    async def readiness(_request: Request) -> JSONResponse:
        checks = await ready()
        return JSONResponse(checks, status_code=200 if all(checks.values()) else 503)

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/ready", readiness), Route("/health", health),
                             Mount("/metrics", make_asgi_app(metrics.registry))])


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handling: the service owns SIGTERM (graceful shutdown of
    the consumer first), uvicorn would otherwise replace the handlers and re-raise."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listening_socket(host: str, port: int | None, first: int = 9464, tries: int = 100,
                     setting: str = "EO_METRICS_PORT") -> socket.socket:
    """A socket bound to `host:port` and listening, ready to hand to uvicorn, so the port is
    ours from the start (no probe-then-bind race). `port` None: the first free port of
    `first .. first + tries - 1` (several processes on one host each get their own, the
    first one the well-known port); 0: any free port. Raises `OSError` naming `setting` when
    the port is taken (or none of the range is free)."""
    candidates = range(first, first + tries) if port is None else [port]
    last: OSError | None = None
    for candidate in candidates:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                             socket.SOCK_STREAM)
        # a restart binds the port its predecessor's connections keep in TIME_WAIT (as
        # uvicorn does); Linux still refuses a port another socket listens on
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        sock.setblocking(False)
        return sock
    where = f"{host}:{port}" if port is not None else f"{host}:{first}-{first + tries - 1}"
    raise OSError(f"{setting}: cannot listen on {where}: {last}")


def bound_port(sock: socket.socket) -> int:
    """The port `sock` listens on."""
    return int(sock.getsockname()[1])


class StatusServer:
    """uvicorn serving `status_app` inside the service's event loop, on a socket bound by
    `listening_socket` (its port is `port`)."""

    def __init__(self, app: Starlette, sock: socket.socket) -> None:
        self.sock = sock
        self.port = bound_port(sock)
        self.server = EmbeddedServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve in the background."""
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))

    async def stop(self) -> None:
        """Stop serving and wait for the server to close."""
        self.server.should_exit = True
        if self.task is not None:
            await self.task
