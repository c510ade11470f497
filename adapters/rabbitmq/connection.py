"""A RabbitMQ connection the service supervises: reconnection (with the back-off of
adapters/rabbitmq/backoff.py), one publisher-confirm channel, and a give-up deadline after
which the process should exit. Which driver errors are transient: adapters/rabbitmq/errors.py.

aio-pika's robust connection restores channels and consumers by itself, but a connection can
come back while a consumer does not (aio-pika issues #231, #563, #577, #668; reproduced here
by deleting and re-declaring a work queue under its consumers). So this connection is a plain
one, and recovery is the project's: `RabbitConnection` reconnects and reopens its publishing
channel; each consuming channel belongs to a `RabbitSource`, which re-creates its channel and
consumer itself (adapters/rabbitmq/consumer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from adapters.rabbitmq.backoff import RECONNECT_DELAYS_S, reconnecting
from adapters.rabbitmq.errors import (
    DRIVER_ERRORS,
    alive,
    closed_while_opening,
    translated,
)
from adapters.rabbitmq.passive import PassiveDeclares
from adapters.rabbitmq.publishing import ConfirmedPublisher
from adapters.rabbitmq.urls import first_answering, redacted
from application.errors import TransientError

log = logging.getLogger(__name__)

#: Bound on opening a connection or a channel (seconds): an open on a connection that is
#: closing under our feet must not wait forever.
OPEN_TIMEOUT_S = 10.0


async def _open_channel(connection: AbstractConnection, **options: Any) -> AbstractChannel:
    """A channel on `connection` with aio-pika's `options`, opened within `OPEN_TIMEOUT_S`
    seconds. Raises `ClosedWhileOpening` when the connection closed meanwhile (aiormq says
    so with a plain `RuntimeError`), `DRIVER_ERRORS` otherwise; a `RuntimeError` on a
    connection still open is a bug and propagates as it is."""
    with closed_while_opening(connection):
        async with asyncio.timeout(OPEN_TIMEOUT_S):
            return await connection.channel(**options)


class RabbitConnection(PassiveDeclares):
    """One AMQP connection with one publisher-confirm channel, supervised: when the broker or
    the network closes the connection (or the publishing channel), a background task
    reconnects with backoff (`reconnect_delays_s`) and reopens the channel. If that does not
    succeed within `give_up_after_s` seconds, `failed` is set and `failure` says why: the
    process should exit (`BrokerUnavailable`).

    - `publish_timeout_s`: bound on one publish including its confirm, also while
      reconnecting (the publish waits for the connection that long);
    - `name`: the connection name the broker shows (`rabbitmqctl list_connections
      client_properties`), e.g. "eo orders pid 4242";
    - `url`: one broker URL, or the URLs of a cluster's nodes (`broker_urls`): the first
      connection tries them in order, a reconnection starts from the node after the one
      lost, and `url` is the node connected to last.

    Methods raise `TransientError` when the broker is unreachable or the channel fails.
    """

    def __init__(self, url: str | Sequence[str], publish_timeout_s: float = 10.0,
                 give_up_after_s: float = 120.0,
                 reconnect_delays_s: Sequence[float] = RECONNECT_DELAYS_S,
                 name: str | None = None) -> None:
        if give_up_after_s <= 0 or not reconnect_delays_s:
            raise ValueError("give_up_after_s must be > 0 and reconnect_delays_s non-empty")
        self._urls = [url] if isinstance(url, str) else list(url)
        if not self._urls:
            raise ValueError("no broker URL")
        self._url = self._urls[0]
        self.publish_timeout_s = publish_timeout_s
        self.give_up_after_s = give_up_after_s
        self.reconnect_delays_s = tuple(reconnect_delays_s)
        self.name = name or f"eo pid {os.getpid()}"
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._up = asyncio.Event()
        self._trouble = asyncio.Event()
        #: set when reconnection gave up; `failure` holds the reason
        self.failed = asyncio.Event()
        self.failure: str | None = None
        #: successful reconnections since `start`
        self.reconnections = 0
        self._closing = False
        self._supervisor: asyncio.Task[None] | None = None
        #: publishes on the publishing channel of the moment
        self.publisher = ConfirmedPublisher(lambda: self.channel, self._up, publish_timeout_s)
        #: publish a message to a queue and wait for its confirm, waiting for a reconnection
        #: first if need be, within `publish_timeout_s` (`ConfirmedPublisher.publish`: its
        #: errors); the publisher's own method, so a publish awaits through no extra frame
        self.publish: Callable[[str, aio_pika.Message], Awaitable[None]] = \
            self.publisher.publish

    def __repr__(self) -> str:
        return f"RabbitConnection({redacted(self._url)!r})"

    @property
    def url(self) -> str:
        """The broker URL (with its password: never log it, see `redacted`)."""
        return self._url

    async def start(self) -> None:
        """Connect, open the publishing channel (publisher confirms; an unroutable mandatory
        message raises instead of being returned silently) and start supervising. Raises
        `TransientError` when the first connection fails."""
        with translated(f"connecting to {', '.join(redacted(u) for u in self._urls)}"):
            await self._connect()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"{self.name} supervisor")
        log.info("connected to %s", redacted(self._url))

    async def _connect(self, after_loss: bool = False) -> None:
        """Connect to the first node that answers, from the current one (`after_loss`: from
        the next one, as the current one was just lost); raises the last node's error."""
        at = self._urls.index(self._url) + (1 if after_loss else 0)
        at %= len(self._urls)
        self._url = await first_answering(self._urls[at:] + self._urls[:at], self._connect_to,
                                          DRIVER_ERRORS, self._unanswered)

    def _unanswered(self, url: str, exc: BaseException) -> None:
        if len(self._urls) > 1:
            log.warning("cannot connect to %s: %s: %s", redacted(url), type(exc).__name__, exc)

    async def _connect_to(self, url: str) -> None:
        connection = await aio_pika.connect(
            url, timeout=OPEN_TIMEOUT_S, client_properties={"connection_name": self.name})
        try:
            channel = await _open_channel(connection, publisher_confirms=True,
                                          on_return_raises=True)
        except BaseException:
            with contextlib.suppress(*DRIVER_ERRORS):
                await connection.close()
            raise
        self._connection, self._channel = connection, channel
        connection.close_callbacks.add(self._on_close)
        channel.close_callbacks.add(self._on_close)
        self._up.set()

    def _on_close(self, sender: Any, exc: BaseException | None = None) -> None:
        if self._closing:
            return
        if sender is not self._connection and sender is not self._channel:
            return  # a connection or channel this one replaced already
        self._up.clear()
        self._trouble.set()

    async def _supervise(self) -> None:
        while not self._closing:
            await self._trouble.wait()
            self._trouble.clear()
            if self._closing:
                return
            await self._recover()

    async def _recover(self) -> None:
        await asyncio.sleep(0)  # let the close callbacks of the whole connection run first
        loop = asyncio.get_running_loop()
        started = loop.time()
        log.warning("connection to %s (or its publishing channel) lost: recovering",
                    redacted(self._url))
        try:
            await reconnecting(self._reopen, started + self.give_up_after_s,
                          self.reconnect_delays_s, DRIVER_ERRORS)
        except DRIVER_ERRORS as exc:
            self._give_up(f"the broker at {redacted(self._url)} stayed unreachable for "
                          f"{loop.time() - started:.0f} s: {type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # a bug, not the broker: no wait fixes it
            log.exception("recovering the connection to %s", redacted(self._url))
            self._give_up(f"recovering the connection to {redacted(self._url)} failed: "
                          f"{type(exc).__name__}: {exc}")
            return
        self.reconnections += 1
        log.warning("recovered the connection to %s after %.1f s", redacted(self._url),
                    loop.time() - started)

    def _give_up(self, failure: str) -> None:
        self.failure = failure
        log.error("%s", failure)
        self.failed.set()

    async def _reopen(self) -> None:
        connection = self._connection
        if not alive(connection):
            await self._connect(after_loss=True)
            return
        # only the publishing channel went (a channel-level error): reopen it, the consuming
        # channels on this connection are unaffected
        channel = await _open_channel(connection,  # type: ignore[arg-type]
                                      publisher_confirms=True, on_return_raises=True)
        self._channel = channel
        channel.close_callbacks.add(self._on_close)
        self._up.set()

    @property
    def connected(self) -> bool:
        """Whether the connection and its publishing channel are open now."""
        return (self._up.is_set() and self._channel is not None
                and not self._channel.is_closed)

    async def wait_connected(self, timeout_s: float) -> bool:
        """Wait until connected, at most `timeout_s` seconds; False when still down (or the
        supervisor gave up)."""
        if self.connected:
            return True
        waiter = asyncio.ensure_future(self._up.wait())
        failed = asyncio.ensure_future(self.failed.wait())
        try:
            await asyncio.wait({waiter, failed}, timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            failed.cancel()
        return self.connected

    @property
    def channel(self) -> AbstractChannel:
        """The publishing channel now (declare topology on it); RuntimeError before `start`.
        After a reconnection it is a new channel: ask again rather than keep it."""
        if self._channel is None:
            raise RuntimeError("RabbitConnection.start() was not awaited")
        return self._channel

    async def open_channel(self, prefetch: int | None = None) -> AbstractChannel:
        """A new plain channel on the current connection (no publisher confirms), with at most
        `prefetch` unacked deliveries when given. Its owner watches and re-creates it: it is
        not restored after a reconnection. Raises `TransientError` while disconnected."""
        connection = self._connection
        if not alive(connection) or not self._up.is_set():
            raise TransientError(f"not connected to {redacted(self._url)}")
        with translated("opening a channel"):
            channel = await _open_channel(connection,  # type: ignore[arg-type]
                                          publisher_confirms=False)
            if prefetch is not None:
                async with asyncio.timeout(OPEN_TIMEOUT_S):
                    await channel.set_qos(prefetch_count=prefetch)
        return channel

    async def close(self) -> None:
        """Stop supervising and close the connection and its channels; unacked deliveries
        return to their queues. Idempotent; errors of a broken connection are logged."""
        self._closing = True
        self._trouble.set()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        connection, self._connection, self._channel = self._connection, None, None
        self._up.clear()
        if connection is None:
            return
        try:
            await connection.close()
        except DRIVER_ERRORS as exc:
            log.warning("closing %s: %s", redacted(self._url), exc)

    async def drop(self) -> None:
        """Close the underlying AMQP connection as a network failure would (the `drop_conn`
        failpoint): the broker requeues unacked deliveries, settling them afterwards raises
        `TransientError`, and the supervisor reconnects."""
        connection = self._connection
        transport = getattr(connection, "transport", None) if connection is not None else None
        if transport is None:
            return
        log.warning("dropping the connection to %s (failpoint)", redacted(self._url))
        try:
            await transport.connection.close(ConnectionError("dropped by the drop_conn failpoint"))
        except DRIVER_ERRORS as exc:
            log.warning("dropping %s: %s", redacted(self._url), exc)
