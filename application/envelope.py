"""The transport-level message: ID, type, body and protocol headers."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from application.errors import MalformedMessage

#: Header of a message dispatched by a token-based sender: a token exists for it.
TOKEN_HEADER = "eo-token"
#: Header of an HTTP follow-up message: the URL of the request stored on the callee.
REQUEST_URL_HEADER = "eo-request-url"
#: Dead-letter headers (protocol 7).
REASON_HEADER = "eo-reason"
ENDPOINT_HEADER = "eo-endpoint"
ATTEMPTS_HEADER = "eo-attempts"
#: Header of a delayed-retry copy: why the previous attempt failed.
RETRY_REASON_HEADER = "eo-retry-reason"
#: Header of a dead-lettered copy of a message that came without a message ID.
NO_MESSAGE_ID_HEADER = "eo-no-message-id"
#: Headers of a dead letter whose body was clipped: the original body's size (bytes) and
#: SHA-256 (hex).
BODY_BYTES_HEADER = "eo-body-bytes"
BODY_SHA256_HEADER = "eo-body-sha256"
#: The prefix of the protocol's headers: only this service's senders set them.
PROTOCOL_PREFIX = "eo-"
#: The protocol's headers: the only ones a delivery keeps (with those a service names in
#: `EO_KEPT_HEADERS`); anything else a producer sets is dropped on arrival.
PROTOCOL_HEADERS = frozenset({
    TOKEN_HEADER, REQUEST_URL_HEADER, REASON_HEADER, ENDPOINT_HEADER, ATTEMPTS_HEADER,
    RETRY_REASON_HEADER, NO_MESSAGE_ID_HEADER, BODY_BYTES_HEADER, BODY_SHA256_HEADER,
})
#: The longest header value a copy carries (characters); longer ones are cut, marked "…".
MAX_HEADER_CHARS = 1024

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Envelope:
    """One message as it travels and as a token stores it (claim check).

    - `message_id`: the sender-assigned ID shared by every copy.
    - `type`: the registered message type name (AMQP `type`).
    - `body`: UTF-8 JSON bytes of the message.
    - `headers`: protocol headers (`eo-token`, `eo-request-url`, ...), strings only.
    """

    message_id: uuid.UUID
    type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    def without(self, *names: str) -> Envelope:
        """This envelope without the headers `names` (itself when it has none of them)."""
        if not any(name in self.headers for name in names):
            return self
        kept = {k: v for k, v in self.headers.items() if k not in names}
        return Envelope(self.message_id, self.type, self.body, MappingProxyType(kept))

    def from_outside(self) -> Envelope:
        """This envelope without the protocol's (`eo-*`) headers: what an endpoint fed by
        outside producers (the outbox path) may trust of a delivery. A token or request URL
        header there is a producer's claim, never ours."""
        return self.without(*(k for k in self.headers if k.startswith(PROTOCOL_PREFIX)))

    @property
    def body_sha256(self) -> str:
        """The SHA-256 of the body, hex: what positive-proof deduplication keeps to tell a
        copy (same ID, same body) from another message under a known ID."""
        return hashlib.sha256(self.body).hexdigest()

    def header(self, name: str) -> str | None:
        """The header `name`, or None."""
        return self.headers.get(name)


def admitted(message_id: str | None, type_: str | None, body: bytes,
             headers: Mapping[str, str], max_body_bytes: int,
             kept_headers: Collection[str] = ()) -> Envelope:
    """The envelope of a delivery as a transport received it, or why the service cannot take
    it: `MalformedMessage` when the body is over `max_body_bytes` (bytes), `message_id` is
    missing or empty or not a UUID, or `type` is missing. One check for every transport (the
    AMQP source, `eo embedded`), so their dead-letter reasons are the same. The envelope
    keeps only the `known_headers` (with `kept_headers`)."""
    if (size := len(body)) > max_body_bytes:
        raise MalformedMessage(f"body of {size} bytes exceeds the limit of {max_body_bytes}")
    if not message_id:
        raise MalformedMessage("no message_id")
    try:
        parsed = uuid.UUID(message_id)
    except ValueError:
        raise MalformedMessage(f"message_id {message_id[:80]!r} is not a UUID") from None
    if not type_:
        raise MalformedMessage("no type")
    return Envelope(parsed, type_, body, MappingProxyType(known_headers(headers, kept_headers)))


def capped(value: str, limit: int = MAX_HEADER_CHARS) -> str:
    """`value`, cut to `limit` characters (the last one "…") when longer."""
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


def known_headers(headers: Mapping[str, str], kept: Collection[str] = ()
                  ) -> dict[str, str]:
    """The protocol's headers of `headers` and those named in `kept`, each value `capped`:
    what a delivery keeps, so its retry and dead-letter copies cannot grow with what a
    producer adds (the security review measured a 6x growth)."""
    return {name: capped(value) for name, value in headers.items()
            if name in PROTOCOL_HEADERS or name in kept}


def clipped_body(body: bytes, limit: int) -> tuple[bytes, dict[str, str]]:
    """The body a dead letter of a malformed or oversize message carries: at most `limit`
    bytes of it, with its size and SHA-256 as headers (`BODY_BYTES_HEADER`,
    `BODY_SHA256_HEADER`). Such a message cannot be replayed, so its whole body would only
    fill the dead-letter queue."""
    return body[: max(limit, 0)], {BODY_BYTES_HEADER: str(len(body)),
                                   BODY_SHA256_HEADER: hashlib.sha256(body).hexdigest()}
