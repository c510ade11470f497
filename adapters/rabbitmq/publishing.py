"""Publishing with publisher confirms on a connection's publishing channel: the wait for the
connection, one publish of a message ID at a time, and the driver's outcomes turned into the
application's errors (`ConfirmedPublisher`, which `RabbitConnection.publish` uses)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import DeliveryError, PublishError

from adapters.rabbitmq.errors import DRIVER_ERRORS, PublishRefused, closed_without_reason
from application.errors import TransientError


class ConfirmedPublisher:
    """Publishes on the channel `channel()` gives now (it changes with each reconnection),
    once `up` is set, each publish bounded by `timeout_s` seconds including its confirm.

    aiormq matches a returned (unroutable) message to its publish by message ID: two
    publishes of one ID in flight at once (concurrent finishers re-dispatching) could swap
    their outcomes and report an unroutable copy as confirmed. So one publish of an ID at a
    time: `waiting` maps the ID in flight to the futures of those waiting for it."""

    def __init__(self, channel: Callable[[], AbstractChannel], up: asyncio.Event,
                 timeout_s: float) -> None:
        self._channel, self._up, self.timeout_s = channel, up, timeout_s
        self.waiting: dict[str, list[asyncio.Future[None]]] = {}

    async def publish(self, queue: str, message: aio_pika.Message) -> None:
        """Publish `message` on the default exchange to `queue` (mandatory) and wait for the
        publisher confirm, waiting for `up` first if need be. Raises `PublishRefused` on a
        nack (the message did not arrive), `TransientError` on an unroutable message (no such
        queue), a timeout or a lost channel, aiormq's bare `Exception` among them (the
        message may then have arrived or not)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        message_id = message.message_id  # None: aiormq gives the message a random ID
        try:
            if message_id is not None:  # the publish's turn
                if message_id in self.waiting:
                    await self._wait_turn(message_id, deadline)
                self.waiting[message_id] = []
            try:
                if not self._up.is_set():
                    async with asyncio.timeout_at(deadline):
                        await self._up.wait()
                # aiormq bounds the write and the confirm with its own timeout
                await self._channel().default_exchange.publish(
                    message, routing_key=queue, mandatory=True,
                    timeout=max(deadline - loop.time(), 0.001))
            finally:
                if message_id is not None:
                    self._end_turn(message_id)
        except PublishError as exc:
            raise TransientError(f"publish to {queue!r}: unroutable (no such queue)") from exc
        except DeliveryError as exc:
            raise PublishRefused(f"publish to {queue!r}: nacked by the broker") from exc
        except DRIVER_ERRORS as exc:
            raise TransientError(f"publish to {queue!r}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if not closed_without_reason(exc):
                raise
            # aiormq's bare Exception: the channel closed under the publish (a retry's or a
            # dead letter's copy: unhandled, its settlement was never reported)
            raise TransientError(f"publish to {queue!r}: the connection closed") from exc

    # a turn is taken and ended inline rather than by an async context manager, which would
    # build an async generator and its finalizer's bookkeeping for every output published
    # (tools.bench.instructions)

    async def _wait_turn(self, message_id: str, deadline: float) -> None:
        """Return once no other publish of `message_id` is in flight (waiting until
        `deadline`, the event loop's clock, at most)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(deadline):
            while (waiting := self.waiting.get(message_id)) is not None:
                turn = loop.create_future()
                waiting.append(turn)
                await turn  # woken when that publish ends; the first one awake goes next

    def _end_turn(self, message_id: str) -> None:
        """End the turn of `message_id`: wake those waiting for it."""
        for turn in self.waiting.pop(message_id, ()):
            if not turn.done():
                turn.set_result(None)
