"""Settling one delivery of a work queue: ack, delayed redelivery through a retry queue, or
dead letter (protocol 7), each copy publisher-confirmed before the original is acked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import ChannelInvalidStateError

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dead_letter_queue import DeadLetterGate
from adapters.rabbitmq.dispatcher import envelope_message
from application.envelope import (
    ATTEMPTS_HEADER,
    RETRY_REASON_HEADER,
    Envelope,
    capped,
    clipped_body,
    dead_letter_headers,
)
from application.errors import TransientError
from application.ports import Delivery


class Settling(Protocol):
    """What a delivery settles through: its source (`RabbitSource`)."""

    connection: RabbitConnection
    service_user: str | None
    dead_letters: DeadLetterGate

    @property
    def stopped(self) -> bool:
        """Whether the source was stopped."""

    def retry_queue(self, delay_s: float) -> str:
        """The retry queue for a delay of `delay_s` seconds."""

    async def ack(self, message: AbstractIncomingMessage, message_id: object) -> None:
        """Ack `message` (raises `TransientError`)."""

    def settled_one(self) -> None:
        """A delivery was settled, or failed to: its slot is free again."""

    async def requeue(self, message: AbstractIncomingMessage) -> None:
        """`basic.reject` of `message` with requeue, told to the channel's acks; a channel
        that closed meanwhile has requeued it (no error)."""


def channel_lost(message: AbstractIncomingMessage) -> bool:
    """Whether `message`'s channel is gone (the broker has requeued it: it cannot be
    settled)."""
    try:
        return message.channel.is_closed
    except ChannelInvalidStateError:  # raised by the property itself once the channel closed
        return True


class RabbitDelivery(Delivery):
    """One unacked delivery of the work queue. Retry and dead-letter publish a copy, wait for
    its publisher confirm, THEN ack the original: a crash in between leaves two copies (the
    protocol drops one), the reverse order could lose the message. A delivery whose channel
    is gone cannot be settled (the broker has requeued it already): settling raises
    `TransientError` at once and publishes no copy. A copy the broker does not confirm (a
    nack: a quorum queue electing its leader after a node's loss; a timeout) returns the
    original to the queue (`basic.reject` with requeue) before the `TransientError` is
    raised: on a channel that stays open nothing else would, and the delivery would stay
    unacked until the process ends. Settling twice is a no-op."""

    def __init__(self, message: AbstractIncomingMessage, envelope: Envelope, attempt: int,
                 source: Settling) -> None:
        self.envelope = envelope
        self.attempt = attempt
        self._message = message
        self._source = source
        self._settled = False
        self._counted = False

    async def ack(self) -> None:
        """Remove the delivery from the work queue."""
        await self._settle(None)

    async def retry(self, delay_s: float, reason: str) -> None:
        """Redeliver after the retry queue delay that is the smallest >= `delay_s` seconds
        (else the longest), with `eo-attempts` = this attempt and `eo-retry-reason`."""
        copy = envelope_message(self.envelope, {ATTEMPTS_HEADER: str(self.attempt),
                                                RETRY_REASON_HEADER: capped(reason)},
                                self._source.service_user)
        queue = self._source.retry_queue(delay_s)
        await self._settle(lambda: self._source.connection.publish(queue, copy))

    async def dead_letter(self, reason: str, endpoint: str, body_limit: int | None = None
                          ) -> None:
        """Move to `<endpoint>.dlq` with `eo-reason`, `eo-endpoint`, `eo-attempts` and
        `eo-dead-lettered-at` (and, with `body_limit`, a clipped body with its size and
        SHA-256). While the dead-letter queue refuses the copy (full), this waits, holding
        the delivery, and the source takes no new one (`DeadLetterGate.publish`);
        raises `TransientError` when the delivery's channel is lost or the source stops
        meanwhile (the broker redelivers it: nothing is lost)."""
        envelope = self.envelope
        headers = dead_letter_headers(reason, endpoint, self.attempt, datetime.now(UTC))
        if body_limit is not None:
            body, sizes = clipped_body(envelope.body, body_limit)
            envelope = replace(envelope, body=body)
            headers.update(sizes)
        copy = envelope_message(envelope, headers, self._source.service_user)
        source = self._source
        await self._settle(lambda: source.dead_letters.publish(
            copy, lambda: not channel_lost(self._message), lambda: source.stopped))

    async def release(self) -> None:
        """`Delivery.release`: `basic.reject` with requeue, unless a settlement was
        attempted or the channel is gone."""
        if self._settled:
            return
        self._settled = True
        try:
            await self._requeued()
        finally:
            self._free_slot()

    def _free_slot(self) -> None:
        """Settled or not, the delivery no longer holds a slot of the channel (once)."""
        if not self._counted:
            self._counted = True
            self._source.settled_one()

    async def _requeued(self) -> None:
        if not channel_lost(self._message):
            await self._source.requeue(self._message)

    async def _settle(self, publish: Callable[[], Awaitable[None]] | None) -> None:
        """Publish the copy (`publish`, confirmed), then ack the original."""
        if self._settled:
            return
        self._settled = True  # before the first await: a concurrent settle is a no-op
        try:
            if channel_lost(self._message):
                raise TransientError(f"{self.envelope.message_id}: its channel is closed, "
                                     "the broker redelivers it")
            if publish is not None:
                try:
                    await publish()
                except TransientError:
                    await self._requeued()
                    raise
            await self._source.ack(self._message, self.envelope.message_id)
        finally:
            self._free_slot()
