"""Manual-ack consumption of an endpoint's work queue: `RabbitSource` and `RabbitDelivery`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from aio_pika.exceptions import ChannelInvalidStateError

from adapters.rabbitmq.connection import DRIVER_ERRORS, RabbitConnection, translated
from adapters.rabbitmq.dispatcher import (
    NO_MESSAGE_ID_HEADER,
    amqp_message,
    attempt_of,
    envelope_message,
    envelope_of,
    text_headers,
)
from adapters.rabbitmq.topology import queue_names, retry_index
from application.envelope import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    REASON_HEADER,
    RETRY_REASON_HEADER,
    Envelope,
)
from application.errors import MalformedMessage, TransientError
from application.observability import MESSAGE_DEAD_LETTERED
from application.ports import Delivery, EventSink

log = logging.getLogger(__name__)

class RabbitDelivery(Delivery):
    """One unacked delivery of the work queue. Retry and dead-letter publish a copy, wait for
    its publisher confirm, THEN ack the original: a crash in between leaves two copies (the
    protocol drops one), the reverse order could lose the message. Settling twice is a
    no-op; `TransientError` when the broker fails (a lost channel: the broker redelivers)."""

    def __init__(self, message: AbstractIncomingMessage, envelope: Envelope, attempt: int,
                 source: RabbitSource) -> None:
        self.envelope = envelope
        self.attempt = attempt
        self._message = message
        self._source = source
        self._settled = False

    async def ack(self) -> None:
        """Remove the delivery from the work queue."""
        await self._settle(None)

    async def retry(self, delay_s: float, reason: str) -> None:
        """Redeliver after the retry queue delay that is the smallest >= `delay_s` seconds
        (else the longest), with `eo-attempts` = this attempt and `eo-retry-reason`."""
        copy = envelope_message(self.envelope, {ATTEMPTS_HEADER: str(self.attempt),
                                                RETRY_REASON_HEADER: reason})
        await self._settle((self._source.retry_queue(delay_s), copy))

    async def dead_letter(self, reason: str, endpoint: str) -> None:
        """Move to `<endpoint>.dlq` with `eo-reason`, `eo-endpoint` and `eo-attempts`."""
        copy = envelope_message(self.envelope, {REASON_HEADER: reason, ENDPOINT_HEADER: endpoint,
                                                ATTEMPTS_HEADER: str(self.attempt)})
        await self._settle((queue_names(endpoint, 0).dead_letter, copy))

    async def _settle(self, copy: tuple[str, aio_pika.Message] | None) -> None:
        if self._settled:
            return
        self._settled = True  # before the first await: a concurrent settle is a no-op
        if copy is not None:
            try:
                await self._source.connection.publish(*copy)
            except TransientError:
                self._settled = False  # the original is untouched: settling again is safe
                raise
        with translated(f"ack of {self.envelope.message_id}"):
            await self._message.ack()


def _channel_lost(message: AbstractIncomingMessage) -> bool:
    try:
        return message.channel.is_closed
    except ChannelInvalidStateError:  # raised by the property itself once the channel closed
        return True


class RabbitSource:
    """Deliveries of the work queue `endpoint` (declared by `topology.declare` beforehand),
    with manual acks on a channel of its own. Messages that cannot become an envelope (see
    `envelope_of`) are dead-lettered here with the reason, never yielded, and counted in
    `rejected`. `retry_delays_s` must match the declared retry queues (seconds, non-empty)."""

    def __init__(self, connection: RabbitConnection, endpoint: str,
                 retry_delays_s: Sequence[float], max_body_bytes: int = 1_048_576,
                 events: EventSink | None = None) -> None:
        if not retry_delays_s:
            raise ValueError("RabbitSource needs at least one retry delay")
        self.connection = connection
        self.endpoint = endpoint
        self.retry_delays_s = tuple(retry_delays_s)
        self.names = queue_names(endpoint, len(self.retry_delays_s))
        self.max_body_bytes = max_body_bytes
        self.events = events
        self.rejected = 0
        self._inbox: asyncio.Queue[AbstractIncomingMessage | None] = asyncio.Queue()
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None
        self._stopped = False

    def retry_queue(self, delay_s: float) -> str:
        """The retry queue for a delay of `delay_s` seconds."""
        return self.names.retries[retry_index(self.retry_delays_s, delay_s)]

    async def deliveries(self, prefetch: int = 8) -> AsyncIterator[RabbitDelivery]:
        """Deliveries, at most `prefetch` unacked at a time, until `stop`. Survives a lost
        connection (the consumer is restored; deliveries of the lost channel are redelivered
        by the broker). The channel stays open for settling after the end, until the
        connection closes. Raises `TransientError` when the queue cannot be consumed."""
        if self._stopped:
            return
        channel = await self.connection.channel_for_consuming(prefetch)
        try:
            with translated(f"consuming {self.endpoint!r}"):
                self._queue = await channel.declare_queue(self.endpoint, passive=True)
                self._tag = await self._queue.consume(self._on_message, no_ack=False)
        except TransientError:
            with contextlib.suppress(*DRIVER_ERRORS):  # else the robust channel reopens itself
                await channel.close()
            raise
        try:
            while (message := await self._inbox.get()) is not None:
                if _channel_lost(message):
                    continue  # the broker requeued it when the channel died
                try:
                    envelope = envelope_of(message, self.max_body_bytes)
                except MalformedMessage as exc:
                    await self._reject(message, exc.reason)
                    continue
                yield RabbitDelivery(message, envelope, attempt_of(envelope.headers), self)
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Cancel the consumer and end `deliveries`; deliveries already yielded stay
        settleable (the caller waits for them), received but unyielded ones are requeued.
        Idempotent; `deliveries` calls it again on its way out, which cancels a consumer
        that was still being registered when `stop` first ran."""
        self._stopped = True
        queue, tag, self._tag = self._queue, self._tag, None
        if queue is not None and tag is not None:
            try:
                await queue.cancel(tag)
            except DRIVER_ERRORS as exc:  # a lost channel took the consumer with it
                log.warning("cancelling the consumer of %s: %s", self.endpoint, exc)
        while not self._inbox.empty():
            message = self._inbox.get_nowait()
            if message is not None:
                await self._requeue(message)
        self._inbox.put_nowait(None)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        if not self._stopped:
            self._inbox.put_nowait(message)
        else:  # sent before the broker processed our cancel
            await self._requeue(message)

    async def _requeue(self, message: AbstractIncomingMessage) -> None:
        try:
            await message.reject(requeue=True)
        except DRIVER_ERRORS as exc:  # channel gone: the broker requeued it already
            log.debug("requeue on %s: %s", self.endpoint, exc)

    async def _reject(self, message: AbstractIncomingMessage, reason: str) -> None:
        headers = text_headers(message.headers)
        headers.update({REASON_HEADER: reason, ENDPOINT_HEADER: self.endpoint,
                        ATTEMPTS_HEADER: str(attempt_of(headers))})
        if not message.message_id:
            headers[NO_MESSAGE_ID_HEADER] = "true"
        copy = amqp_message(message.message_id, message.type, message.body, headers)
        try:
            await self.connection.publish(self.names.dead_letter, copy)
            with translated("ack of a rejected message"):
                await message.ack()
        except TransientError as exc:
            # Requeued, it comes back; the work queue's delivery limit bounds the loop.
            log.warning("dead-lettering an invalid message of %s failed: %s", self.endpoint, exc)
            await self._requeue(message)
            return
        self.rejected += 1
        if self.events is not None:  # counted like every other dead letter (protocol 7, 9)
            self.events.emit(MESSAGE_DEAD_LETTERED, endpoint=self.endpoint,
                             message_id=message.message_id, reason=reason, attempt=1)
        else:
            log.warning("invalid message on %s dead-lettered: %s", self.endpoint, reason)
