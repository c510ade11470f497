"""Acks of one consuming channel, coalesced into `basic.ack` frames with `multiple` set.

A batch settles its deliveries together; acking them one frame each costs the consumer a
frame, a write and a drain per delivery, and the broker a frame per delivery. `ChannelAcks`
gathers the acks asked for in one turn of the event loop and sends them as ONE
`basic.ack(multiple=True)` for the run of settled delivery tags that starts at the channel's
first, and singly for the tags above a delivery still in flight (AMQP 0-9-1, `basic.ack`:
"If the multiple field is 1, and the delivery tag is non-zero, this indicates
acknowledgement of all outstanding messages up to and including the specified message").

Why this is safe without knowing the order in which deliveries reach the consumer: RabbitMQ
numbers the deliveries of a channel 1, 2, 3... and a frame with `multiple` is sent only for
a tag `t` such that EVERY tag from 1 to `t` was settled through this object (acked, or
rejected and reported with `settled_singly`). A tag the consumer never saw, or never
reported, stops the run there: the acks above it go singly, as without coalescing. The
frames leave in the order they were decided (one flush at a time), so a single ack is never
sent for a tag a `multiple` frame has already covered.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aio_pika.exceptions import ChannelInvalidStateError

from adapters.rabbitmq.errors import closed_without_reason


class ChannelAcks:
    """Coalesced acks of the deliveries of `channel` (aiormq's channel of the deliveries,
    `IncomingMessage.channel`). `timeout_s` bounds each flush (seconds). `frames` counts
    the `basic.ack` frames sent, `acked` the deliveries they acked."""

    def __init__(self, channel: Any, timeout_s: float) -> None:
        self.channel = channel
        self.timeout_s = timeout_s
        self.frames = 0
        self.acked = 0
        self._upto = 0  # every tag <= this one is settled at the broker
        self._above: set[int] = set()  # tags > _upto settled already, singly
        self._asked: list[tuple[int, asyncio.Future[None]]] = []
        self._flush_scheduled = False
        self._flushes: set[asyncio.Task[None]] = set()  # referenced while they run
        self._lock = asyncio.Lock()  # one flush at a time: frames leave in decision order

    async def ack(self, delivery_tag: int) -> None:
        """Ack the delivery `delivery_tag`; returns once its frame (maybe shared) is written.
        Raises the driver's error (`DRIVER_ERRORS`: the channel is gone, or `TimeoutError`
        after `timeout_s`) when the frame was not written; the broker then redelivers.

        An ack asked while no other is being written goes at once, from the caller's task
        (a consumer of one delivery at a time pays no task and no future); those asked
        meanwhile wait and go together, in one flush."""
        if not self._lock.locked() and not self._asked:
            async with self._lock:  # free: taken without yielding to the loop
                await self._write([delivery_tag])
            return
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        self._asked.append((delivery_tag, written))
        if not self._flush_scheduled:  # the other acks of this turn join this flush
            self._flush_scheduled = True
            flush = loop.create_task(self._flush())
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        await written

    def settled_singly(self, delivery_tag: int) -> None:
        """Report a delivery settled without this object (a reject, or an ack of its own),
        once its frame is written: the run of settled tags can go past it."""
        if delivery_tag > self._upto:
            self._above.add(delivery_tag)

    async def _flush(self) -> None:
        async with self._lock:
            self._flush_scheduled = False  # an ack asked from now on needs a flush of its own
            asked, self._asked = self._asked, []
            try:
                await self._write([tag for tag, _ in asked])
            except Exception as exc:  # noqa: BLE001 - every asker gets it (redelivered)
                for _, written in asked:
                    if not written.done():
                        written.set_exception(exc)
                return
            except BaseException:  # cancelled (the loop is closing): the askers too
                for _, written in asked:
                    written.cancel()
                raise
            for _, written in asked:
                if not written.done():
                    written.set_result(None)

    async def _write(self, tags: list[int]) -> None:
        """Decide and write the frames of `tags` (the lock held): one `multiple` frame for
        those in the run of settled tags from the channel's first, one each for the rest.
        The state changes only once every frame is written."""
        tags.sort()
        settled = self._above.union(tags)
        upto = self._upto
        while upto + 1 in settled:
            upto += 1
        covered = [tag for tag in tags if tag <= upto]
        try:
            async with asyncio.timeout(self.timeout_s):
                if covered:
                    await self.channel.basic_ack(covered[-1], multiple=len(covered) > 1)
                    self.frames += 1
                for tag in tags[len(covered):]:
                    await self.channel.basic_ack(tag)
                    self.frames += 1
        except Exception as exc:
            # the channel is gone, as its own error would have said
            if closed_without_reason(exc):
                raise ChannelInvalidStateError(
                    "the channel closed while its ack was being written") from exc
            raise
        self._upto = upto
        self._above = {tag for tag in settled if tag > upto}
        self.acked += len(tags)
