"""The operators' servers: the dead letters over HTTP (entrypoints/dead_letter_api.py) and the
operator's page (entrypoints/operator_page.py), each served with uvicorn until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
import uvicorn

from entrypoints.dead_letter_api import create_dead_letter_app
from entrypoints.local import LocalContainer
from entrypoints.resources import provided, shutdown_resources
from entrypoints.service_spec import Service
from entrypoints.settings import Settings, SettingsError
from entrypoints.startup import started_container
from entrypoints.status import EmbeddedServer, bound_port, listening_socket

log = structlog.get_logger("eo.service")


async def run_dead_letter_api(settings: Settings, service: Service) -> None:
    """Serve the dead letters over HTTP (entrypoints/dead_letter_api.py) with uvicorn on
    `EO_OPERATOR_HOST`:`EO_OPERATOR_PORT` (port 0: a free one, printed in
    `dead_letters.serving`) until SIGTERM/SIGINT (in-flight requests finish). Raises
    `SettingsError` when no operator token is set or the port is taken; at start-up,
    `PermanentError` and `GaveUpWaiting` as `run_consumer`."""

    @contextlib.asynccontextmanager
    async def app(container: LocalContainer, tokens: dict[str, str]) -> AsyncIterator[Any]:
        yield create_dead_letter_app(await provided(container.dead_letter_operations), tokens)

    await _serve_operators(settings, service, "dead-letters", "the dead letters", app)


async def run_operator(settings: Settings, service: Service) -> None:
    """Serve the operator's page (entrypoints/operator_page.py) with uvicorn on
    `EO_OPERATOR_HOST`:`EO_OPERATOR_PORT` (port 0: a free one, printed in
    `operator.serving`) until SIGTERM/SIGINT. Raises as `run_dead_letter_api`."""
    import httpx

    from entrypoints.operator_page import Status, create_operator_app

    @contextlib.asynccontextmanager
    async def app(container: LocalContainer, tokens: dict[str, str]) -> AsyncIterator[Any]:
        dead_letters = await provided(container.dead_letter_operations)
        inspection = await provided(container.inspection)
        async with httpx.AsyncClient() as client:  # the consumers' /metrics
            yield create_operator_app(dead_letters, tokens, Status(
                settings, service, dead_letters, inspection, client))

    await _serve_operators(settings, service, "operator", "the operator page", app)


async def _serve_operators(
        settings: Settings, service: Service, name: str, what: str,
        app: Callable[[LocalContainer, dict[str, str]],
                      contextlib.AbstractAsyncContextManager[Any]],
) -> None:
    """Serve the ASGI app `app` makes (from the composition root and the operators'
    tokens) on `EO_OPERATOR_HOST`:`EO_OPERATOR_PORT`, logging `<name>.serving` with its URL,
    until SIGTERM/SIGINT. Raises `SettingsError` naming `what` when no operator token is
    set, or when the port is taken; at start-up as `run_consumer`."""
    tokens = {n: token.get_secret_value() for n, token in settings.operator.operator_tokens.items()}
    if not tokens or not all(tokens.values()):
        raise SettingsError("invalid setting EO_OPERATOR_TOKENS: required, each token "
                            f"non-empty, to serve {what}")
    try:
        sock = listening_socket(settings.operator.operator_host, settings.operator.operator_port,
                                setting="EO_OPERATOR_PORT")
    except OSError as exc:
        raise SettingsError(f"invalid setting {exc}") from exc
    deadline = asyncio.get_running_loop().time() + settings.rabbitmq.broker_give_up_s
    container = await started_container(settings, service, name, deadline)
    try:
        async with app(container, tokens) as served:
            server = EmbeddedServer(uvicorn.Config(served, log_level="warning",
                                                   lifespan="off",
                                                   timeout_graceful_shutdown=20))
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
            log.info(f"{name.replace('-', '_')}.serving", operators=sorted(tokens),
                     url=f"http://{settings.operator.operator_host}:{bound_port(sock)}")
            await server.serve(sockets=[sock])
    finally:
        await shutdown_resources(container)
