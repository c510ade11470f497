"""What a connection asks the broker about queues without touching them: passive declares,
each on a channel of its own, so that a missing queue (which closes its channel) costs
nothing else (`PassiveDeclares`, a part of `RabbitConnection`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aio_pika
from aio_pika.abc import AbstractChannel

from adapters.rabbitmq.errors import DRIVER_ERRORS, translated


class PassiveDeclares:
    """`queue_counts` and `queue_exists` for a class with `open_channel` (a plain channel on
    its connection, raising `TransientError` while disconnected)."""

    async def open_channel(self, prefetch: int | None = None) -> AbstractChannel:
        """A new plain channel (the connection's own method)."""
        raise NotImplementedError

    @asynccontextmanager
    async def _own_channel(self) -> AsyncIterator[AbstractChannel]:
        channel = await self.open_channel()
        try:
            yield channel
        finally:
            with contextlib.suppress(*DRIVER_ERRORS):
                if not channel.is_closed:
                    await channel.close()

    async def queue_counts(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of `queue` as the broker counts them now, through a
        passive declare on a channel of its own (a missing queue closes that channel only).
        Raises `TransientError` when disconnected or the queue does not exist."""
        async with self._own_channel() as channel:
            with translated(f"inspecting {queue!r}"):
                declared = await channel.declare_queue(queue, passive=True)
            result = declared.declaration_result
            return result.message_count or 0, result.consumer_count or 0

    async def queue_exists(self, queue: str) -> bool:
        """Whether `queue` exists, through a passive declare on a channel of its own. Raises
        `TransientError` when disconnected or the broker fails otherwise."""
        async with self._own_channel() as channel:
            with translated(f"looking for {queue!r}"):
                try:
                    await channel.declare_queue(queue, passive=True)
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    return False
            return True
