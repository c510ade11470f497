"""The service's own HTTP port: Prometheus metrics, readiness and liveness (uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route


class Metrics:
    """Protocol counts (section 9) as `eo_events_total{endpoint, event}`, plus the gauges
    `eo_tokens_in_flight` and `eo_oldest_unfinished_transaction_seconds{endpoint}`.
    Also an `EventSink`: `emit` counts the event and forwards it to `inner`."""

    def __init__(self, inner: object | None = None) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter("eo_events", "Protocol events by endpoint and name",
                              ["endpoint", "event"], registry=self.registry)
        self.tokens = Gauge("eo_tokens_in_flight", "Tokens in the token store",
                            registry=self.registry)
        self.oldest = Gauge("eo_oldest_unfinished_transaction_seconds",
                            "Age of the oldest committed-but-unfinished transaction",
                            ["endpoint"], registry=self.registry)
        self._inner = inner

    def emit(self, event: str, **fields: object) -> None:
        self.events.labels(str(fields.get("endpoint", "")), event).inc()
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


class StatusServer:
    """uvicorn serving `status_app` inside the service's event loop."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        self.server = EmbeddedServer(uvicorn.Config(app, host=host, port=port,
                                                     log_level="warning", lifespan="off"))
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve in the background (the port must be free; uvicorn logs and exits if not)."""
        self.task = asyncio.create_task(self.server.serve())

    async def stop(self) -> None:
        """Stop serving and wait for the server to close."""
        self.server.should_exit = True
        if self.task is not None:
            await self.task
