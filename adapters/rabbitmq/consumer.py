"""Manual-ack consumption of an endpoint's work queue, supervised: `RabbitSource` yields the
deliveries of a consumer kept registered (adapters/rabbitmq/subscription.py re-creates its
channel and consumer whenever they are gone). Each delivery is admitted
(adapters/rabbitmq/admission.py: an envelope, or a dead letter), then settled
(adapters/rabbitmq/delivery.py); dead letters wait for room in their queue
(adapters/rabbitmq/dead_letter_queue.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection, Sequence

from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.acks import ChannelAcks
from adapters.rabbitmq.admission import Admission
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dead_letter_queue import DeadLetterGate
from adapters.rabbitmq.delivery import RabbitDelivery, channel_lost
from adapters.rabbitmq.dispatcher import attempt_of
from adapters.rabbitmq.errors import DRIVER_ERRORS, channel_gone
from adapters.rabbitmq.subscription import Subscription
from adapters.rabbitmq.topology import queue_names, retry_index
from application import defaults
from application.errors import MalformedMessage, TransientError
from application.ports import EventSink

log = logging.getLogger(__name__)


class RabbitSource:
    """Deliveries of the work queue `endpoint` (declared by `topology.declare` beforehand),
    with manual acks on a channel of its own, supervised by its `subscription`
    (`Subscription`: a lost channel or consumer is re-created with the connection's back-off,
    a watchdog every `watchdog_interval_s` seconds re-creates one that the broker no longer
    lists or whose deliveries stalled for `watchdog_s` seconds); when no consumer could be
    re-created within the connection's `give_up_after_s`, or the connection itself gave up,
    `deliveries` raises `BrokerUnavailable`.

    Messages that cannot become an envelope (see `envelope_of`) are dead-lettered here with
    the reason and at most `dead_letter_body_bytes` of their body (plus its size and
    SHA-256), never yielded, and counted in `dead_lettered`. While the dead-letter queue
    refuses a copy (full), the source holds that message and yields no new delivery
    (`dead_letters_blocked`, for readiness; `dead_letter_queue.full` and `.room` events),
    trying the copy again every `dead_letter_wait_s` seconds: nothing is lost, and nothing
    is parked elsewhere. A delivery keeps only the
    protocol's headers and those named in `kept_headers`. `retry_delays_s` must match the
    declared retry queues (seconds, non-empty). `service_user` is the service's own broker
    user (the copies it publishes carry it as `user_id`, so their `eo-producer` is trusted:
    `adapters.rabbitmq.dispatcher.producer_of`); with `require_producer` (a gateway in
    production) a message without `user_id` is dead-lettered, as it names no producer.
    """

    def __init__(self, connection: RabbitConnection, endpoint: str,
                 retry_delays_s: Sequence[float], max_body_bytes: int = defaults.MAX_BODY_BYTES,
                 events: EventSink | None = None, watchdog_s: float = 30.0,
                 watchdog_interval_s: float | None = None,
                 dead_letter_body_bytes: int = defaults.DEAD_LETTER_BODY_BYTES,
                 kept_headers: Collection[str] = (), service_user: str | None = None,
                 require_producer: bool = False, dead_letter_wait_s: float = 5.0) -> None:
        if not retry_delays_s:
            raise ValueError("RabbitSource needs at least one retry delay")
        self.connection = connection
        self.endpoint = endpoint
        self.retry_delays_s = tuple(retry_delays_s)
        self.names = queue_names(endpoint, self.retry_delays_s)
        self.service_user = service_user
        self.events = events
        #: the dead-letter queue, and what waits while it is full
        self.dead_letters = DeadLetterGate(connection, endpoint, self.names.dead_letter,
                                           events, dead_letter_wait_s)
        #: what becomes an envelope, and the dead letters of what does not
        self.admission = Admission(endpoint, self.dead_letters, events, max_body_bytes,
                                   dead_letter_body_bytes, frozenset(kept_headers),
                                   service_user, require_producer)
        #: the consumer, kept registered
        self.subscription = Subscription(
            connection, endpoint, self._on_message, lambda: self._received.put_nowait(None),
            lambda: self.subscription.prefetch - self._in_flight,
            lambda: self.dead_letters_blocked, events, watchdog_s, watchdog_interval_s)
        #: the messages the broker pushed, in order, until `deliveries` admits them (None:
        #: the stream ends); not an inbox in the protocol's sense
        self._received: asyncio.Queue[AbstractIncomingMessage | None] = asyncio.Queue()
        self._in_flight = 0
        self._started = False
        self._stopped = False

    def retry_queue(self, delay_s: float) -> str:
        """The retry queue for a delay of `delay_s` seconds."""
        return self.names.retries[retry_index(self.retry_delays_s, delay_s)]

    @property
    def dead_lettered(self) -> int:
        """Messages dead-lettered by the source itself (never yielded: they could not
        become envelopes)."""
        return self.admission.dead_lettered

    @property
    def dead_letters_blocked(self) -> bool:
        """Whether a dead letter waits for room in the full dead-letter queue (readiness:
        the endpoint takes no new delivery meanwhile)."""
        return self.dead_letters.blocked

    @property
    def stopped(self) -> bool:
        """Whether `stop` was called."""
        return self._stopped

    @property
    def consuming(self) -> bool:
        """Whether a consumer is registered on an open channel now (readiness)."""
        return self.subscription.consuming

    @property
    def restarts(self) -> int:
        """Consumers re-created since `deliveries` started."""
        return self.subscription.restarts

    async def deliveries(self, prefetch: int = defaults.SINGLE_PREFETCH
                         ) -> AsyncIterator[RabbitDelivery]:
        """Deliveries, at most `prefetch` unacked at a time (the `start` value when started
        before), until `stop`. Survives lost
        channels, connections and consumers (see the class docstring); deliveries of a lost
        channel are redelivered by the broker. The last channel stays open for settling after
        the end, until the connection closes. Raises `TransientError` when the queue cannot
        be consumed at start, `BrokerUnavailable` when consumption could not be restored, and
        the error of a bug in the supervision (not the broker's: not retried)."""
        if self._stopped:
            return
        if not self._started:
            await self.start(prefetch)
        subscription = self.subscription
        tasks = [asyncio.create_task(subscription.supervise(),
                                     name=f"{self.endpoint} supervisor"),
                 asyncio.create_task(subscription.watch(), name=f"{self.endpoint} watchdog")]
        for task in tasks:
            task.add_done_callback(self._supervision_ended)
        try:
            while (message := await self._received.get()) is not None:
                # while a dead letter waits for room, take no new delivery
                await self.dead_letters.wait_for_room(lambda: self.stopped)
                if channel_lost(message):
                    continue  # the broker requeued it when the channel died
                try:
                    envelope = self.admission.envelope(message)
                except MalformedMessage as exc:
                    await self.admission.reject(message, exc.reason, lambda: self.stopped,
                                                self.requeue, self._settled_singly)
                    continue
                self._in_flight += 1
                yield RabbitDelivery(message, envelope, attempt_of(envelope.headers), self)
        finally:
            for task in tasks:
                task.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            await self.stop()
        for error in ended:  # a bug in the supervision, not the broker
            if isinstance(error, Exception):
                raise error
        if subscription.failure is not None:
            raise subscription.failure

    def _supervision_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._received.put_nowait(None)  # `deliveries` ends and raises it

    async def start(self, prefetch: int = defaults.SINGLE_PREFETCH) -> None:
        """Consume the work queue now (`deliveries` does it otherwise), at most `prefetch`
        unacked at a time. Raises `TransientError` when the queue cannot be consumed."""
        self.subscription.prefetch = prefetch
        await self.subscription.subscribe()
        self._started = True

    async def ack(self, message: AbstractIncomingMessage, message_id: object) -> None:
        """Ack `message`, coalesced with the other acks of this turn of the event loop
        (`ChannelAcks`). Raises `TransientError("ack of <message_id>: ...")` when its channel
        is gone or the ack could not be written in time."""
        try:
            channel = message.channel  # raises once the channel closed
            tag = message.delivery_tag
            if tag is None:  # not a manual-ack delivery (aio-pika's type allows it)
                raise TypeError("the delivery has no delivery tag")
            acks = self.subscription.acks
            if acks is None or acks.channel is not channel:  # a replaced channel's straggler
                acks = ChannelAcks(channel, self.connection.publish_timeout_s)
            await acks.ack(tag)
        except DRIVER_ERRORS as exc:
            raise TransientError(f"ack of {message_id}: {type(exc).__name__}: {exc}") from exc

    def _settled_singly(self, message: AbstractIncomingMessage) -> None:
        acks, tag = self.subscription.acks, message.delivery_tag
        if (acks is not None and tag is not None and not channel_lost(message)
                and acks.channel is message.channel):
            acks.settled_singly(tag)

    def settled_one(self) -> None:
        """A yielded delivery was settled, or failed to (its slot is free again)."""
        self._in_flight = max(0, self._in_flight - 1)

    async def stop(self) -> None:
        """Cancel the consumer and end `deliveries`; deliveries already yielded stay
        settleable (the caller waits for them), received but unyielded ones are requeued.
        Idempotent; `deliveries` calls it again on its way out, which cancels a consumer
        that was still being registered when `stop` first ran."""
        self._stopped = True
        await self.subscription.cancel()
        while not self._received.empty():
            message = self._received.get_nowait()
            if message is not None:
                await self.requeue(message)
        self._received.put_nowait(None)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self.subscription.delivered()
        if not self._stopped:
            self._received.put_nowait(message)
        else:  # sent before the broker processed our cancel
            await self.requeue(message)

    async def requeue(self, message: AbstractIncomingMessage) -> None:
        """`basic.reject` of `message` with requeue (its tag told to the channel's acks); a
        channel that closed meanwhile has requeued it (no error)."""
        try:
            await message.reject(requeue=True)
        except Exception as exc:
            if not channel_gone(exc):
                raise
            log.debug("requeue on %s: %s", self.endpoint, exc)  # the broker requeued it
        else:
            self._settled_singly(message)
