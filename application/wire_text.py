"""Text as a transport delivered it, and as a store can keep it.

A transport hands over what producers wrote: AMQP strings are octet strings, so a message's
type, message ID or header may hold bytes that are not UTF-8 (the RabbitMQ adapter decodes
them losslessly, each such byte a lone surrogate U+DC80..U+DCFF: Python's `surrogateescape`,
adapters/rabbitmq/wire.py) or U+0000, which PostgreSQL's `text` and `jsonb` refuse. The
boundary dead-letters a delivery whose type, message ID or kept header is not `clean`
(`application.envelope.admitted`), and the dead-letter store keeps such values `escaped`,
with their `original` bytes beside them (`application.dead_letter_copies.dead_letter_of`).
"""

from __future__ import annotations

import re

#: what PostgreSQL text cannot hold and UTF-8 cannot encode: U+0000 and lone surrogates
_UNCLEAN = re.compile("[\x00\ud800-\udfff]")


def clean(text: str) -> bool:
    """Whether `text` is UTF-8 text PostgreSQL can store: no U+0000 and no lone surrogate
    (a byte that was not UTF-8)."""
    return _UNCLEAN.search(text) is None


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code == 0:
        return "\\x00"
    return f"\\u{code:04x}"  # another lone surrogate (not from a transport's bytes)


def escaped(text: str) -> str:
    """`text` with what `clean` refuses written as escapes: a byte that was not UTF-8 as
    `\\xNN`, U+0000 as `\\x00`, another lone surrogate as `\\uXXXX` (the rest unchanged, so
    clean text is its own escape). For people and stores; `original` keeps the bytes."""
    return text if clean(text) else _UNCLEAN.sub(_escape, text)


def original(text: str) -> bytes:
    """The bytes `text` stands for: UTF-8, with each byte a transport could not decode
    (`surrogateescape`) back as it was, and any other lone surrogate as its UTF-8-like
    encoding (`surrogatepass`)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
