"""Envelopes as AMQP messages (both ways) and their publisher-confirmed dispatch."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.topology import queue_names
from application.envelope import (
    ATTEMPTS_HEADER,
    NO_MESSAGE_ID_HEADER,
    PRODUCER_HEADER,
    Envelope,
    admitted,
)
from application.errors import MalformedMessage
from application.ports import DeadLetterPublisher, MessageDispatcher

CONTENT_TYPE = "application/json"


def amqp_message(message_id: str | None, type_: str | None, body: bytes,
                 headers: Mapping[str, str], user_id: str | None = None) -> aio_pika.Message:
    """A persistent AMQP message with these properties (the envelope's fields, or the raw
    ones of a message that never became an envelope). `user_id`: the publishing
    connection's user (RabbitMQ refuses another), or None."""
    return aio_pika.Message(
        body, headers=dict(headers), content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=message_id, type=type_,
        user_id=user_id)


def envelope_message(envelope: Envelope, extra_headers: Mapping[str, str] | None = None,
                     user_id: str | None = None) -> aio_pika.Message:
    """The AMQP message of `envelope`: `message_id` = str(message ID), `type`, body and
    headers, plus `extra_headers` (which win over the envelope's). An envelope with a
    producer carries it in `eo-producer`, which the receiving source trusts only on a
    message whose `user_id` is the service's own: so a copy the service publishes (a retry,
    a dead letter, a replay, a relayed inbox row) keeps its producer when published with
    `user_id` = the service's user."""
    headers = {**envelope.headers, **(extra_headers or {})}
    headers.pop(PRODUCER_HEADER, None)  # only the envelope's own producer travels
    if envelope.producer:
        headers[PRODUCER_HEADER] = envelope.producer
    return amqp_message(envelope.id_text, envelope.type, envelope.body, headers, user_id)


def text_headers(raw: Mapping[str, Any] | None) -> dict[str, str]:
    """AMQP headers as an envelope's strings: bytes decoded as UTF-8 (a byte that is not
    becomes a lone surrogate, `surrogateescape`, as in the names: adapters/rabbitmq/wire.py),
    other values str(). Broker headers (`x-delivery-count`, `x-death`, ...) are dropped: they
    describe the transport, not the message, and a redelivery must not change the
    envelope."""
    headers: dict[str, str] = {}
    for name, value in (raw or {}).items():
        if name.startswith("x-"):
            continue
        is_bytes = isinstance(value, bytes | bytearray)
        headers[name] = value.decode(errors="surrogateescape") if is_bytes else str(value)
    return headers


def attempt_of(headers: Mapping[str, str]) -> int:
    """`eo-attempts` + 1 (1 when absent or not an integer). Redeliveries after a lost
    connection (`x-delivery-count`) are not attempts: the handler never finished them."""
    try:
        return max(int(headers.get(ATTEMPTS_HEADER, "0")), 0) + 1
    except ValueError:
        return 1


def producer_of(user_id: str | None, headers: Mapping[str, str],
                service_user: str | None) -> str:
    """The authenticated producer of a delivery (`Envelope.producer`). RabbitMQ checks a
    message's `user_id` against the user of the connection that published it and refuses
    another value (unless that user has the `impersonator` tag: give it to no producer), so
    a `user_id` names its producer. On a message the service itself published (`user_id` =
    `service_user`: a retry, a dead letter, a replay, a relayed inbox row) the producer is
    the `eo-producer` header the service wrote; "" when that header is absent or when there
    is no `user_id` (an unauthenticated producer)."""
    if not user_id:
        return ""
    if service_user is not None and user_id == service_user:
        return headers.get(PRODUCER_HEADER, "")
    return user_id


def envelope_of(message: AbstractIncomingMessage, max_body_bytes: int,
                kept_headers: Collection[str] = (), service_user: str | None = None,
                require_producer: bool = False) -> Envelope:
    """The envelope carried by `message` (its protocol headers and `kept_headers` only, its
    producer by `producer_of`); raises `MalformedMessage` with the reason when the body
    exceeds `max_body_bytes` or `message_id` (a UUID) or `type` is missing, or, with
    `require_producer` (a gateway in production), when no `user_id` authenticates the
    producer. A dead-lettered copy of a message that came without an ID carries
    `NO_MESSAGE_ID_HEADER`: aiormq gives every message published without an ID a random
    one, so without this mark a replay would pass as a valid message."""
    headers = text_headers(message.headers or {})
    message_id = None if NO_MESSAGE_ID_HEADER in headers else message.message_id
    envelope = admitted(message_id, message.type, message.body, headers, max_body_bytes,
                        kept_headers, producer_of(message.user_id, headers, service_user))
    if require_producer and not message.user_id:
        raise MalformedMessage("no user_id: this gateway takes messages of authenticated "
                               "producers only (the AMQP user_id property, which RabbitMQ "
                               "checks against the publishing user; EO_ALLOW_ANONYMOUS_"
                               "PRODUCERS=true accepts others)")
    return envelope


class RabbitDispatcher(MessageDispatcher):
    """Publishes envelopes persistently to the queue named by the destination endpoint, on
    the connection's publisher-confirm channel, with `user_id` = `service_user` (the
    connection's user, when known: an envelope's producer then travels trusted, see
    `envelope_message`). `published` counts confirmed dispatches."""

    def __init__(self, connection: RabbitConnection, service_user: str | None = None) -> None:
        self._connection = connection
        self.service_user = service_user
        self.published = 0

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        """Publish `envelope` to queue `destination`; returns once the broker confirmed it.
        Raises `TransientError` on a nack, when `destination` has no queue (the endpoint's
        topology is not declared yet), or when the broker is unreachable."""
        await self._connection.publish(destination,
                                       envelope_message(envelope, user_id=self.service_user))
        self.published += 1


class RabbitDeadLetters(DeadLetterPublisher):
    """Publishes dead letters outside a delivery (the inbox relay's) to an endpoint's
    dead-letter queue, with `user_id` = `service_user` (so its `eo-producer` is trusted)."""

    def __init__(self, connection: RabbitConnection, service_user: str | None = None) -> None:
        self._connection, self.service_user = connection, service_user

    async def dead_letter(self, endpoint: str, envelope: Envelope) -> None:
        """Publish and wait for the confirm; raises `TransientError` (a `PublishRefused`
        when the queue is full)."""
        await self._connection.publish(queue_names(endpoint).dead_letter,
                                       envelope_message(envelope, user_id=self.service_user))
