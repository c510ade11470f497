"""What a tool run (the bench, and the sample's demo and chaos campaign) creates for itself and
removes at its end: a database of a fresh name and, where this host administers the broker
(`rabbitmqctl`), a virtual host. It never drops, empties or deletes a database, queue or
virtual host it did not create."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

import aio_pika
import asyncpg
from aio_pika.exceptions import AMQPError

from adapters.postgres.admin import drop_database, quoted, with_database
from adapters.rabbitmq import topology
from entrypoints.settings import SettingsError


def rabbitmqctl(*args: str, timeout_s: float = 60.0) -> str:
    """Run `rabbitmqctl -q <args>` on this host; raises `subprocess.CalledProcessError` or
    `OSError` when it fails or is missing."""
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=True).stdout


def controllable(url: str) -> bool:
    """Whether this host can administer the broker of `url` (a local broker and
    `rabbitmqctl` on the PATH): needed for a virtual host of our own and broker-side
    connection closes."""
    return (urlsplit(url).hostname in ("127.0.0.1", "localhost")
            and shutil.which("rabbitmqctl") is not None)


def on_own_vhost(url: str, vhost: str) -> str:
    """`url` on virtual host `vhost`, created with every right given to the URL's user.
    Raises `OSError` / `subprocess.SubprocessError` when `rabbitmqctl` fails."""
    parts = urlsplit(url)
    if vhost not in rabbitmqctl("list_vhosts").split():
        rabbitmqctl("add_vhost", vhost)
    user = unquote(parts.username or "") or "guest"
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    return urlunsplit(parts._replace(path=f"/{vhost}"))


def vhost_of(url: str) -> str:
    """The virtual host named by `url` ("/" when none)."""
    return unquote(urlsplit(url).path.lstrip("/")) or "/"


async def present(url: str, endpoints: Sequence[str], retry_delays_s: Sequence[float]
                  ) -> list[str]:
    """Those of `endpoints`' queues (work, the retry queues of `retry_delays_s`, dead-letter
    queue) and inbound exchanges (`<endpoint>.in`) that exist on the virtual host of `url`,
    by passive declares (a missing one closes only its own channel). Raises aio_pika's
    connection errors."""
    found: list[str] = []
    connection = await aio_pika.connect(url)
    try:
        for endpoint in endpoints:
            names = topology.queue_names(endpoint, retry_delays_s)
            for name, kind in [*((q, "queue") for q in (names.work, *names.retries,
                                                        names.dead_letter)),
                               (names.inbound, "exchange")]:
                channel = await connection.channel()
                try:
                    if kind == "queue":
                        await channel.declare_queue(name, passive=True)
                    else:
                        await channel.declare_exchange(name, passive=True)
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    continue
                found.append(name)
                await channel.close()
    finally:
        await connection.close()
    return found


#: PostgreSQL keeps 63 bytes of a name; a fresh name adds up to 17 (`_<pid>_<8 hex>`).
MAX_PREFIX = 46


def fresh_name(prefix: str, separator: str = "_") -> str:
    """`<prefix><separator><pid><separator><8 hex digits>`: a name of this run's own (the
    pid tells runs on one machine apart, the random digits runs on machines sharing a
    server)."""
    return separator.join((prefix[:MAX_PREFIX], str(os.getpid()), secrets.token_hex(4)))


async def create_database(server_dsn: str, prefix: str) -> str:
    """Create a database of a fresh name (`fresh_name(prefix)`) on the server of
    `server_dsn` (connecting to its `postgres` database) and return its DSN. `CREATE
    DATABASE` fails on a name that exists, so the database is never someone else's. Raises
    asyncpg's errors (e.g. the role may not create databases) and OSError."""
    name = fresh_name(prefix)
    admin = await asyncpg.connect(with_database(server_dsn, "postgres"))
    try:
        await admin.execute(f"CREATE DATABASE {quoted(name)}")
    finally:
        await admin.close()
    return with_database(server_dsn, name)


