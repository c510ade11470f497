"""Least privilege as `deploy/` sets it up (security review, finding 8), on the local services:
`deploy/rabbitmq/setup.sh` (a service user on its virtual host only, a producer user that may
publish to the gateway's inbound exchange alone, the dead-letter policy) and
`deploy/postgres/roles.sql` (migrations as the owner, processes as a role without DDL).

Both scripts need the services' own command-line tools on this host (`rabbitmqctl`, `psql`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest
from aiormq.exceptions import ChannelAccessRefused, InvalidFrameError

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.inbox import (
    PostgresInbox,
    create_staging,
    merge_staging,
    staging_name,
)
from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.rabbitmq.errors import PublishRefused
from adapters.rabbitmq.topology import declare
from adapters.system.clock import ManualClock
from application.envelope import Envelope
from application.ports import Clear, CommitRequest
from tests.support.counters.endpoints import Tally
from tests.support.services import discover

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

ROOT = Path(__file__).resolve().parents[2]
RUN = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
DELAYS = (0.05,)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on this host's PATH: the deploy scripts run it "
                    "(install the service's client tools)")
    return path


def _with_user(url: str, user: str, password: str, vhost: str) -> str:
    parts = urlsplit(url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit(parts._replace(netloc=netloc, path=f"/{vhost}"))


@dataclass(frozen=True)
class Broker:
    """The virtual host setup.sh made, and URLs of its two users."""

    vhost: str
    service_url: str
    producer_url: str


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    services = discover(postgres=False)
    ctl = _tool("rabbitmqctl")
    vhost, service, producer = f"eo-lp-{RUN}", f"eo-lp-service-{RUN}", f"eo-lp-producer-{RUN}"
    env = {**os.environ, "EO_VHOST": vhost, "EO_SERVICE_USER": service,
           "EO_PRODUCER_USER": producer, "EO_SERVICE_PASSWORD": "service-secret",
           "EO_PRODUCER_PASSWORD": "producer-secret", "EO_GATEWAYS": "front",
           "EO_DEAD_LETTER_MAX_BYTES": "1000"}
    try:
        done = subprocess.run(["sh", str(ROOT / "deploy" / "rabbitmq" / "setup.sh")], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        yield Broker(vhost, _with_user(services.amqp_url, service, "service-secret", vhost),
                     _with_user(services.amqp_url, producer, "producer-secret", vhost))
    finally:
        for args in (["delete_vhost", vhost], ["delete_user", service],
                     ["delete_user", producer]):
            subprocess.run([ctl, "-q", *args], capture_output=True, timeout=60)
        services.close()


@pytest.fixture
async def service(broker: Broker) -> AsyncIterator[RabbitConnection]:
    """The service's connection, with the counters' queues declared (front: a gateway)."""
    rabbit = RabbitConnection(broker.service_url, reconnect_delays_s=(0.1,))
    await rabbit.start()
    await declare(rabbit, "front", DELAYS, 5, inbound=True)
    await declare(rabbit, "counter", DELAYS, 5)  # no byte bound of its own: the policy's
    try:
        yield rabbit
    finally:
        await rabbit.close()


async def _depth(rabbit: RabbitConnection, queue: str) -> int:
    return (await rabbit.queue_counts(queue))[0]


def _message(body: bytes = b"{}") -> aio_pika.Message:
    return aio_pika.Message(body, message_id=str(uuid.uuid4()), type="Add",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


async def test_the_producer_publishes_to_the_gateway_and_nowhere_else(
    broker: Broker, service: RabbitConnection
) -> None:
    done = await asyncio.to_thread(subprocess.run, [
        sys.executable, str(ROOT / "docs" / "examples" / "publish.py"), broker.producer_url,
        "front", "Add", '{"counter": "c1", "amount": 1}', str(uuid.uuid4()), "--inbound"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert await _depth(service, "front") == 1
    connection = await aio_pika.connect(broker.producer_url)
    try:
        for queue in ("counter", "front"):  # the default exchange routes anywhere: refused
            channel = await connection.channel(publisher_confirms=True)
            with pytest.raises(ChannelAccessRefused):
                await channel.default_exchange.publish(_message(), routing_key=queue)
        channel = await connection.channel()
        queue = await channel.get_queue("front", ensure=False)
        with pytest.raises(ChannelAccessRefused):  # no reading
            await queue.get(fail=False)
        channel = await connection.channel()
        with pytest.raises(ChannelAccessRefused):  # no declaring
            await channel.declare_queue("elsewhere")
    finally:
        await connection.close()
    assert await _depth(service, "counter") == 0
    assert await _depth(service, "front") == 1


async def test_the_service_user_reaches_its_own_virtual_host_only(broker: Broker) -> None:
    other = urlunsplit(urlsplit(broker.service_url)._replace(path="/"))
    with pytest.raises(InvalidFrameError, match=r"Connection\.Close"):  # 530 NOT_ALLOWED
        await aio_pika.connect(other)


async def test_the_policy_bounds_a_dead_letter_queue_declared_without_a_bound(
    service: RabbitConnection,
) -> None:
    dispatcher, dead = RabbitDispatcher(service), "counter.dlq"
    big = Envelope(uuid.uuid4(), "Add", b" " * 1500, MappingProxyType({}))
    await dispatcher.dispatch(dead, big)  # past the policy's 1,000 bytes
    with pytest.raises(PublishRefused):
        await dispatcher.dispatch(dead, Envelope(uuid.uuid4(), "Add", b"{}"))
    assert await _depth(service, dead) == 1


# --- PostgreSQL ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roles:
    """DSNs of a database of its own as each role roles.sql made: the migrations' owner, the
    service's app role, and a bulk producer granted the gateway `front`."""

    owner: str
    app: str
    producer: str
    producer_role: str


