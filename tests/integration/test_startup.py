"""Start-up of `eo consume` and `eo serve` as real processes while a server is briefly away
(issue 24): they wait, as a running consumer does, up to `EO_BROKER_GIVE_UP_S`.

A server is made "away" without touching the shared ones: the process reaches it through a
TCP proxy of the test's own (`Proxy`, on a free port) that refuses connections until the test
opens it, or that answers a given AMQP method with the broker's `Connection.Close`
(320, CONNECTION_FORCED) the first times it passes (the close of issue 24 came while a
channel opened). Asserted: the process logs each wait (`startup.waiting`, naming what it
waits for and the error), becomes ready and processes a message once the server is back; it
exits 69 when the server stays away for `EO_BROKER_GIVE_UP_S`; and what waiting cannot fix
(a missing database, a missing or outdated schema, refused credentials, a queue declared
with other arguments) exits 3 at once. In the test's process, `preflight` accepts a schema
newer than the code's (a rolling upgrade) and migrates first with `EO_MIGRATE_ON_START`.

The processes run the counters service on a database and a RabbitMQ virtual host of this
module's own (tests/support/processes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pamqp.commands
import pamqp.frame
import pytest

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.migrate import head_revision, upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from entrypoints.settings import load_settings
from entrypoints.startup import preflight
from tests.support.counters.endpoints import Add, Tally
from tests.support.processes import (
    DELAYS,
    DELIVERY_LIMIT,
    Fleet,
    Proc,
    Rabbit,
    Where,
    fresh_fleet,
    publisher,
    states,
    this_run,
    until,
    where_for,
)

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DATABASE = "eo_it_startup"
VHOST = "eo-it-startup"
BANK_TOKEN = "startup-bank-token"
#: AMQP methods (class ID, method ID) a `Proxy` can answer with a forced close.
CHANNEL_OPEN = (20, 10)
BASIC_QOS = (60, 10)  # only a consuming channel sets its prefetch: `RabbitSource.start`
#: Exit statuses of `eo consume` / `eo serve` (docs/operations.md).
CANNOT_START, UNAVAILABLE = 3, 69


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for(DATABASE, VHOST) as found:
        yield found


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_fleet(where, tmp_path) as started:
        yield started


@pytest.fixture
async def rabbit(where: Where) -> AsyncIterator[Rabbit]:
    async with publisher(where) as connected:
        yield connected


# ---------------------------------------------------------------------------------------------
# a server briefly away: a proxy of the test's own


class Proxy:
    """A TCP proxy on 127.0.0.1 to `upstream` (a URL's host and port). Its port is bound at
    `start` but listens only from `open`: until then a connection is refused, as by a server
    that is down. With `forced` = (class ID, method ID) of an AMQP method, the first
    `force_n` times a client sends that method the proxy drops it and answers with the
    broker's `Connection.Close` (320 CONNECTION_FORCED), then closes both sockets: a
    broker-side close at that very moment (the method never reaches the broker). The
    connections numbered in `drop` (1 is the first) are closed as soon as they come: a
    server that drops them."""

    def __init__(self, upstream: str, forced: tuple[int, int] | None = None,
                 force_n: int = 0, drop: frozenset[int] = frozenset()) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 0
        self.forced, self.force_n, self.drop = forced, force_n, drop
        self.forced_closes = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Bind a free port, not listening yet (connections refused); returns it."""
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0,
                                                  start_serving=False)
        return int(self._server.sockets[0].getsockname()[1])

    async def open(self) -> None:
        """Accept connections from now on."""
        assert self._server is not None
        await self._server.start_serving()

    async def close(self) -> None:
        """Stop listening and cut every connection through the proxy."""
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.connections in self.drop:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        outbound = (self._amqp(reader, up_writer, writer) if self.forced is not None
                    else self._pipe(reader, up_writer))
        try:
            await asyncio.gather(outbound, self._pipe(up_reader, writer))
        finally:
            writer.close()
            up_writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _amqp(self, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter,
                    client: asyncio.StreamWriter) -> None:
        """Client to broker, frame by frame (after the 8-byte protocol header)."""
        try:
            upstream.write(await reader.readexactly(8))
            while True:
                header = await reader.readexactly(7)
                kind, _channel, size = struct.unpack(">BHI", header)
                rest = await reader.readexactly(size + 1)  # payload and frame end
                if (kind == 1 and struct.unpack(">HH", rest[:4]) == self.forced
                        and self.forced_closes < self.force_n):
                    self.forced_closes += 1
                    client.write(pamqp.frame.marshal(pamqp.commands.Connection.Close(
                        320, "CONNECTION_FORCED - closed by the test's proxy", 0, 0), 0))
                    await client.drain()
                    await asyncio.sleep(0.2)  # let the client read it before the socket goes
                    return
                upstream.write(header + rest)
                await upstream.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            upstream.close()
            client.close()