@asynccontextmanager
async def own_database(server_dsn: str, prefix: str, keep: bool = False
                       ) -> AsyncIterator[str]:
    """The DSN of a database created for the block (`create_database`) and dropped after it,
    also when the block fails (unless `keep`: then it outlives the run, for a look or an
    audit). The database `server_dsn` names is only where the server is: never touched."""
    dsn = await create_database(server_dsn, prefix)
    try:
        yield dsn
    except BaseException:
        if not keep:  # the block's error is the news, not a failed clean-up
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await drop_database(dsn)
        raise
    if not keep:
        await drop_database(dsn)


@dataclass(frozen=True)
class RunBroker:
    """Where a run's queues are: `url`, on `vhost` when the run made that virtual host (None:
    the URL's own, shared, where the run found none of its queues)."""

    url: str
    vhost: str | None


async def _made_vhost(url: str, prefix: str) -> RunBroker | None:
    """`url` on a virtual host of a fresh name made with rabbitmqctl, or None when this host
    cannot administer the broker. Cancelled while rabbitmqctl makes it, it waits for it
    and deletes it before it raises CancelledError (a thread cannot be stopped)."""
    if not controllable(url):
        return None
    vhost = fresh_name(prefix, "-")
    making = asyncio.ensure_future(asyncio.to_thread(on_own_vhost, url, vhost))
    try:
        return RunBroker(await asyncio.shield(making), vhost)
    except asyncio.CancelledError:  # a SIGTERM or Ctrl-C: its thread makes it all the same
        with contextlib.suppress(Exception):
            await making
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            await asyncio.to_thread(rabbitmqctl, "delete_vhost", vhost)
        raise
    except (OSError, subprocess.SubprocessError):
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # half made
            await asyncio.to_thread(rabbitmqctl, "delete_vhost", vhost)
        return None


@asynccontextmanager
async def own_vhost(url: str, prefix: str, endpoints: Sequence[str],
                    retry_delays_s: Sequence[float], command: str) -> AsyncIterator[RunBroker]:
    """Where `command`'s run declares the queues of `endpoints` (work, the retry queues of
    `retry_delays_s`, dead-letter queue; a gateway's inbound exchange), for the block:

    - where this host administers the broker (`controllable`: local, with rabbitmqctl), a
      virtual host of a fresh name (`fresh_name(prefix, "-")`) with every right for the URL's
      user, deleted with all it holds after the block;
    - elsewhere, the URL's own virtual host, provided it holds none of those queues and
      exchanges: the run declares them, so they are its own, and deletes them after the
      block.

    Raises `SettingsError` naming `EO_AMQP_URL` when the URL's virtual host holds one of them
    (the run would consume, then delete, someone else's queue), aio_pika's connection errors
    when the broker does not answer."""
    made = await _made_vhost(url, prefix)
    if made is None:
        found = await present(url, endpoints, retry_delays_s)
        if found:
            raise SettingsError(
                f"invalid setting EO_AMQP_URL: `{command}` cannot make a virtual host of its "
                "own (the broker is not on this host, or rabbitmqctl is missing or refused), "
                f"and virtual host {vhost_of(url)!r} holds {', '.join(sorted(found)[:5])} "
                "already, which the run would delete at its end: point EO_AMQP_URL at a "
                "virtual host without them, or run it on the broker's host")
    try:
        yield made or RunBroker(url, None)
    except BaseException:
        with contextlib.suppress(OSError, AMQPError):  # the block's error is the news
            await _remove(made, url, endpoints, retry_delays_s)
        raise
    await _remove(made, url, endpoints, retry_delays_s)


async def _remove(made: RunBroker | None, url: str, endpoints: Sequence[str],
                  retry_delays_s: Sequence[float]) -> None:
    """Delete what `own_vhost` gave its block: the virtual host it made, else the
    endpoints' queues the run declared on the URL's own."""
    if made is not None and made.vhost is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            await asyncio.to_thread(rabbitmqctl, "delete_vhost", made.vhost)
    elif endpoints:
        await topology.delete_queues(url, endpoints, retry_delays_s)
