"""Admission of a work queue's deliveries: each becomes an envelope (`envelope_of`), or is
dead-lettered here with the reason, never reaching a handler (protocol 7)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.dead_letter_queue import DeadLetterGate
from adapters.rabbitmq.delivery import channel_lost
from adapters.rabbitmq.dispatcher import (
    amqp_message,
    attempt_of,
    envelope_of,
    producer_of,
    text_headers,
)
from adapters.rabbitmq.errors import translated
from application import defaults
from application.envelope import (
    BODY_BYTES_HEADER,
    NO_MESSAGE_ID_HEADER,
    PRODUCER_HEADER,
    Envelope,
    clipped_body,
    dead_letter_headers,
    known_headers,
)
from application.errors import TransientError
from application.observability import MESSAGE_DEAD_LETTERED
from application.ports import EventSink
from application.wire_text import escaped

log = logging.getLogger(__name__)


@dataclass
class Admission:
    """What endpoint `endpoint` takes of a delivery: at most `max_body_bytes` of body, a
    UUID message ID and a type, the protocol's headers and `kept_headers`, its producer as
    `service_user` vouches for it, and with `require_producer` (a gateway in production) a
    `user_id`. A delivery that fails is dead-lettered through `dead_letters` with the reason
    and at most `dead_letter_body_bytes` of its body (plus its size and SHA-256), counted in
    `dead_lettered`."""

    endpoint: str
    dead_letters: DeadLetterGate
    events: EventSink | None = None
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    dead_letter_body_bytes: int = defaults.DEAD_LETTER_BODY_BYTES
    kept_headers: Collection[str] = field(default_factory=frozenset)
    service_user: str | None = None
    require_producer: bool = False
    #: messages dead-lettered here (never yielded)
    dead_lettered: int = 0

    def envelope(self, message: AbstractIncomingMessage) -> Envelope:
        """The envelope of `message`; raises `MalformedMessage` with the reason."""
        return envelope_of(message, self.max_body_bytes, self.kept_headers, self.service_user,
                           self.require_producer)

    async def reject(self, message: AbstractIncomingMessage, reason: str,
                     stopped: Callable[[], bool],
                     requeue: Callable[[AbstractIncomingMessage], Awaitable[None]],
                     settled_singly: Callable[[AbstractIncomingMessage], None]) -> None:
        """Dead-letter a message that cannot become an envelope, with a clipped body (it
        cannot be replayed): the copy, then the ack (`settled_singly` told). Waits while the
        dead-letter queue is full (`DeadLetterGate.publish`, until `stopped`); when the copy
        or the ack fails the message is requeued (`requeue`; the work queue's delivery limit
        bounds that loop)."""
        raw = text_headers(message.headers)
        headers = known_headers(raw, self.kept_headers)
        headers.pop(PRODUCER_HEADER, None)  # a producer's own claim: never passed on
        producer = producer_of(message.user_id, raw, self.service_user)
        if producer:
            headers[PRODUCER_HEADER] = producer
        attempt = attempt_of(headers)
        body, sizes = clipped_body(message.body, self.dead_letter_body_bytes)
        if BODY_BYTES_HEADER in headers:  # clipped before (a replayed dead letter)
            sizes = {}
        headers.update({**dead_letter_headers(reason, self.endpoint, attempt,
                                              datetime.now(UTC)), **sizes})
        if not message.message_id:
            headers[NO_MESSAGE_ID_HEADER] = "true"
        copy = amqp_message(message.message_id, message.type, body, headers,
                            self.service_user)
        try:
            await self.dead_letters.publish(copy, lambda: not channel_lost(message), stopped)
            with translated("ack of a rejected message"):
                await message.ack()
            settled_singly(message)
        except TransientError as exc:
            log.warning("dead-lettering an invalid message of %s failed: %s", self.endpoint, exc)
            await requeue(message)
            return
        self.dead_lettered += 1
        if self.events is not None:  # counted like every other dead letter (protocol 7, 9)
            self.events.emit(MESSAGE_DEAD_LETTERED, endpoint=self.endpoint,
                             message_id=escaped(message.message_id or "") or None,
                             reason=reason, attempt=attempt)
        else:
            log.warning("invalid message on %s dead-lettered: %s", self.endpoint, reason)
