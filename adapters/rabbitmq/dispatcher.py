"""Envelopes as AMQP messages (both ways) and their publisher-confirmed dispatch."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.connection import RabbitConnection
from application.envelope import ATTEMPTS_HEADER, NO_MESSAGE_ID_HEADER, Envelope, admitted
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


def envelope_of(message: AbstractIncomingMessage, max_body_bytes: int,
                kept_headers: Collection[str] = ()) -> Envelope:
    """The envelope carried by `message` (its protocol headers and `kept_headers` only);
    raises `MalformedMessage` with the reason when the body exceeds `max_body_bytes` or
    `message_id` (a UUID) or `type` is missing. A dead-lettered copy of a message that came
    without an ID carries `NO_MESSAGE_ID_HEADER`: aiormq gives every published message an
    ID, so without this mark a replay would pass as a valid message."""
    headers = message.headers or {}
    message_id = None if NO_MESSAGE_ID_HEADER in headers else message.message_id
    return admitted(message_id, message.type, message.body, text_headers(headers),
                    max_body_bytes, kept_headers)


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
