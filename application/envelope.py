"""The transport-level message: ID, type, body and protocol headers."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import overload

from application.errors import MalformedMessage
from application.wire_text import clean, escaped

#: Header of a message dispatched by a token-based sender: a token exists for it.
TOKEN_HEADER = "eo-token"
#: Header of an HTTP follow-up message: the URL of the request stored on the callee.
REQUEST_URL_HEADER = "eo-request-url"
#: Dead-letter headers (protocol 7).
REASON_HEADER = "eo-reason"
ENDPOINT_HEADER = "eo-endpoint"
ATTEMPTS_HEADER = "eo-attempts"
#: Header of a dead-letter copy: when it was dead-lettered (ISO 8601, UTC), so the
#: dead-letter store keeps one history entry per time even if it receives the copy twice.
DEAD_LETTERED_AT_HEADER = "eo-dead-lettered-at"
#: Header of the dead letter of an inbox row that could not be relayed: its message type
#: (capped), which the copy's own AMQP `type` cannot carry when it is what the broker refuses.
TYPE_HEADER = "eo-type"
#: Header of a delayed-retry copy: why the previous attempt failed.
RETRY_REASON_HEADER = "eo-retry-reason"
#: Header of a dead-lettered copy of a message that came without a message ID.
NO_MESSAGE_ID_HEADER = "eo-no-message-id"
#: Headers of a dead letter whose body was clipped: the original body's size (bytes) and
#: SHA-256 (hex).
BODY_BYTES_HEADER = "eo-body-bytes"
BODY_SHA256_HEADER = "eo-body-sha256"
#: Lineage headers of every message an endpoint sends (protocol 9): the message ID an outside
#: producer gave the business message that started the chain, that producer's authenticated
#: identity (when it had one), and the ID of the message whose processing sent this one.
ORIGIN_ID_HEADER = "eo-origin-id"
ORIGIN_PRODUCER_HEADER = "eo-origin-producer"
CAUSATION_ID_HEADER = "eo-causation-id"
#: Header of a copy the service itself publishes of an outside producer's message (a retry,
#: a dead letter, a replay, an inbox row relayed): the producer it came from. Trusted only on
#: a delivery the service's own broker user published (`Envelope.producer`).
PRODUCER_HEADER = "eo-producer"
#: A follow-up that calls a third-party API (protocol 12): the committed request (JSON: `api`,
#: `method`, `path`, `body`, `prepared_at`), and the time after which it must never be sent
#: (ISO 8601, UTC: its preparation plus the API's key retention), short enough never to be
#: capped, so a dead letter's copy keeps it for the replay's check.
API_CALL_HEADER = "eo-api-call"
API_DEADLINE_HEADER = "eo-api-deadline"
#: The W3C trace context of the message (`traceparent`, `tracestate`): the trace of the attempt
#: that sent it, or an outside producer's. Written with the message when it is prepared, so it
#: is part of the committed message; only tracing reads it (`application.ports.Tracer`).
TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
TRACE_HEADERS = (TRACEPARENT_HEADER, TRACESTATE_HEADER)
#: The prefix of the protocol's headers: only this service's senders set them.
PROTOCOL_PREFIX = "eo-"
#: The protocol's headers: the only ones a delivery keeps (with those a service names in
#: `EO_KEPT_HEADERS`); anything else a producer sets is dropped on arrival.
PROTOCOL_HEADERS = frozenset({
    TOKEN_HEADER, REQUEST_URL_HEADER, REASON_HEADER, ENDPOINT_HEADER, ATTEMPTS_HEADER,
    RETRY_REASON_HEADER, NO_MESSAGE_ID_HEADER, BODY_BYTES_HEADER, BODY_SHA256_HEADER,
    ORIGIN_ID_HEADER, ORIGIN_PRODUCER_HEADER, CAUSATION_ID_HEADER, PRODUCER_HEADER,
    API_CALL_HEADER, API_DEADLINE_HEADER, *TRACE_HEADERS,
})
#: The longest header value a copy carries (characters); longer ones are cut, marked "…".
MAX_HEADER_CHARS = 1024

_EMPTY: Mapping[str, str] = MappingProxyType({})


class _IdText:
    """`Envelope.id_text`: formatted on first use and kept in the instance (a non-data
    descriptor without `functools.cached_property`'s lock, which costs more than the
    formatting it saves)."""

    @overload
    def __get__(self, envelope: None, owner: type) -> _IdText: ...

    @overload
    def __get__(self, envelope: Envelope, owner: type) -> str: ...

    def __get__(self, envelope: Envelope | None, owner: type) -> _IdText | str:
        if envelope is None:
            return self
        text = envelope.__dict__["id_text"] = str(envelope.message_id)
        return text


@dataclass(frozen=True)
class Envelope:
    """One message as it travels and as a token stores it (claim check).

    - `message_id`: the sender-assigned ID shared by every copy.
    - `type`: the registered message type name (AMQP `type`).
    - `body`: UTF-8 JSON bytes of the message.
    - `headers`: protocol headers (`eo-token`, `eo-request-url`, ...), strings only.
    - `producer`: the authenticated identity of the outside producer that sent it, as the
      transport vouches for it (RabbitMQ's validated `user_id`, an inbox row's database
      role); "" when unauthenticated or sent by the service itself. A gateway's
      deduplication is scoped to it (protocol 4), so one producer cannot squat another's
      message IDs. Never taken from a header the producer wrote.
    """

    message_id: uuid.UUID
    type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    producer: str = ""

    #: `str(message_id)`, formatted once per envelope (an attempt's events, its lineage
    #: headers and the AMQP properties all need it); not a field
    id_text = _IdText()

    def without(self, *names: str) -> Envelope:
        """This envelope without the headers `names` (itself when it has none of them)."""
        if not any(name in self.headers for name in names):
            return self
        kept = {k: v for k, v in self.headers.items() if k not in names}
        return Envelope(self.message_id, self.type, self.body, MappingProxyType(kept),
                        self.producer)

    def from_outside(self) -> Envelope:
        """This envelope without the protocol's (`eo-*`) headers: what an endpoint fed by
        outside producers (the outbox path) may trust of a delivery. A token or request URL
        header there is a producer's claim, never ours."""
        return self.without(*(k for k in self.headers if k.startswith(PROTOCOL_PREFIX)))

    @property
    def body_sha256(self) -> str:
        """The SHA-256 of the body, hex (the `body_sha256` of `message.received`, with which
        a log audit checks I2; rows written before revision 0010 kept it as their digest)."""
        return hashlib.sha256(self.body).hexdigest()

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the type and the body: what positive-proof deduplication keeps
        to tell a copy (same ID, same type and body) from another message under a known ID.
        The type is length-prefixed (`<length>:<type>` in UTF-8, then the body), so no
        (type, body) pair hashes as another."""
        kind = self.type.encode()
        return hashlib.sha256(b"%d:%s" % (len(kind), kind) + self.body).hexdigest()

    def same_message(self, digest: str | None, body_sha256: str | None) -> bool:
        """Whether a stored proof of processing (its `digest`, or for a row written before
        revision 0010 only its `body_sha256`) is this message's: a copy, not another message
        under its ID. A proof that kept neither matches (rows from before 0005)."""
        if digest is not None:
            return digest == self.digest
        return body_sha256 is None or body_sha256 == self.body_sha256

    def header(self, name: str) -> str | None:
        """The header `name`, or None."""
        return self.headers.get(name)


def admitted(message_id: str | None, type_: str | None, body: bytes,
             headers: Mapping[str, str], max_body_bytes: int,
             kept_headers: Collection[str] = (), producer: str = "") -> Envelope:
    """The envelope of a delivery as a transport received it, or why the service cannot take
    it: `MalformedMessage` when the body is over `max_body_bytes` (bytes), `message_id` is
    missing or empty or not a UUID, `type` is missing, or the message ID, the type or a kept
    header's value is not `application.wire_text.clean` text. One check for every
    transport (the AMQP source, `eo embedded`), so their dead-letter reasons are the same.
    The envelope keeps only the `known_headers` (with `kept_headers`); `producer` is the
    identity the transport authenticated (see `Envelope.producer`)."""
    if (size := len(body)) > max_body_bytes:
        raise MalformedMessage(f"body of {size} bytes exceeds the limit of {max_body_bytes}")
    if not message_id:
        raise MalformedMessage("no message_id")
    try:
        parsed = uuid.UUID(message_id)
    except ValueError:
        _check_clean("message_id", message_id)
        raise MalformedMessage(f"message_id {message_id[:80]!r} is not a UUID") from None
    if not type_:
        raise MalformedMessage("no type")
    _check_clean("type", type_)
    kept = known_headers(headers, kept_headers)
    for name, value in kept.items():
        _check_clean(f"header {name}", value)
    kept.pop(PRODUCER_HEADER, None)  # a claim of whoever wrote it: the transport's `producer` is
    return Envelope(parsed, type_, body, MappingProxyType(kept), producer)


def _check_clean(what: str, text: str) -> None:
    """Raise `MalformedMessage` when `text` (a delivery's `what`) is not `clean` text."""
    if not clean(text):
        raise MalformedMessage(f"{what} '{escaped(text[:80])}' holds U+0000 or bytes that are "
                               "not UTF-8: not text a store can keep")


def lineage(incoming: Envelope) -> dict[str, str]:
    """The lineage headers of a message sent while processing `incoming` (protocol 9):
    `eo-origin-id` and `eo-origin-producer` carried on from `incoming`, or, on a message
    without them (an outside producer's at a gateway: the chain starts there), its own
    message ID and producer; `eo-causation-id` = `incoming`'s message ID. Tracing and
    dead-letter matching read them; no decision of the protocol does."""
    origin = incoming.header(ORIGIN_ID_HEADER)
    producer = incoming.header(ORIGIN_PRODUCER_HEADER) if origin else incoming.producer
    headers = {ORIGIN_ID_HEADER: origin or incoming.id_text,
               CAUSATION_ID_HEADER: incoming.id_text}
    if producer:
        headers[ORIGIN_PRODUCER_HEADER] = producer
    return headers


def dead_letter_headers(reason: str, endpoint: str, attempt: int, at: datetime
                        ) -> dict[str, str]:
    """The headers a dead-letter copy adds (protocol 7): why (`reason`, capped), which
    endpoint, on which attempt, and when (`at`, UTC)."""
    return {REASON_HEADER: capped(reason), ENDPOINT_HEADER: endpoint,
            ATTEMPTS_HEADER: str(attempt), DEAD_LETTERED_AT_HEADER: at.isoformat()}


def capped(value: str, limit: int = MAX_HEADER_CHARS) -> str:
    """`value`, cut to `limit` characters (the last one "…") when longer."""
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


def known_headers(headers: Mapping[str, str], kept: Collection[str] = ()
                  ) -> dict[str, str]:
    """The protocol's headers of `headers` and those named in `kept`, each value `capped`:
    what a delivery keeps, so its retry and dead-letter copies cannot grow with what a
    producer adds (docs/security.md)."""
    return {name: capped(value) for name, value in headers.items()
            if name in PROTOCOL_HEADERS or name in kept}


def clipped_body(body: bytes, limit: int) -> tuple[bytes, dict[str, str]]:
    """The body a dead letter of a malformed or oversize message carries: at most `limit`
    bytes of it, with its size and SHA-256 as headers (`BODY_BYTES_HEADER`,
    `BODY_SHA256_HEADER`). Such a message cannot be replayed, so its whole body would only
    fill the dead-letter queue."""
    return body[: max(limit, 0)], {BODY_BYTES_HEADER: str(len(body)),
                                   BODY_SHA256_HEADER: hashlib.sha256(body).hexdigest()}
