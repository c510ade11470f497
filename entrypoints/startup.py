"""A process's start-up (protocol-independent): the databases and the broker waited for while
they are briefly away, as a running consumer waits for its broker, until
`EO_BROKER_GIVE_UP_S`; what no wait fixes (a missing database or schema, refused
credentials) fails at once; then the composition root's resources."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import aio_pika
import asyncpg
import structlog
from alembic.script import ScriptDirectory

from adapters.postgres.admin import database_name, database_refusal
from adapters.postgres.migrate import MIGRATIONS, head_revision, upgrade_async
from adapters.postgres.pool import translated as postgres_translated
from adapters.rabbitmq.backoff import reconnecting
from adapters.rabbitmq.connection import OPEN_TIMEOUT_S
from adapters.rabbitmq.errors import refusal
from adapters.rabbitmq.errors import translated as broker_translated
from adapters.rabbitmq.urls import first_answering, redacted
from application.errors import PermanentError, TransientError
from entrypoints.local import LocalContainer
from entrypoints.logs import configure_logging
from entrypoints.resources import init_resources, shutdown_resources
from entrypoints.service_spec import Service
from entrypoints.settings import Settings

log = structlog.get_logger("eo.service")

T = TypeVar("T")


class GaveUpWaiting(TransientError):
    """Start-up waited `EO_BROKER_GIVE_UP_S` for PostgreSQL or RabbitMQ in vain: the process
    exits with `EXIT_BROKER_UNAVAILABLE` for its orchestrator to restart it."""


async def waiting_for(what: str, step: Callable[[], Awaitable[T]], deadline: float,
                       **fields: object) -> T:
    """`await step()`, tried again with the broker connection's reconnection backoff while
    it raises `TransientError` (a server that does not answer, a connection or channel it
    closed, a timeout), logging each wait as the warning `startup.waiting` (`waiting_for`:
    `what`, `error`, `waited_s`, `retry_in_s`, `gives_up_in_s`, and `fields`), until the
    event loop's clock reaches `deadline` (seconds). Raises `PermanentError` at once when
    the broker refused in a way no wait fixes (`refusal`: credentials, permissions, a
    queue's arguments), and `GaveUpWaiting` at `deadline`; other errors propagate at once."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def attempt() -> T:
        try:
            return await step()
        except TransientError as exc:
            if refusal(exc) is not None:
                raise PermanentError(f"{what}: {exc}") from exc
            raise

    def waiting(error: BaseException, pause_s: float) -> None:
        now = loop.time()
        log.warning("startup.waiting", waiting_for=what, error=str(error),
                    waited_s=round(now - started, 1), retry_in_s=round(pause_s, 2),
                    gives_up_in_s=round(deadline - now, 1), **fields)

    try:
        return await reconnecting(attempt, deadline, waiting=waiting)
    except TransientError as exc:
        raise GaveUpWaiting(f"{what}: still unreachable after {loop.time() - started:.0f} s "
                            f"(EO_BROKER_GIVE_UP_S): {exc}") from exc


#: `synchronous_commit` values whose commit waits for a synchronous standby
SYNCHRONOUS_COMMITS = frozenset({"on", "remote_write", "remote_apply"})


async def _replication_checked(conn: asyncpg.Connection, name: str, require: bool) -> None:
    """Whether the server's commits wait for a synchronous standby (`synchronous_standby_names`
    set, `synchronous_commit` one of `SYNCHRONOUS_COMMITS`): if not, a failover can lose
    acknowledged commits (docs/operations.md). Logs `startup.replication_asynchronous`, or,
    with `require`, raises `PermanentError` naming what is missing."""
    standbys, commit, streaming = await conn.fetchrow(
        "SELECT current_setting('synchronous_standby_names'), "
        "current_setting('synchronous_commit'), "
        "(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming')")
    if standbys and commit in SYNCHRONOUS_COMMITS:
        return
    why = (f"synchronous_standby_names is {standbys!r}" if not standbys
           else f"synchronous_commit is {commit!r}")
    if require:
        raise PermanentError(
            f"database {name!r}: commits are not replicated synchronously ({why}, "
            f"{streaming} standbys streaming): a failover could lose acknowledged commits "
            "and their messages; set synchronous replication, or EO_REPLICATION_CHECK=warn")
    log.warning("startup.replication_asynchronous", database=name, reason=why,
                standbys_streaming=int(streaming),
                consequence="a failover can lose acknowledged commits and their messages")


def _known_revisions() -> set[str]:
    """The schema revisions of this code's migrations (alembic's script directory)."""
    return {script.revision for script in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}


async def _database_ready(dsn: str, migrate: bool, replication: str = "off") -> None:
    """One look at the database of `dsn`: it answers (migrated first when `migrate`) and
    carries this code's schema revision, or a newer one (a rolling upgrade migrates before
    it replaces the processes: logged as `startup.schema_newer`). Raises `TransientError`
    when the server does not answer or drops the connection, `PermanentError` when the
    database, its schema or its latest migrations are missing, or the server refuses the
    credentials."""
    name = database_name(dsn)
    try:
        async with postgres_translated():
            conn = await asyncpg.connect(dsn, timeout=OPEN_TIMEOUT_S)
    except asyncpg.PostgresError as exc:  # no database, refused credentials, ...
        raise database_refusal(exc, dsn) from exc
    try:
        if migrate:
            await upgrade_async(dsn)
        async with postgres_translated():
            try:
                revision = await conn.fetchval("SELECT version_num FROM eo_schema_version")
            except asyncpg.UndefinedTableError:
                revision = None
            if replication != "off":
                await _replication_checked(conn, database_name(dsn), replication == "require")
    finally:
        # a connection the server dropped closes with an error: the look is over either way
        with contextlib.suppress(OSError, asyncpg.InterfaceError, asyncpg.PostgresError):
            await conn.close(timeout=OPEN_TIMEOUT_S)
    head = head_revision()
    if revision == head:
        return
    if revision is None:
        raise PermanentError(f"database {name!r} has no schema: run `eo migrate`")
    if revision in _known_revisions():
        raise PermanentError(f"database {name!r} is at schema revision {revision}, this "
                             f"version needs {head}: run `eo migrate`")
    log.warning("startup.schema_newer", database=name, revision=revision, head=head)


async def _broker_answers(urls: list[str]) -> None:
    """One connection to RabbitMQ, at the first of `urls` (a cluster's nodes) that answers,
    closed at once. Raises the last node's `TransientError` when none answers,
    `PermanentError` at once for refused credentials."""
    await first_answering(urls, _broker_answers_at, (TransientError,))


async def _broker_answers_at(url: str) -> None:
    with broker_translated(f"connecting to {redacted(url)}"):
        connection = await aio_pika.connect(url, timeout=OPEN_TIMEOUT_S)
        await connection.close()


async def preflight(settings: Settings, broker: bool = True, deadline: float | None = None
                    ) -> None:
    """Before any resource starts: the databases exist, answer and carry this code's schema
    (migrated first with `EO_MIGRATE_ON_START`), and RabbitMQ answers (when `broker`). A
    server that does not answer, or closes the connection, is waited for until `deadline`
    (the event loop's clock, seconds; None: no wait), each wait logged (`startup.waiting`).
    Raises `PermanentError` at once for a missing database, a missing or older schema (run
    `eo migrate`) and refused credentials, `GaveUpWaiting` (a `TransientError`) when a
    server is still away at `deadline`."""
    if deadline is None:
        deadline = asyncio.get_running_loop().time()
    check = settings.postgres.replication_check
    if check == "warn" and settings.profile != "production":
        check = "off"  # a laptop's or a test's server has no standby to ask about
    for dsn in dict.fromkeys([settings.database(), settings.tokens_database()]):
        await waiting_for(f"PostgreSQL database {database_name(dsn)!r}",
                           partial(_database_ready, dsn, settings.postgres.migrate_on_start,
                                   check), deadline)
    if broker:
        await waiting_for("RabbitMQ", partial(_broker_answers, settings.amqp_urls()),
                          deadline)


async def _init_resources(container: LocalContainer) -> None:
    """Start `container`'s resources; when one fails, stop those that started (the next
    attempt makes them anew) and raise its error."""
    try:
        await init_resources(container)
    except TransientError:
        # the shutdown of a resource still starting awaits it, and it may fail as well
        with contextlib.suppress(TransientError):
            await shutdown_resources(container)
        raise


async def started_container(settings: Settings, service: Service, name: str, deadline: float,
                            consumer: bool = False) -> LocalContainer:
    """Process `name`'s composition root, its resources started: `preflight`, then the
    pools, the broker connection, the blob store and the HTTP client, waiting until
    `deadline` (the event loop's clock) for a server that is away. `consumer`: the process
    consumes endpoint `name` (`LocalContainer.consumer`). Raises as `preflight`."""
    configure_logging(settings.log_level)
    await preflight(settings, deadline=deadline)
    container = LocalContainer(settings=settings, service=service)
    container.connection_name.override(f"eo {name} pid {os.getpid()}")
    container.process_name.override(name)
    if consumer:
        container.consumer.override(name)
    await waiting_for("the PostgreSQL pools and the RabbitMQ connection",
                       partial(_init_resources, container), deadline, endpoint=name)
    return container