@contextlib.asynccontextmanager
async def proxy_to(url: str, forced: tuple[int, int] | None = None, force_n: int = 0,
                   drop: frozenset[int] = frozenset(), opened: bool = False,
                   ) -> AsyncIterator[tuple[Proxy, str]]:
    """A `Proxy` to the server of `url` and `url` through it (open from the start when
    `opened`); closed on exit."""
    proxy = Proxy(url, forced, force_n, drop)
    port = await proxy.start()
    parts = urlsplit(url)
    netloc = f"{parts.netloc.rsplit('@', 1)[0]}@" if "@" in parts.netloc else ""
    if opened:
        await proxy.open()
    try:
        yield proxy, urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{port}"))
    finally:
        await proxy.close()


# ---------------------------------------------------------------------------------------------
# helpers


def said(proc: Proc) -> str:
    """What `proc` wrote, its whitespace runs made single spaces (the CLI's closing message
    is wrapped to the terminal's width)."""
    return " ".join(proc.text().split())


def waits(proc: Proc, what: str) -> list[dict[str, object]]:
    """The `startup.waiting` lines of `proc` whose `waiting_for` names `what`."""
    return [e for e in proc.events("startup.waiting") if what in str(e.get("waiting_for"))]


async def logged_waiting(proc: Proc, what: str, timeout_s: float = 20.0) -> None:
    """Wait until `proc` logged that it waits for `what`; fail when it exits first."""
    deadline = time.monotonic() + timeout_s
    while not waits(proc, what):
        if not proc.alive():
            pytest.fail(f"{proc.name} exited with {proc.popen.returncode} instead of waiting "
                        f"for {what}\n{proc.tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{proc.name} logged no wait for {what} in {timeout_s} s\n{proc.tail()}")
        await asyncio.sleep(0.1)


async def add_is_processed(where: Where, rabbit: Rabbit, fleet: Fleet, amount: int) -> None:
    """Publish `Add("c", amount)` to `counter` (with its token) and wait until the counter's
    total shows it."""
    envelope = Envelope(uuid.uuid4(), "Add", encode(Add("c", amount)),
                        MappingProxyType({TOKEN_HEADER: "1"}))
    pool = await create_pool(where.dsn, max_size=1)
    try:
        await PostgresTokenStore(pool).create("counter", [envelope])
        await rabbit.publish("counter", envelope.body, str(envelope.message_id), "Add",
                             {TOKEN_HEADER: "1"})

        async def applied() -> bool:
            tally = (await states(pool, "counter", Tally)).get("c")
            return tally is not None and tally.total == amount

        await until(applied, 20, f"Add(c, {amount}) applied", fleet, rabbit)
    finally:
        await pool.close()


# ---------------------------------------------------------------------------------------------
# briefly away: the process waits, then starts


async def test_a_consumer_waits_for_the_database_and_the_broker_then_starts(
    fleet: Fleet, rabbit: Rabbit, where: Where,
) -> None:
    async with (proxy_to(where.dsn) as (database, dsn),
                proxy_to(where.amqp_url) as (broker, amqp_url)):
        counter = fleet.start("counter", EO_DATABASE_DSN=dsn, EO_AMQP_URL=amqp_url,
                              EO_BROKER_GIVE_UP_S="60")
        await logged_waiting(counter, "PostgreSQL")
        await asyncio.sleep(1.0)  # a few retries while it stays away
        await database.open()
        await logged_waiting(counter, "RabbitMQ")
        await broker.open()
        await fleet.ready(counter)
        await add_is_processed(where, rabbit, fleet, 4)
    [wait, *_] = waits(counter, "PostgreSQL")
    assert "ConnectionRefusedError" in str(wait["error"]) or "Connect call failed" in str(
        wait["error"]), wait
    assert wait["level"] == "warning"
    assert {"waited_s", "retry_in_s", "gives_up_in_s"} <= set(wait), wait


