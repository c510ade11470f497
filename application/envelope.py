"""The transport-level message: ID, type, body and protocol headers."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

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

    def header(self, name: str) -> str | None:
        """The header `name`, or None."""
        return self.headers.get(name)
