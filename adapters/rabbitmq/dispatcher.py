"""Envelopes as AMQP messages (both ways) and their publisher-confirmed dispatch."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.connection import RabbitConnection
from application.envelope import ATTEMPTS_HEADER, Envelope
from application.errors import MalformedMessage
from application.ports import MessageDispatcher

CONTENT_TYPE = "application/json"


def amqp_message(message_id: str | None, type_: str | None, body: bytes,
                 headers: Mapping[str, str]) -> aio_pika.Message:
    """A persistent AMQP message with these properties (the envelope's fields, or the raw
    ones of a message that never became an envelope)."""
    return aio_pika.Message(
        body, headers=dict(headers), content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=message_id, type=type_)


def envelope_message(envelope: Envelope, extra_headers: Mapping[str, str] | None = None,
                     ) -> aio_pika.Message:
    """The AMQP message of `envelope`: `message_id` = str(message ID), `type`, body and
    headers, plus `extra_headers` (which win over the envelope's)."""
    headers = {**envelope.headers, **(extra_headers or {})}
    return amqp_message(str(envelope.message_id), envelope.type, envelope.body, headers)


def text_headers(raw: Mapping[str, Any] | None) -> dict[str, str]:
    """AMQP headers as an envelope's strings: bytes decoded as UTF-8, other values str().
    Broker headers (`x-delivery-count`, `x-death`, ...) are dropped: they describe the
    transport, not the message, and a redelivery must not change the envelope."""
    headers: dict[str, str] = {}
    for name, value in (raw or {}).items():
        if name.startswith("x-"):
            continue
        is_bytes = isinstance(value, bytes | bytearray)
        headers[name] = value.decode(errors="replace") if is_bytes else str(value)
    return headers


def attempt_of(headers: Mapping[str, str]) -> int:
    """`eo-attempts` + 1 (1 when absent or not an integer). Redeliveries after a lost
    connection (`x-delivery-count`) are not attempts: the handler never finished them."""
    try:
        return max(int(headers.get(ATTEMPTS_HEADER, "0")), 0) + 1
    except ValueError:
        return 1


#: Marks a dead-lettered copy of a message that came without a message ID: aiormq gives every
#: published message an ID, so without this mark a replay would pass as a valid message.
NO_MESSAGE_ID_HEADER = "eo-no-message-id"


def envelope_of(message: AbstractIncomingMessage, max_body_bytes: int) -> Envelope:
    """The envelope carried by `message`; raises `MalformedMessage` with the reason when the
    body exceeds `max_body_bytes` or `message_id` (a UUID) or `type` is missing."""
    if (size := len(message.body)) > max_body_bytes:
        raise MalformedMessage(f"body of {size} bytes exceeds the limit of {max_body_bytes}")
    if not message.message_id or NO_MESSAGE_ID_HEADER in (message.headers or {}):
        raise MalformedMessage("no message_id")
    try:
        message_id = uuid.UUID(message.message_id)
    except ValueError:
        raise MalformedMessage(f"message_id {message.message_id[:80]!r} is not a UUID") from None
    if not message.type:
        raise MalformedMessage("no type")
    return Envelope(message_id, message.type, message.body,
                    MappingProxyType(text_headers(message.headers)))


class RabbitDispatcher(MessageDispatcher):
    """Publishes envelopes persistently to the queue named by the destination endpoint, on
    the connection's publisher-confirm channel. `published` counts confirmed dispatches."""

    def __init__(self, connection: RabbitConnection) -> None:
        self._connection = connection
        self.published = 0

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        """Publish `envelope` to queue `destination`; returns once the broker confirmed it.
        Raises `TransientError` on a nack, when `destination` has no queue (the endpoint's
        topology is not declared yet), or when the broker is unreachable."""
        await self._connection.publish(destination, envelope_message(envelope))
        self.published += 1
