"""What a dead-letter copy says: the `DeadLetter` a copy stands for, from what the transport
delivered (its texts made storable, its digest the same for every copy of one message), and
the headers a copy adds that are not the message's own."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from application.envelope import (
    ATTEMPTS_HEADER,
    BODY_BYTES_HEADER,
    BODY_SHA256_HEADER,
    DEAD_LETTERED_AT_HEADER,
    ENDPOINT_HEADER,
    NO_MESSAGE_ID_HEADER,
    ORIGIN_ID_HEADER,
    ORIGIN_PRODUCER_HEADER,
    PRODUCER_HEADER,
    REASON_HEADER,
    RETRY_REASON_HEADER,
)
from application.records import DeadLetter, DeadLetterReason
from application.wire_text import clean, escaped, original

#: Headers a dead-letter or retry copy adds to a message: not the message's own, so a
#: replay drops them (a replayed message starts again at attempt 1).
COPY_HEADERS = frozenset({
    REASON_HEADER, ENDPOINT_HEADER, ATTEMPTS_HEADER, RETRY_REASON_HEADER,
    NO_MESSAGE_ID_HEADER, BODY_BYTES_HEADER, BODY_SHA256_HEADER, PRODUCER_HEADER,
    DEAD_LETTERED_AT_HEADER,
})


def dead_letter_of(endpoint: str, raw_message_id: str | None, type_: str | None, body: bytes,
                   headers: Mapping[str, str], producer: str, at: datetime,
                   broker_reason: str | None = None) -> DeadLetter:
    """The `DeadLetter` a dead-letter copy stands for, from what the transport delivered:
    the copy's message ID as it was (None or not a UUID: kept as `raw_message_id`), type,
    body, text headers and authenticated producer, and `at` (UTC) when the copy carries no
    `eo-dead-lettered-at`. `broker_reason` is the reason of a copy the broker dead-lettered
    itself (no `eo-reason`: the work queue's delivery limit). A clipped body (malformed or
    oversize message) is kept but not replayable.

    Any store can keep the result: every text that is not `application.wire_text.clean`
    (bytes that were not UTF-8, U+0000) is kept `escaped`, its bytes in `originals`, and
    such a dead letter is not replayable (what it holds is not what was sent). Every copy
    of one message gets the same `digest` (`letter_digest`), so a store keeps one entry per
    message, however often and by whichever path it was dead-lettered."""
    originals: dict[str, bytes] = {}

    def kept(field_name: str, text: str | None) -> str | None:
        if text is None or clean(text):
            return text
        originals[field_name] = original(text)
        return escaped(text)

    headers = {kept(f"header name {escaped(k)}", k) or "": kept(f"header {escaped(k)}", v) or ""
               for k, v in headers.items()}
    raw_message_id, type_ = kept("message_id", raw_message_id), kept("type", type_)
    producer = kept("producer", producer) or ""
    message_id = None
    if raw_message_id and NO_MESSAGE_ID_HEADER not in headers:
        try:
            message_id = uuid.UUID(raw_message_id)
        except ValueError:
            message_id = None
    try:
        attempt = max(int(headers.get(ATTEMPTS_HEADER, "1")), 1)
    except ValueError:
        attempt = 1
    stamped = headers.get(DEAD_LETTERED_AT_HEADER)
    try:
        when = datetime.fromisoformat(stamped) if stamped else at
    except ValueError:
        when = at
    if when.tzinfo is None:  # a forged or odd stamp: read as UTC, as every stamp is
        when = when.replace(tzinfo=UTC)
    reason = headers.get(REASON_HEADER) or broker_reason or "dead-lettered (no reason given)"
    replayable = (message_id is not None and bool(type_) and BODY_BYTES_HEADER not in headers
                  and not originals)
    kept_headers = MappingProxyType({k: v for k, v in headers.items() if k not in COPY_HEADERS})
    return DeadLetter(
        endpoint=headers.get(ENDPOINT_HEADER) or endpoint, message_id=message_id,
        raw_message_id=raw_message_id if message_id is None else None, producer=producer,
        type=type_ or None, body=body, headers=kept_headers,
        digest=letter_digest(type_ or "", body, headers.get(BODY_SHA256_HEADER))
        if raw_message_id else None, replayable=replayable,
        origin_id=headers.get(ORIGIN_ID_HEADER) or (str(message_id) if message_id else None),
        origin_producer=headers.get(ORIGIN_PRODUCER_HEADER) or producer or None,
        reasons=(DeadLetterReason(when, escaped(reason), attempt),),
        originals=MappingProxyType(originals))


def letter_digest(type_: str, body: bytes, body_sha256: str | None = None) -> str:
    """What tells two dead letters under one message ID apart (hex SHA-256): the message's
    `Envelope.digest` (type and body), or for a copy whose body was clipped (`body_sha256`:
    the SHA-256 of the whole body, hex, which the copy carries) the same over the type and
    that hash, so every clipped copy of one message has one digest."""
    kind = type_.encode("utf-8", "surrogatepass")
    content = body if body_sha256 is None else b"clipped:sha256:" + body_sha256.encode(
        "utf-8", "surrogatepass")
    return hashlib.sha256(b"%d:%s" % (len(kind), kind) + content).hexdigest()
