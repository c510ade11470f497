"""One consumer of an endpoint's work queue kept registered: it opens its channel, notices
when the consumer is lost (the channel closed, the broker cancelled it, or a watchdog sees
the broker list none or deliveries stall) and consumes again with the connection's
reconnection back-off (`reconnecting`), until the connection's give-up time."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from adapters.rabbitmq.acks import ChannelAcks
from adapters.rabbitmq.backoff import reconnecting
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.errors import (
    DRIVER_ERRORS,
    BrokerUnavailable,
    channel_gone,
    translated,
)
from application import defaults
from application.errors import TransientError
from application.observability import CONSUMER_LOST, CONSUMER_RESTARTED
from application.ports import EventSink

log = logging.getLogger(__name__)


class LostBecause(enum.StrEnum):
    """Why a source re-creates its consumer (the `reason` label of the restart metric)."""

    CHANNEL_CLOSED = "channel_closed"  # the channel closed: connection lost, channel error
    CANCELLED = "cancelled"  # the broker cancelled the consumer (queue deleted, ...)
    NO_CONSUMER = "no_consumer"  # the broker lists no consumer on the queue (watchdog)
    STALLED = "stalled"  # ready messages and free slots, yet no delivery (watchdog)


class Subscription:
    """The consumer of work queue `endpoint` on a channel of its own, at most `prefetch`
    unacked deliveries, each passed to `on_message` (which calls `delivered()`):

    - when the channel closes or the broker cancels the consumer, it opens a new channel and
      consumes again with the connection's back-off (`reconnect_delays_s`), counting
      `restarts` and emitting `consumer.lost` and `consumer.restarted`;
    - a watchdog (`watch`) looks every `watchdog_interval_s` seconds: when the broker lists no
      consumer, or the queue has ready messages, `free_slots()` is above 0 and no delivery
      came for `watchdog_s` seconds, the consumer is re-created the same way (not while
      `paused()`);
    - when no consumer could be re-created within the connection's `give_up_after_s`, or the
      connection itself gave up, `failure` holds a `BrokerUnavailable` and `on_gone()` is
      called."""

    def __init__(self, connection: RabbitConnection, endpoint: str,
                 on_message: Callable[[AbstractIncomingMessage], Awaitable[None]],
                 on_gone: Callable[[], None], free_slots: Callable[[], int],
                 paused: Callable[[], bool], events: EventSink | None = None,
                 watchdog_s: float = 30.0, watchdog_interval_s: float | None = None) -> None:
        if watchdog_s <= 0:
            raise ValueError("watchdog_s must be > 0")
        self.connection, self.endpoint, self.events = connection, endpoint, events
        self._on_message, self._on_gone = on_message, on_gone
        self._free_slots, self._paused = free_slots, paused
        self.watchdog_s = watchdog_s
        self.watchdog_interval_s = watchdog_interval_s or min(5.0, watchdog_s / 3)
        self.prefetch = defaults.SINGLE_PREFETCH
        #: consumers re-created since the first `subscribe`
        self.restarts = 0
        #: set when consumption could not be restored
        self.failure: BrokerUnavailable | None = None
        #: the channel consumed on now, its coalesced acks, and the consumer's tag
        self.channel: AbstractChannel | None = None
        self.acks: ChannelAcks | None = None
        self.tag: str | None = None
        self._queue: AbstractQueue | None = None
        self._last_delivery = time.monotonic()
        self._lost = asyncio.Event()
        self._lost_because = LostBecause.CHANNEL_CLOSED
        self._lost_detail = ""
        self._stopped = False

    @property
    def consuming(self) -> bool:
        """Whether a consumer is registered on an open channel now (readiness)."""
        channel = self.channel
        return (self.tag is not None and channel is not None and not channel.is_closed
                and not self._lost.is_set())

    async def subscribe(self) -> None:
        """Open a channel and consume the work queue on it. Raises `TransientError`."""
        channel = await self.connection.open_channel(self.prefetch)
        try:
            with translated(f"consuming {self.endpoint!r}"):
                queue = await channel.declare_queue(self.endpoint, passive=True)
                underlay: Any = await channel.get_underlay_channel()  # reports cancels
                underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
                self.acks = ChannelAcks(underlay, self.connection.publish_timeout_s)
                channel.close_callbacks.add(self._on_channel_close)
                self.channel, self._queue = channel, queue
                self.tag = await queue.consume(self._on_message, no_ack=False)
        except TransientError:
            self.channel = self._queue = self.tag = None
            with contextlib.suppress(*DRIVER_ERRORS):
                if not channel.is_closed:
                    await channel.close()
            raise
        self._last_delivery = time.monotonic()

    def delivered(self) -> None:
        """Note a delivery now (the watchdog's idle time starts again): `on_message` calls
        it, registered itself with the broker so that a delivery awaits through no extra
        frame."""
        self._last_delivery = time.monotonic()

    def _on_channel_close(self, sender: Any, exc: BaseException | None = None) -> None:
        if sender is self.channel:
            self._lose(LostBecause.CHANNEL_CLOSED, f"channel closed: {exc}")

    def _on_cancel(self, frame: Any) -> None:
        if getattr(frame, "consumer_tag", None) == self.tag:
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

    async def supervise(self) -> None:
        """Consume again each time the consumer is lost, until `cancel` or a `failure`."""
        # ends once consumption could not be restored (`failure`): `_lost` stays set then,
        # and waiting on it again would spin without ever yielding to the event loop
        while not self._stopped and self.failure is None:
            await self._lost.wait()
            if self._stopped:
                return
            await self._resubscribe()

    async def _resubscribe(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.connection.give_up_after_s
        old, self.channel, self.tag = self.channel, None, None
        if old is not None and not old.is_closed:
            with contextlib.suppress(*DRIVER_ERRORS):  # a stalled consumer's channel
                await old.close()
        try:
            await reconnecting(lambda: self._consume_again(deadline), deadline,
                               self.connection.reconnect_delays_s,
                               waiting=self._unless_given_up)
        except TransientError as exc:
            self.failure = BrokerUnavailable(
                f"{self.endpoint}: no consumer for {loop.time() - started:.0f} s "
                f"({self._lost_detail}); last error: {exc}")
            self._on_gone()
            return
        if self._stopped:
            return
        self._lost.clear()
        self.restarts += 1
        took = loop.time() - started
        log.warning("consuming %s again after %.1f s", self.endpoint, took)
        if self.events is not None:
            self.events.emit(CONSUMER_RESTARTED, endpoint=self.endpoint,
                             reason=str(self._lost_because), after_s=round(took, 3))

    async def _consume_again(self, deadline: float) -> None:
        """One try of `_resubscribe` (nothing once cancelled). Raises `TransientError` while
        the connection is down (waiting for it until `deadline`, the event loop's clock) or
        gave up, or the queue cannot be consumed."""
        if self._stopped:
            return
        if self.connection.failure is not None:
            raise TransientError(f"the connection gave up: {self.connection.failure}")
        left = deadline - asyncio.get_running_loop().time()
        if not await self.connection.wait_connected(max(left, 0.0)):
            # down (or closing this very moment): try again after the back-off's pause
            raise TransientError(f"not connected (the connection's failure: "
                                 f"{self.connection.failure})")
        await self.subscribe()

    def _unless_given_up(self, failure: BaseException, pause_s: float) -> None:
        if self.connection.failure is not None:
            raise failure  # no pause brings back a connection that gave up

    async def watch(self) -> None:
        """The watchdog (see the class docstring), until `cancel`."""
        while not self._stopped:
            await asyncio.sleep(self.watchdog_interval_s)
            if not self.consuming:
                continue
            try:
                ready, consumers = await self.connection.queue_counts(self.endpoint)
            except TransientError:
                continue  # the connection is down: the channel's close says so
            if not self.consuming or self._paused():
                continue  # paused on purpose while a dead letter waits for room
            idle = time.monotonic() - self._last_delivery
            free = self._free_slots()
            if consumers == 0:
                self._lose(LostBecause.NO_CONSUMER, "the broker lists no consumer on "
                           f"{self.endpoint!r}")
            elif ready and free > 0 and idle >= self.watchdog_s:
                self._lose(LostBecause.STALLED, f"{ready} ready messages, {free} free slots "
                           f"and no delivery for {idle:.0f} s")

    async def cancel(self) -> None:
        """Cancel the consumer and stop supervising; the channel stays open for settling.
        Idempotent."""
        self._stopped = True
        self._lost.set()  # wakes the supervisor, which sees `_stopped`
        queue, tag, self.tag = self._queue, self.tag, None
        if queue is not None and tag is not None:
            try:
                await queue.cancel(tag)
            except Exception as exc:
                if not channel_gone(exc):
                    raise
                # a lost channel took the consumer with it
                log.warning("cancelling the consumer of %s: %s", self.endpoint, exc)
