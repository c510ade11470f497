"""An endpoint's dead-letter queue moved into the dead-letter store, where operators act on it
(application/dead_letters.py): what the consumer dead-lettered, what its source refused before
processing, and what the broker dead-lettered past the work queue's delivery limit."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.connection import RabbitConnection, translated
from adapters.rabbitmq.dispatcher import producer_of, text_headers
from adapters.rabbitmq.topology import queue_names
from application.dead_letters import dead_letter_of
from application.errors import TransientError
from application.observability import DEAD_LETTER_STORED
from application.ports import DeadLetterStore, EventSink
from application.records import DeadLetter


def broker_reason(headers: Mapping[str, Any] | None) -> str | None:
    """Why the broker dead-lettered a message itself, from its `x-death` header (None when
    it did not): past the quorum work queue's `x-delivery-limit`, the message was delivered
    that often without being settled (its processing kept killing or losing consumers)."""
    deaths = (headers or {}).get("x-death")
    if not deaths:
        return None
    death = deaths[0]
    reason = _text(death.get("reason"))
    queue = _text(death.get("queue"))
    if reason == "delivery_limit":
        return (f"delivery limit of {queue} reached: the message was delivered that often "
                "without being settled (its processing kept killing or losing consumers)")
    return f"dead-lettered by the broker from {queue}: {reason}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def letter_of(message: AbstractIncomingMessage, endpoint: str, service_user: str | None
              ) -> DeadLetter:
    """The `DeadLetter` of a message of `endpoint`'s dead-letter queue (see
    `application.dead_letters.dead_letter_of`); its producer by `producer_of`."""
    headers = text_headers(message.headers)
    at = message.timestamp.astimezone(UTC) if message.timestamp else datetime.now(UTC)
    return dead_letter_of(endpoint, message.message_id, message.type, message.body, headers,
                          producer_of(message.user_id, headers, service_user), at,
                          broker_reason(message.headers))


class DeadLetterCollector:
    """Moves endpoint `endpoint`'s dead-letter queue into `store`, at least once: each
    message is kept (`DeadLetterStore.add`, idempotent for a copy kept before), then acked;
    a crash between the two keeps it twice, which the store merges. `collect()` takes up to
    `batch` messages with `basic.get` on a channel of its own (no consumer to supervise: the
    next round opens a new channel), so a lost connection only fails that round."""

    def __init__(self, connection: RabbitConnection, endpoint: str, store: DeadLetterStore,
                 service_user: str | None = None, events: EventSink | None = None,
                 batch: int = 500) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.connection, self.endpoint, self.store = connection, endpoint, store
        self.service_user, self.events, self.batch = service_user, events, batch
        self.queue = queue_names(endpoint, 0).dead_letter

    async def collect(self) -> int:
        """One round; returns how many dead letters it moved. Raises `TransientError` when
        the broker or the store fails (those moved before stay moved; the message in hand
        goes back to the queue)."""
        moved = 0
        channel = await self.connection.open_channel(1)
        try:
            with translated(f"reading {self.queue!r}"):
                queue = await channel.declare_queue(self.queue, passive=True)
            while moved < self.batch:
                with translated(f"reading {self.queue!r}"):
                    message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    break
                letter = letter_of(message, self.endpoint, self.service_user)
                try:
                    dead_letter_id = await self.store.add(letter)
                except TransientError:
                    with translated(f"returning a dead letter to {self.queue!r}"):
                        await message.reject(requeue=True)
                    raise
                with translated(f"ack on {self.queue!r}"):
                    await message.ack()
                moved += 1
                if self.events is not None:
                    self.events.emit(DEAD_LETTER_STORED, endpoint=letter.endpoint,
                                     message_id=str(letter.message_id or
                                                    letter.raw_message_id),
                                     dead_letter_id=dead_letter_id, reason=letter.reason)
        finally:
            with translated(f"closing the channel of {self.queue!r}"):
                if not channel.is_closed:
                    await channel.close()
        return moved

    async def drain(self) -> int:
        """Rounds until the queue is empty; returns how many dead letters moved."""
        total = 0
        while moved := await self.collect():
            total += moved
        return total
