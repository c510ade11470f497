"""JSON encoding of messages and states (frozen dataclasses) with pydantic's TypeAdapter."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from application.errors import MalformedMessage, UnreadableState

_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def encode(value: object) -> bytes:
    """Canonical UTF-8 JSON of a dataclass value (Decimal as string, dates ISO 8601)."""
    return _adapter(type(value)).dump_json(value)


def decode(cls: type, data: bytes | str) -> Any:
    """Parse JSON `data` into `cls`; raises `MalformedMessage` naming the first problem."""
    try:
        return _adapter(cls).validate_json(data)
    except ValidationError as exc:
        raise MalformedMessage(f"malformed {cls.__name__}: {_first(exc, 'body')}") from exc


def _first(error: ValidationError, whole: str) -> str:
    """`<where>: <what>` of pydantic's first problem (`whole` when it is the value's)."""
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or whole
    return f"{where}: {first.get('msg')}"


def to_jsonable(value: object) -> Any:
    """The JSON-compatible form of `value` (for JSON columns); None stays None."""
    if value is None:
        return None
    return _adapter(type(value)).dump_python(value, mode="json")


def from_jsonable(cls: type, data: Any) -> Any:
    """Inverse of `to_jsonable`; raises `MalformedMessage` on a shape mismatch."""
    if data is None:
        return None
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise MalformedMessage(f"malformed {cls.__name__}: {exc.errors()[0].get('msg')}") from exc


def decode_state(cls: type, data: Any, partition: str) -> Any:
    """A partition's stored state (the JSON form `to_jsonable` wrote) as `cls`; None stays
    None. Raises `UnreadableState` naming the partition, the type and the first problem:
    a state at rest that the code no longer reads is the code's change, not the message's
    fault, so its message is dead-lettered replayable (a `MalformedMessage` would have
    clipped its body and made it unreplayable)."""
    if data is None:
        return None
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise UnreadableState(
            f"the stored state of partition {partition!r} does not decode as {cls.__name__}: "
            f"{_first(exc, 'state')} (a field added without a default? see "
            "docs/upgrading.md; replay once the state type reads it)") from exc
