"""Manual-ack consumption of an endpoint's work queue, supervised: `RabbitSource` re-creates
its channel and consumer whenever they are gone. Each delivery is admitted
(adapters/rabbitmq/admission.py: an envelope, or a dead letter), then settled
(adapters/rabbitmq/delivery.py); dead letters wait for room in their queue
(adapters/rabbitmq/dead_letter_queue.py)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from adapters.rabbitmq.acks import ChannelAcks
from adapters.rabbitmq.admission import Admission
from adapters.rabbitmq.backoff import backoff
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dead_letter_queue import DeadLetterGate
from adapters.rabbitmq.delivery import RabbitDelivery, channel_lost
from adapters.rabbitmq.dispatcher import (
    attempt_of,
)
from adapters.rabbitmq.errors import DRIVER_ERRORS, BrokerUnavailable, translated
from adapters.rabbitmq.topology import queue_names, retry_index
from application import defaults
from application.errors import MalformedMessage, TransientError
from application.observability import (
    CONSUMER_LOST,
    CONSUMER_RESTARTED,
)
from application.ports import EventSink

log = logging.getLogger(__name__)


class LostBecause(enum.StrEnum):
    """Why a source re-creates its consumer (the `reason` label of the restart metric)."""

    CHANNEL_CLOSED = "channel_closed"  # the channel closed: connection lost, channel error
    CANCELLED = "cancelled"  # the broker cancelled the consumer (queue deleted, ...)
    NO_CONSUMER = "no_consumer"  # the broker lists no consumer on the queue (watchdog)
    STALLED = "stalled"  # ready messages and free slots, yet no delivery (watchdog)


class RabbitSource:
    """Deliveries of the work queue `endpoint` (declared by `topology.declare` beforehand),
    with manual acks on a channel of its own, supervised:

    - when the channel closes (the connection dropped, a channel error) or the broker
      cancels the consumer (the queue was deleted), the source opens a new channel and
      consumes again, with backoff (`reconnect_delays_s`), counting `restarts` and emitting
      `consumer.lost` and `consumer.restarted`;
    - a watchdog looks every `watchdog_interval_s` seconds: when the broker lists no
      consumer on the queue, or the queue has ready messages, the source free slots, and no
      delivery came for `watchdog_s` seconds, the consumer is re-created the same way;
    - when no consumer could be re-created within the connection's `give_up_after_s`, or the
      connection itself gave up, `deliveries` raises `BrokerUnavailable`.

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
        if watchdog_s <= 0:
            raise ValueError("watchdog_s must be > 0")
        self.connection = connection
        self.endpoint = endpoint
        self.retry_delays_s = tuple(retry_delays_s)
        self.names = queue_names(endpoint, len(self.retry_delays_s))
        self.service_user = service_user
        self.events = events
        self.watchdog_s = watchdog_s
        self.watchdog_interval_s = watchdog_interval_s or min(5.0, watchdog_s / 3)
        #: the dead-letter queue, and what waits while it is full
        self.dead_letters = DeadLetterGate(connection, endpoint, self.names.dead_letter,
                                           events, dead_letter_wait_s)
        #: what becomes an envelope, and the dead letters of what does not
        self.admission = Admission(endpoint, self.dead_letters, events, max_body_bytes,
                                   dead_letter_body_bytes, frozenset(kept_headers),
                                   service_user, require_producer)
        #: consumers re-created since `deliveries` started
        self.restarts = 0
        self._inbox: asyncio.Queue[AbstractIncomingMessage | None] = asyncio.Queue()
        self._channel: AbstractChannel | None = None
        self._acks: ChannelAcks | None = None  # of the current channel's deliveries
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None
        self._prefetch = defaults.SINGLE_PREFETCH
        self._in_flight = 0
        self._last_delivery = time.monotonic()
        self._lost = asyncio.Event()
        self._lost_because = LostBecause.CHANNEL_CLOSED
        self._lost_detail = ""
        self._failure: BrokerUnavailable | None = None
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
        channel = self._channel
        return (self._tag is not None and channel is not None and not channel.is_closed
                and not self._lost.is_set())

    async def deliveries(self, prefetch: int = defaults.SINGLE_PREFETCH
                         ) -> AsyncIterator[RabbitDelivery]:
        """Deliveries, at most `prefetch` unacked at a time (the `start` value when started
        before), until `stop`. Survives lost
        channels, connections and consumers (see the class docstring); deliveries of a lost
        channel are redelivered by the broker. The last channel stays open for settling after
        the end, until the connection closes. Raises `TransientError` when the queue cannot
        be consumed at start, `BrokerUnavailable` when consumption could not be restored."""
        if self._stopped:
            return
        if not self._started:
            await self.start(prefetch)
        tasks = [asyncio.create_task(self._supervise(), name=f"{self.endpoint} supervisor"),
                 asyncio.create_task(self._watch(), name=f"{self.endpoint} watchdog")]
        try:
            while (message := await self._inbox.get()) is not None:
                # while a dead letter waits for room, take no new delivery
                await self.dead_letters.wait_for_room(lambda: self.stopped)
                if channel_lost(message):
                    continue  # the broker requeued it when the channel died
                try:
                    envelope = self.admission.envelope(message)
                except MalformedMessage as exc:
                    await self.admission.reject(message, exc.reason, lambda: self.stopped,
                                                self._requeue, self._settled_singly)
                    continue
                self._in_flight += 1
                yield RabbitDelivery(message, envelope, attempt_of(envelope.headers), self)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.stop()
        if self._failure is not None:
            raise self._failure

    async def start(self, prefetch: int = defaults.SINGLE_PREFETCH) -> None:
        """Consume the work queue now (`deliveries` does it otherwise), at most `prefetch`
        unacked at a time. Raises `TransientError` when the queue cannot be consumed."""
        self._prefetch = prefetch
        await self._subscribe()
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
            acks = self._acks
            if acks is None or acks.channel is not channel:  # a replaced channel's straggler
                acks = ChannelAcks(channel, self.connection.publish_timeout_s)
            await acks.ack(tag)
        except DRIVER_ERRORS as exc:
            raise TransientError(f"ack of {message_id}: {type(exc).__name__}: {exc}") from exc

    def _settled_singly(self, message: AbstractIncomingMessage) -> None:
        acks, tag = self._acks, message.delivery_tag
        if (acks is not None and tag is not None and not channel_lost(message)
                and acks.channel is message.channel):
            acks.settled_singly(tag)

    def settled_one(self) -> None:
        """A yielded delivery was settled, or failed to (its slot is free again)."""
        self._in_flight = max(0, self._in_flight - 1)

    async def _subscribe(self) -> None:
        """Open a channel and consume the work queue on it. Raises `TransientError`."""
        channel = await self.connection.open_channel(self._prefetch)
        try:
            with translated(f"consuming {self.endpoint!r}"):
                queue = await channel.declare_queue(self.endpoint, passive=True)
                underlay: Any = await channel.get_underlay_channel()  # reports cancels
                underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
                self._acks = ChannelAcks(underlay, self.connection.publish_timeout_s)
                channel.close_callbacks.add(self._on_channel_close)
                self._channel, self._queue = channel, queue
                self._tag = await queue.consume(self._on_message, no_ack=False)
        except TransientError:
            self._channel = self._queue = self._tag = None
            with contextlib.suppress(*DRIVER_ERRORS):
                if not channel.is_closed:
                    await channel.close()
            raise
        self._last_delivery = time.monotonic()

    def _on_channel_close(self, sender: Any, exc: BaseException | None = None) -> None:
        if sender is self._channel:
            self._lose(LostBecause.CHANNEL_CLOSED, f"channel closed: {exc}")

    def _on_cancel(self, frame: Any) -> None:
        if getattr(frame, "consumer_tag", None) == self._tag:
            self._lose(LostBecause.CANCELLED, "consumer cancelled by the broker")

    def _lose(self, because: LostBecause, detail: str) -> None:
        if self._stopped or self._lost.is_set():
            return
        self._lost_because, self._lost_detail = because, detail
        self._lost.set()
        log.warning("consumer of %s lost (%s): %s", self.endpoint, because, detail)
        if self.events is not None:
            self.events.emit(CONSUMER_LOST, endpoint=self.endpoint, reason=str(because),
                             detail=detail)

    async def _supervise(self) -> None:
        # ends once consumption could not be restored (`_failure`): `_lost` stays set then,
        # and waiting on it again would spin without ever yielding to the event loop
        while not self._stopped and self._failure is None:
            await self._lost.wait()
            if self._stopped:
                return
            await self._resubscribe()

    async def _resubscribe(self) -> None:
        loop = asyncio.get_running_loop()
        started, attempt = loop.time(), 0
        old, self._channel, self._tag = self._channel, None, None
        if old is not None and not old.is_closed:
            with contextlib.suppress(*DRIVER_ERRORS):  # a stalled consumer's channel
                await old.close()
        give_up = self.connection.give_up_after_s
        while not self._stopped:
            remaining = give_up - (loop.time() - started)
            reason = self.connection.failure
            if reason is None and remaining > 0:
                if not await self.connection.wait_connected(remaining):
                    # down (or closing this very moment): re-check the deadline and the
                    # connection's failure after a pause
                    await asyncio.sleep(backoff(self.connection.reconnect_delays_s, attempt))
                    attempt += 1
                    continue
                try:
                    await self._subscribe()
                except TransientError as exc:
                    reason = str(exc)
                    if loop.time() - started < give_up:
                        await asyncio.sleep(backoff(self.connection.reconnect_delays_s,
                                                    attempt))
                        attempt += 1
                        continue
                else:
                    self._lost.clear()
                    self.restarts += 1
                    took = loop.time() - started
                    log.warning("consuming %s again after %.1f s", self.endpoint, took)
                    if self.events is not None:
                        self.events.emit(CONSUMER_RESTARTED, endpoint=self.endpoint,
                                         reason=str(self._lost_because),
                                         after_s=round(took, 3))
                    return
            self._failure = BrokerUnavailable(
                f"{self.endpoint}: no consumer for {loop.time() - started:.0f} s "
                f"({self._lost_detail}); last error: {reason}")
            self._inbox.put_nowait(None)
            return

    async def _watch(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.watchdog_interval_s)
            if not self.consuming:
                continue
            try:
                ready, consumers = await self.connection.queue_counts(self.endpoint)
            except TransientError:
                continue  # the connection is down: the channel's close says so
            if not self.consuming or self.dead_letters_blocked:
                continue  # paused on purpose while a dead letter waits for room
            idle = time.monotonic() - self._last_delivery
            if consumers == 0:
                self._lose(LostBecause.NO_CONSUMER, "the broker lists no consumer on "
                           f"{self.endpoint!r}")
            elif ready and self._in_flight < self._prefetch and idle >= self.watchdog_s:
                self._lose(LostBecause.STALLED, f"{ready} ready messages, "
                           f"{self._prefetch - self._in_flight} free slots and no delivery "
                           f"for {idle:.0f} s")

    async def stop(self) -> None:
        """Cancel the consumer and end `deliveries`; deliveries already yielded stay
        settleable (the caller waits for them), received but unyielded ones are requeued.
        Idempotent; `deliveries` calls it again on its way out, which cancels a consumer
        that was still being registered when `stop` first ran."""
        self._stopped = True
        self._lost.set()  # wakes the supervisor, which sees `_stopped`
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
        self._last_delivery = time.monotonic()
        if not self._stopped:
            self._inbox.put_nowait(message)
        else:  # sent before the broker processed our cancel
            await self._requeue(message)

    async def _requeue(self, message: AbstractIncomingMessage) -> None:
        try:
            await message.reject(requeue=True)
        except DRIVER_ERRORS as exc:  # channel gone: the broker requeued it already
            log.debug("requeue on %s: %s", self.endpoint, exc)
        else:
            self._settled_singly(message)
