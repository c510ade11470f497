"""Finding PostgreSQL and RabbitMQ for integration and contract tests (architecture.md).

Environment variables first, then the default local ports, then testcontainers where a Docker
engine answers; otherwise the tests fail with a message that says how to start the services.
"""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import urlsplit

POSTGRES_ENV = "EO_TEST_POSTGRES_DSN"
AMQP_ENV = "EO_TEST_AMQP_URL"
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672/"

HOW_TO = (
    "Start the services, or point the tests at them:\n"
    f"  PostgreSQL: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start,"
    f" or {POSTGRES_ENV}=postgresql://user@host:port/db\n"
    f"  RabbitMQ:   rabbitmq-server -detached, or {AMQP_ENV}=amqp://user:pass@host:port/\n"
    "  or run a Docker engine so testcontainers can start them."
)


class ServiceUnavailable(RuntimeError):
    """No way to reach a service the tests need."""


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1",
                                       parts.port or default_port), timeout=1.0):
            return True
    except OSError:
        return False


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no engine"
        return False


@dataclass
class Services:
    """Where the services are; `close()` stops containers this process started."""

    postgres_dsn: str
    amqp_url: str
    _stack: ExitStack

    def close(self) -> None:
        self._stack.close()


def _find(env: str, local: str, port: int, container: str, stack: ExitStack) -> str:
    explicit = os.environ.get(env)
    if explicit:
        if not _reachable(explicit, port):
            raise ServiceUnavailable(f"{env}={explicit} does not answer.\n{HOW_TO}")
        return explicit
    if _reachable(local, port):
        return local
    if _docker_answers():
        if container == "postgres":
            from testcontainers.postgres import PostgresContainer

            pg = stack.enter_context(PostgresContainer("postgres:16-alpine", driver=None))
            return str(pg.get_connection_url())
        from testcontainers.rabbitmq import RabbitMqContainer

        mq = stack.enter_context(RabbitMqContainer("rabbitmq:3.13-alpine"))
        params = mq.get_connection_params()
        return f"amqp://guest:guest@{params.host}:{params.port}/"
    raise ServiceUnavailable(f"{container} is not reachable at {local}.\n{HOW_TO}")


def discover(postgres: bool = True, rabbitmq: bool = True) -> Services:
    """Find the services asked for; raises `ServiceUnavailable` with instructions."""
    stack = ExitStack()
    dsn = _find(POSTGRES_ENV, LOCAL_POSTGRES, 5432, "postgres", stack) if postgres else ""
    url = _find(AMQP_ENV, LOCAL_AMQP, 5672, "rabbitmq", stack) if rabbitmq else ""
    return Services(dsn, url, stack)
