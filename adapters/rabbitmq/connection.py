"""A robust RabbitMQ connection: one publisher-confirm channel, consuming channels, drop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import aio_pika
import pamqp.exceptions
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError, DeliveryError, PublishError
from yarl import URL

from application.errors import TransientError

log = logging.getLogger(__name__)

#: Driver errors that mean "the broker or the network failed, try again later". asyncio's
#: TimeoutError is the builtin one on 3.11 (an OSError); both are named for clarity.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    AMQPError, ChannelInvalidStateError, pamqp.exceptions.PAMQPException, ConnectionError,
    OSError, asyncio.TimeoutError,
)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise driver errors of the block as `TransientError("<what>: <error>")`."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise TransientError(f"{what}: {type(exc).__name__}: {exc}") from exc


def redacted(url: str) -> str:
    """`url` with its password replaced by `******`, safe to log."""
    parsed = URL(url)
    return str(parsed.with_password("******")) if parsed.password else url


class RabbitConnection:
    """One robust AMQP connection (reconnects by itself after a loss, restoring channels,
    queues and consumers) with one publisher-confirm channel shared by every publish.

    `reconnect_interval_s`: pause between reconnection attempts (seconds).
    `publish_timeout_s`: bound on one publish including its confirm, also while reconnecting.
    Methods raise `TransientError` when the broker is unreachable or the channel fails.
    """

    def __init__(self, url: str, reconnect_interval_s: float = 1.0,
                 publish_timeout_s: float = 10.0) -> None:
        self._url = url
        self._reconnect_interval_s = reconnect_interval_s
        self._publish_timeout_s = publish_timeout_s
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._publishing: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def __repr__(self) -> str:
        return f"RabbitConnection({redacted(self._url)!r})"

    async def start(self) -> None:
        """Connect and open the publishing channel (publisher confirms, and unroutable
        mandatory messages raise instead of being returned silently)."""
        with translated(f"connecting to {redacted(self._url)}"):
            self._connection = await aio_pika.connect_robust(
                self._url, reconnect_interval=self._reconnect_interval_s)
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True)
        log.info("connected to %s", redacted(self._url))

    @property
    def channel(self) -> AbstractRobustChannel:
        """The publishing channel (declare topology on it); RuntimeError before `start`."""
        if self._channel is None:
            raise RuntimeError("RabbitConnection.start() was not awaited")
        return self._channel

    async def publish(self, queue: str, message: aio_pika.Message) -> None:
        """Publish `message` on the default exchange to `queue` (mandatory) and wait for the
        publisher confirm. Raises `TransientError` on a nack, an unroutable message (no such
        queue), a timeout or a lost channel; the message may then have arrived or not."""
        channel = self.channel
        try:
            async with self._one_at_a_time(message.message_id), \
                    asyncio.timeout(self._publish_timeout_s):
                await channel.default_exchange.publish(message, routing_key=queue,
                                                       mandatory=True)
        except PublishError as exc:
            raise TransientError(f"publish to {queue!r}: unroutable (no such queue)") from exc
        except DeliveryError as exc:
            raise TransientError(f"publish to {queue!r}: nacked by the broker") from exc
        except DRIVER_ERRORS as exc:
            raise TransientError(f"publish to {queue!r}: {type(exc).__name__}: {exc}") from exc

    @asynccontextmanager
    async def _one_at_a_time(self, message_id: str | None) -> AsyncIterator[None]:
        # aiormq matches a returned (unroutable) message to its publish by message ID: two
        # publishes of one ID in flight at once (concurrent finishers re-dispatching) could
        # swap their outcomes and report an unroutable copy as confirmed.
        if message_id is None:  # aiormq gives the message a random ID
            yield
            return
        lock, users = self._publishing.setdefault(message_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._publishing[message_id]

    async def channel_for_consuming(self, prefetch: int) -> AbstractRobustChannel:
        """A new channel with at most `prefetch` unacked deliveries (restored with its qos and
        consumers after a reconnection). Closed by `close`."""
        if self._connection is None:
            raise RuntimeError("RabbitConnection.start() was not awaited")
        with translated("opening a consuming channel"):
            channel = await self._connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=prefetch)
        return channel

    async def close(self) -> None:
        """Close the connection and its channels; unacked deliveries return to their queues.
        Idempotent; errors of an already broken connection are logged, not raised."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is None:
            return
        try:
            await connection.close()
        except DRIVER_ERRORS as exc:
            log.warning("closing %s: %s", redacted(self._url), exc)

    async def drop(self) -> None:
        """Close the underlying AMQP connection as a network failure would (the `drop_conn`
        failpoint): the broker requeues unacked deliveries, settling them afterwards raises
        `TransientError`, and the robust connection reconnects after `reconnect_interval_s`."""
        transport = self._connection.transport if self._connection is not None else None
        if transport is None:
            return
        log.warning("dropping the connection to %s (failpoint)", redacted(self._url))
        try:
            await transport.connection.close(ConnectionError("dropped by the drop_conn failpoint"))
        except DRIVER_ERRORS as exc:
            log.warning("dropping %s: %s", redacted(self._url), exc)