@pytest.mark.parametrize(("forced", "what"), [
    (CHANNEL_OPEN, "the PostgreSQL pools and the RabbitMQ connection"),
    (BASIC_QOS, "RabbitMQ: a consumer on 'counter'"),
], ids=["channel_open", "basic_qos"])
async def test_a_consumer_starts_through_broker_side_closes(
    fleet: Fleet, rabbit: Rabbit, where: Where, forced: tuple[int, int], what: str,
) -> None:
    """The broker closes the connection (CONNECTION_FORCED) as the process opens its
    publishing channel (`channel_open`, its first channel), or its consuming channel
    (`basic_qos`: the moment of issue 24), twice: it starts anyway."""
    async with proxy_to(where.amqp_url, forced, force_n=2, opened=True) as (broker, amqp_url):
        counter = fleet.start("counter", EO_AMQP_URL=amqp_url, EO_BROKER_GIVE_UP_S="60")
        await fleet.ready(counter)
        assert broker.forced_closes == 2
        await add_is_processed(where, rabbit, fleet, 8)
    closes = waits(counter, what)
    assert len(closes) == 2, counter.tail()
    assert all("CONNECTION_FORCED" in str(e["error"]) for e in closes), closes


async def test_a_consumer_starts_when_the_database_drops_its_pool_connection(
    fleet: Fleet, rabbit: Rabbit, where: Where,
) -> None:
    """The database answers the first look (`preflight`, connection 1) and drops the next
    connection, the pool's first: the pools are made again."""
    async with proxy_to(where.dsn, drop=frozenset({2}), opened=True) as (database, dsn):
        counter = fleet.start("counter", EO_DATABASE_DSN=dsn, EO_BROKER_GIVE_UP_S="60")
        await fleet.ready(counter)
        await add_is_processed(where, rabbit, fleet, 16)
    assert database.connections > 2
    [wait] = waits(counter, "PostgreSQL pools")
    assert "PostgreSQL" in str(wait["error"]), wait


async def test_a_callee_waits_for_its_database_then_serves(fleet: Fleet, where: Where) -> None:
    async with proxy_to(where.dsn) as (database, dsn):
        bank = fleet.serve("bank", BANK_TOKEN, EO_DATABASE_DSN=dsn, EO_BROKER_GIVE_UP_S="60")
        await logged_waiting(bank, "PostgreSQL")
        await database.open()
        await fleet.ready(bank)


# ---------------------------------------------------------------------------------------------
# away for good: 69 after EO_BROKER_GIVE_UP_S


@pytest.mark.parametrize(("away", "what"), [
    ("database", "PostgreSQL"), ("broker", "RabbitMQ"),
    ("consumer", "RabbitMQ: a consumer on 'counter'"),  # every consuming channel closed
])
async def test_a_server_away_longer_than_the_give_up_time_exits_69(
    fleet: Fleet, where: Where, away: str, what: str,
) -> None:
    url = where.dsn if away == "database" else where.amqp_url
    forced, force_n = (BASIC_QOS, 1000) if away == "consumer" else (None, 0)
    async with proxy_to(url, forced, force_n, opened=away == "consumer") as (_, proxied):
        variable = "EO_DATABASE_DSN" if away == "database" else "EO_AMQP_URL"
        started = time.monotonic()
        # the give-up time counts from the process's start: on a machine running two suites
        # at once, 2 s went by before the consumer's stage began (it gave up "after 0 s",
        # never having waited); 6 s leaves that stage seconds to wait in, loaded or not
        counter = fleet.start("counter", **{variable: proxied}, EO_BROKER_GIVE_UP_S="6")
        code = await fleet.exit_code(counter, 40)
        took = time.monotonic() - started
    assert code == UNAVAILABLE, f"{code} after {took:.1f} s\n{counter.tail()}"
    assert len(waits(counter, what)) >= 2, counter.tail()
    assert "gave up waiting" in said(counter), counter.tail()


# ---------------------------------------------------------------------------------------------
# what waiting cannot fix: 3 at once


