"""AMQP strings as any producer may write them: a frame is read whatever bytes its strings
hold, and a copy the service publishes carries them back unchanged.

AMQP 0-9-1 short strings (a message's `type`, `message_id`, `content_type`, `user_id`, ...,
and the keys of a header table) are octet strings on the wire; RabbitMQ carries any bytes in
them. pamqp 4 (under aiormq and aio-pika) decodes them as strict UTF-8, so one delivery whose
`type` holds byte 0xff makes `pamqp.frame.unmarshal` raise; aiormq then reports an
`InvalidFrameError` and closes the whole connection, and every delivery unacked on it is
requeued, the poison message first: each redelivery kills the connection again, and the
other messages requeued with it pass the work queue's delivery limit and are dead-lettered
by the broker without ever being processed (the "N12" finding of issue 37). Long strings
(header values) already fall back to `bytes` in pamqp (gmr/pamqp#40); short strings do not.

`install()` fixes that where it belongs, in pamqp's codec tables, without a fork: short
strings and table keys are decoded with Python's `surrogateescape` error handler (valid
UTF-8 decodes as before; each byte that is not becomes one lone surrogate U+DC80..U+DCFF, so
no information is lost), and strings are encoded with the same handler (a copy of such a
message, a dead letter, is the producer's bytes again). Nothing else changes: the frame
layout, lengths and every other type are pamqp's own. The application never sees such a
string in an envelope: `application.envelope.admitted` dead-letters a delivery whose type,
message ID or kept header is not clean text (`application.wire_text`).

The replacement functions mirror pamqp 4.0's `decode.short_str`, `decode.field_table`,
`encode._string` and `encode.field_table`; `install` checks the pamqp version it was written
for is the one installed (a newer pamqp must be checked again: the test
tests/unit/adapters/test_wire.py round-trips a frame through the installed codec).
"""

from __future__ import annotations

import logging
import struct
from importlib.metadata import version
from typing import Any

from pamqp import common
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

log = logging.getLogger(__name__)

#: the pamqp releases whose codec these functions mirror (major.minor)
PAMQP_VERSIONS = ("4.0",)
_ERRORS = "surrogateescape"


def short_str(value: bytes) -> tuple[int, str]:
    """Decode an AMQP short string: (bytes consumed, text). Bytes that are not UTF-8 become
    lone surrogates (`surrogateescape`). Raises ValueError when `value` holds no length."""
    try:
        length = common.Struct.byte.unpack(value[0:1])[0]
    except (struct.error, TypeError) as err:
        raise ValueError("Could not unpack short string value") from err
    return length + 1, value[1: length + 1].decode("utf-8", _ERRORS)


def field_table(value: bytes) -> tuple[int, common.FieldTable]:
    """Decode an AMQP field table: (bytes consumed, dict); keys as `short_str` decodes them,
    values by pamqp. Raises ValueError when the data is not a table."""
    try:
        length = common.Struct.integer.unpack(value[0:4])[0]
        offset = 4
        data: dict[str, Any] = {}
        end = offset + length
        if end > len(value):
            raise ValueError("Field table length exceeds available data")
        while offset < end:
            key_length = common.Struct.byte.unpack_from(value, offset)[0]
            offset += 1
            if offset + key_length > end:
                raise ValueError("Field table key length exceeds data")
            key = value[offset: offset + key_length].decode("utf-8", _ERRORS)
            offset += key_length
            consumed, result = pamqp_decode.embedded_value(value[offset:])
            offset += consumed
            data[key] = result
        return end, data
    except (struct.error, TypeError) as err:
        raise ValueError("Could not unpack data") from err


def _string(encoder: struct.Struct, value: str) -> bytes:
    """A length-prefixed string; lone surrogates back to the bytes they stand for. Raises
    TypeError for a value that is not a str or is too long for its length prefix."""
    if not isinstance(value, str):
        raise TypeError(f"str required, received {type(value)}")
    encoded = value.encode("utf-8", _ERRORS)
    max_length = 255 if encoder is common.Struct.byte else 4294967295
    if len(encoded) > max_length:
        raise TypeError(f"string exceeds maximum length of {max_length} bytes")
    return encoder.pack(len(encoded)) + encoded


def encode_field_table(value: common.FieldTable) -> bytes:
    """Encode a field table (keys sorted, as pamqp does); keys as `_string` encodes them.
    Raises TypeError for a value pamqp cannot encode or a key over 255 bytes."""
    if not value:
        return common.Struct.integer.pack(0)
    if not isinstance(value, dict):
        raise TypeError(f"dict required, received {type(value)}")
    data = []
    for key, item in sorted(value.items()):
        data.append(_string(common.Struct.byte, key))
        try:
            data.append(pamqp_encode.encode_table_value(item))
        except TypeError as err:
            raise TypeError(f"{key} error: {err}") from err
    output = b"".join(data)
    return common.Struct.integer.pack(len(output)) + output


_installed = False


def install() -> None:
    """Put these functions into pamqp's codec (idempotent). Logs a warning when the
    installed pamqp is not one of `PAMQP_VERSIONS`."""
    global _installed
    if _installed:
        return
    installed = version("pamqp")
    if not installed.startswith(tuple(f"{v}." for v in PAMQP_VERSIONS)):
        log.warning("pamqp %s: adapters/rabbitmq/wire.py mirrors pamqp %s; check it again",
                    installed, ", ".join(PAMQP_VERSIONS))
    pamqp_decode.METHODS["shortstr"] = short_str
    pamqp_decode.METHODS["table"] = field_table
    pamqp_decode.TABLE_MAPPING[b"F"] = field_table
    pamqp_decode.short_str = short_str
    pamqp_decode.field_table = field_table
    pamqp_encode._string = _string
    pamqp_encode.METHODS["table"] = encode_field_table
    pamqp_encode.field_table = encode_field_table
    _installed = True
