"""A user's database and RabbitMQ virtual host, for the tests that a tool (the demo, the chaos
campaign, the bench) leaves what it did not create alone (issue 24)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from adapters.postgres.admin import drop_database, quoted, with_database

MARKER = "the user's row"
MESSAGE = b"the user's message"


@asynccontextmanager
async def users_database(server_dsn: str, name: str) -> AsyncIterator[str]:
    """A database `name` on the server of `server_dsn` holding one table, `user_marker`, with
    one row (`MARKER`); dropped afterwards. Yields its DSN."""
    dsn = with_database(server_dsn, name)
    await drop_database(dsn)  # a previous run's, killed before its clean-up
    admin = await asyncpg.connect(with_database(server_dsn, "postgres"))
    try:
        await admin.execute(f"CREATE DATABASE {quoted(name)}")
    finally:
        await admin.close()
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE user_marker (note text)")
            await conn.execute("INSERT INTO user_marker VALUES ($1)", MARKER)
        finally:
            await conn.close()
        yield dsn
    finally:
        await drop_database(dsn)


async def untouched_database(dsn: str) -> tuple[list[str], list[str]]:
    """(the tables of the database at `dsn`, the rows of `user_marker`): `(["user_marker"],
    [MARKER])` for a database no tool touched."""
    conn = await asyncpg.connect(dsn)
    try:
        tables = [r[0] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")]
        rows = ([r[0] for r in await conn.fetch("SELECT note FROM user_marker")]
                if "user_marker" in tables else [])
    finally:
        await conn.close()
    return tables, rows


async def databases_like(server_dsn: str, prefix: str) -> list[str]:
    """The databases on the server of `server_dsn` whose names start with `prefix` + `_`."""
    admin = await asyncpg.connect(with_database(server_dsn, "postgres"))
    try:
        rows = await admin.fetch("SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
                                 f"{prefix}_")
    finally:
        await admin.close()
    return [r[0] for r in rows]


def _rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          timeout=60, check=True).stdout


def vhosts() -> list[str]:
    """The broker's virtual hosts (through rabbitmqctl)."""
    return _rabbitmqctl("list_vhosts").split()


@asynccontextmanager
async def users_vhost(amqp_url: str, name: str, queue: str) -> AsyncIterator[str]:
    """A virtual host `name` on the local broker of `amqp_url` (guest's rights) holding the
    durable queue `queue` with one message (`MESSAGE`); deleted afterwards. Yields its URL.
    Skips the test when this host cannot administer the broker (rabbitmqctl)."""
    parts = urlsplit(amqp_url)
    if parts.hostname not in ("127.0.0.1", "localhost") or shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl on the broker's host")
    with contextlib.suppress(subprocess.CalledProcessError):
        _rabbitmqctl("delete_vhost", name)  # a previous run's, killed before its clean-up
    _rabbitmqctl("add_vhost", name)
    try:
        _rabbitmqctl("set_permissions", "-p", name, parts.username or "guest", ".*", ".*", ".*")
        url = urlunsplit(parts._replace(path=f"/{name}"))
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            await channel.declare_queue(queue, durable=True)
            await channel.default_exchange.publish(aio_pika.Message(MESSAGE), routing_key=queue)
        finally:
            await connection.close()
        yield url
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _rabbitmqctl("delete_vhost", name)


async def queued(url: str, queue: str) -> int | None:
    """Messages ready in `queue` on the virtual host of `url` (None: no such queue)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return None
        return declared.declaration_result.message_count
    finally:
        await connection.close()
