"""What the test API and `eo embedded` publish, as outside producers do: the messages RabbitMQ
would deliver and the AMQP source refuse are dead-lettered with their reason, as on real
services; the messages the endpoints send each other are recorded."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from types import MappingProxyType
from typing import Any

from adapters.memory.broker import MemoryBroker
from application.envelope import (
    REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
    admitted,
    capped,
    clipped_body,
    known_headers,
)
from application.errors import MalformedMessage
from application.ports import TokenStore
from application.strategy import Strategy
from entrypoints.service_spec import Service
from entrypoints.settings import Settings

#: Header of a message dead-lettered before processing: its message ID as the producer gave
#: it (which may not be a UUID).
RAW_ID_HEADER = "eo-line-message-id"


class Recording:
    """The system's dispatcher: the broker, keeping what the endpoints send."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.sent: list[tuple[str, Envelope]] = []

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        self.sent.append((destination, envelope))
        await self.broker.dispatch(destination, envelope)


def body_of(value: Any) -> bytes:
    """A raw body: bytes as they are, a string UTF-8, anything else as compact JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


def json_of(body: bytes) -> Any:
    """`body` as JSON, or as text when it is not."""
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


class EmbeddedProducer:
    """Publishes to `broker`'s queues for `service` with `settings`' bounds, creating the
    tokens of messages to `token` endpoints in `tokens`; counts what it published and, per
    queue, what the source would have refused (`refused`)."""

    def __init__(self, settings: Settings, service: Service, broker: MemoryBroker,
                 tokens: TokenStore) -> None:
        self.settings, self.service, self.broker, self.tokens = settings, service, broker, tokens
        self.published = 0
        self.refused: Counter[str] = Counter()
        self._tokens_sent: set[tuple[str, uuid.UUID]] = set()

    async def publish(self, queue: str, raw_id: str | None, type_: str | None, body: bytes,
                      headers: dict[str, str]) -> None:
        """Publish a message to `queue` as the AMQP source would receive it: admitted (a
        UUID message ID, a type, a body within `EO_MAX_BODY_BYTES`) or dead-lettered with
        its reason (`RAW_ID_HEADER`: the message ID as given); to a `token` endpoint with
        the message's token, created once per message ID."""
        settings = self.settings
        self.published += 1
        try:
            envelope = admitted(raw_id, type_, body, headers, settings.protocol.max_body_bytes,
                                settings.protocol.kept_headers)
        except MalformedMessage as exc:  # what the AMQP source does before any processing
            clipped, sizes = clipped_body(body, settings.protocol.dead_letter_body_bytes)
            self.broker.dead_letters[queue].append(Envelope(
                uuid.uuid4(), str(type_ or ""), clipped,
                MappingProxyType({**known_headers(headers, settings.protocol.kept_headers), **sizes,
                                  REASON_HEADER: capped(exc.reason),
                                  RAW_ID_HEADER: "" if raw_id is None else capped(raw_id)})))
            self.refused[queue] += 1
            return
        if self.service.strategy(queue) is Strategy.TOKEN:
            # outside producers cannot feed a token endpoint on real services: the test
            # sends as an upstream endpoint would, creating the message's token once (never
            # again for a copy, protocol 3.3, so a copy after the first was consumed is a
            # duplicate)
            envelope = Envelope(envelope.message_id, envelope.type, body,
                                MappingProxyType({**envelope.headers, TOKEN_HEADER: "1"}))
            if (queue, envelope.message_id) not in self._tokens_sent:
                self._tokens_sent.add((queue, envelope.message_id))
                await self.tokens.create(queue, [envelope])
        self.broker.publish(queue, envelope)