@pytest.fixture(scope="module")
def roles() -> Iterator[Roles]:
    """roles.sql, `eo migrate` as the owner, roles.sql again (the producer's grants are on
    tables the migrations create), on a database of this run's own."""
    services = discover(rabbitmq=False)
    psql = _tool("psql")
    name = f"eo_lp_{RUN}".replace("-", "_")
    owner, app, producer = (f"eo_lp_{who}_{RUN}".replace("-", "_")
                            for who in ("owner", "app", "producer"))
    server = with_database(services.postgres_dsn, "postgres")
    database = with_database(services.postgres_dsn, name)
    asyncio.run(ensure_database(database))
    parts = urlsplit(database)

    def as_role(role: str, password: str) -> str:
        netloc = f"{role}:{password}@{parts.hostname}:{parts.port or 5432}"
        return urlunsplit(parts._replace(netloc=netloc))

    def roles_sql() -> None:
        done = subprocess.run(
            [psql, server, "-q", "-v", f"owner={owner}", "-v", "owner_password=owner-secret",
             "-v", f"app={app}", "-v", "app_password=app-secret", "-v", f"database={name}",
             "-v", f"producer={producer}", "-v", "producer_password=producer-secret",
             "-v", "gateways=front",
             "-f", str(ROOT / "deploy" / "postgres" / "roles.sql")],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    try:
        roles_sql()
        asyncio.run(upgrade_async(as_role(owner, "owner-secret")))
        roles_sql()
        yield Roles(as_role(owner, "owner-secret"), as_role(app, "app-secret"),
                    as_role(producer, "producer-secret"), producer)
    finally:
        asyncio.run(drop_database(database))

        async def drop_roles() -> None:
            conn = await asyncpg.connect(server)
            try:
                for role in (owner, app, producer):
                    await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
            finally:
                await conn.close()

        asyncio.run(drop_roles())
        services.close()


async def test_migrations_run_as_the_owner_and_the_service_has_no_ddl(roles: Roles) -> None:
    pool = await create_pool(roles.app)
    try:
        tokens = PostgresTokenStore(pool)  # the protocol's rows: read and written
        incoming = Envelope(uuid.uuid4(), "Add", b"{}")
        await tokens.create("counter", [incoming])
        store = PostgresTransactionalStore(pool, "counter", Tally, ManualClock(),
                                           holds_tokens=True)
        loaded = await store.load("c1", incoming.message_id)
        assert loaded.token_exists
        committed = await store.commit(CommitRequest("c1", loaded.tr.version, Tally(total=1),
                                                     incoming.message_id, uuid.uuid4()))
        assert await store.clear(Clear("c1", committed.version, committed.records, [],
                                 ManualClock().now(), consume=incoming.message_id))
        assert await tokens.count() == 0
        for ddl in ("CREATE TABLE eo_intruder (i int)", "DROP TABLE eo_token",
                    "TRUNCATE eo_transaction_record", "ALTER TABLE eo_token ADD COLUMN x int",
                    "CREATE SCHEMA intruder"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await pool.execute(ddl)
    finally:
        await pool.close()


async def test_nobody_rewrites_a_token_and_the_service_inserts_no_inbox_row(
    roles: Roles,
) -> None:
    """Issue 24: the application role could UPDATE a token's body (rewrite an in-flight
    message) and insert inbox rows for any endpoint."""
    for dsn in (roles.app, roles.owner):
        conn = await create_pool(dsn, max_size=1)
        try:
            message = uuid.uuid4()
            await PostgresTokenStore(conn).create("counter", [Envelope(message, "Add", b"{}")])
            for change in ("body = 'x'", "type = 'Spend'", """headers = '{"x": "1"}'""",
                           "endpoint = 'audit'", "message_id = gen_random_uuid()"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError, match="immutable"):
                    await conn.execute(f"UPDATE eo_token SET {change} WHERE message_id = $1",
                                       message)
            await conn.execute("DELETE FROM eo_token WHERE message_id = $1", message)
        finally:
            await conn.close()
    app = await create_pool(roles.app)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            await PostgresInbox(app, "front", ManualClock()).add(
                [Envelope(uuid.uuid4(), "Add", b"{}")])
    finally:
        await app.close()


async def test_the_producer_inserts_inbox_rows_of_its_gateways_and_nothing_else(
    roles: Roles,
) -> None:
    clock = ManualClock()
    producer = await create_pool(roles.producer)
    app = await create_pool(roles.app)
    try:
        command = Envelope(uuid.uuid4(), "Add", b'{"counter": "c1", "amount": 1}')
        assert await PostgresInbox(producer, "front", clock).add([command]) == 1
        async with producer.acquire() as conn:  # the bulk ingest: staging, then merge
            name = staging_name()
            await create_staging(conn, name)
            await conn.execute(f'INSERT INTO "{name}" VALUES ($1, $2, $3)',
                               str(uuid.uuid4()), "Add", b"{}")
            assert await merge_staging(conn, name, "front") == (1, 1)
        refused = [
            (PostgresInbox(producer, "counter", clock).add, [command]),  # not its gateway
        ]
        for add, rows in refused:
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
                await add(rows)
        for sql in ("INSERT INTO eo_inbox (endpoint, message_id, type, body, producer) "
                    "VALUES ('front', gen_random_uuid(), 'Add', '', 'someone-else')",
                    "SELECT body FROM eo_inbox", "SELECT count(*) FROM eo_token",
                    "DELETE FROM eo_inbox", "UPDATE eo_inbox SET relayed_at = now()",
                    "INSERT INTO eo_inbox_producer VALUES (current_user, 'counter')",
                    "CREATE TABLE public.eo_intruder (i int)"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await producer.execute(sql)
        # it reads the keys of its own rows only (a re-run checks them), none of the others'
        await app.execute("INSERT INTO eo_inbox_producer VALUES ('nobody-else', 'front')")
        assert await producer.fetchval("SELECT count(message_id) FROM eo_inbox") == 2
        inbox = PostgresInbox(app, "front", clock)  # the gateway relays them
        async with inbox.claim(10) as claim:
            assert {e.producer for e in claim.envelopes} == {roles.producer_role}
            assert len(claim.envelopes) == 2
            await claim.mark_relayed(claim.envelopes)
        clock.advance(timedelta(days=8))
        assert await inbox.purge_relayed(clock.now() - timedelta(days=7)) == 2
    finally:
        await producer.close()
        await app.close()