@contextlib.contextmanager
def scratch_database(where: Where, label: str) -> Iterator[str]:
    """The DSN of a database of this test's own (not created here), dropped on exit."""
    dsn = with_database(where.dsn, this_run(f"eo_it_startup_{label}"))
    asyncio.run(drop_database(dsn))
    try:
        yield dsn
    finally:
        asyncio.run(drop_database(dsn))


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(
        netloc=f"{parts.username or 'guest'}:{password}@{parts.netloc.rsplit('@', 1)[-1]}"))


def _with_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rsplit('@', 1)[-1]}"))


async def _declare_counter_with_another_delivery_limit(where: Where) -> None:
    await topology.delete_queues(where.amqp_url, ["counter"], DELAYS)
    async with publisher(where) as rabbit:
        await topology.declare(rabbit, "counter", DELAYS, DELIVERY_LIMIT + 1)


@pytest.mark.parametrize("case", ["missing_database", "no_schema", "old_schema",
                                  "refused_password", "unknown_role", "queue_arguments"])
def test_what_waiting_cannot_fix_exits_3_at_once(
    where: Where, tmp_path: Path, case: str,
) -> None:
    fleet = Fleet(where, tmp_path, tmp_path)
    with scratch_database(where, case) as scratch, contextlib.ExitStack() as cleanup:
        env: dict[str, str] = {}
        expected = "run `eo migrate`"
        if case == "missing_database":
            env["EO_DATABASE_DSN"] = scratch
        elif case in ("no_schema", "old_schema"):
            asyncio.run(ensure_database(scratch))
            if case == "old_schema":
                asyncio.run(upgrade_async(scratch, "0001"))
                expected = "revision 0001"
            env["EO_DATABASE_DSN"] = scratch
        elif case == "refused_password":
            env["EO_AMQP_URL"] = _with_password(where.amqp_url, "not-the-password")
            expected = "ACCESS_REFUSED"
        elif case == "queue_arguments":  # the settings' delivery limit is not the queue's
            asyncio.run(_declare_counter_with_another_delivery_limit(where))
            cleanup.callback(lambda: asyncio.run(topology.delete_queues(
                where.amqp_url, ["counter"], DELAYS)))
            expected = "PRECONDITION_FAILED"
        else:
            env["EO_DATABASE_DSN"] = _with_user(where.dsn, "eo_it_no_such_role")
            expected = "eo_it_no_such_role"
        started = time.monotonic()
        try:
            counter = fleet.start("counter", EO_BROKER_GIVE_UP_S="60", **env)
            code = counter.popen.wait(timeout=30)
        finally:
            fleet.kill_all()
        took = time.monotonic() - started
    # at once: without waiting for what no wait fixes (no `startup.waiting`), whatever the
    # machine's load makes of the seconds (the wait above bounds a hang)
    assert code == CANNOT_START, f"{code} after {took:.1f} s\n{counter.tail()}"
    assert expected in said(counter), counter.tail()
    assert not counter.events("startup.waiting"), counter.tail()


async def test_a_schema_newer_than_the_code_is_accepted(where: Where) -> None:
    """A rolling upgrade migrates first: the older processes still start on the newer
    schema (a revision they do not know)."""
    dsn = with_database(where.dsn, this_run("eo_it_startup_newer"))
    await drop_database(dsn)
    await ensure_database(dsn)
    try:
        await upgrade_async(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("UPDATE eo_schema_version SET version_num = 'from_the_future'")
        finally:
            await conn.close()
        settings = load_settings(profile="local", database_dsn=dsn, amqp_url=where.amqp_url)
        await preflight(settings)
    finally:
        await drop_database(dsn)


async def test_with_migrate_on_start_an_empty_database_is_migrated_before_the_check(
    where: Where,
) -> None:
    dsn = with_database(where.dsn, this_run("eo_it_startup_on_start"))
    await drop_database(dsn)
    await ensure_database(dsn)
    try:
        settings = load_settings(profile="local", database_dsn=dsn, amqp_url=where.amqp_url,
                                 migrate_on_start=True)
        await preflight(settings)
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT version_num FROM eo_schema_version") \
                == head_revision()
        finally:
            await conn.close()
    finally:
        await drop_database(dsn)
