"""Running a pure handler: decoding, the call, its errors, and the rejection re-check."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from application.codec import decode, encode
from application.envelope import Envelope
from application.errors import (
    Conflict,
    HandlerRejected,
    PermanentError,
    StateTooLarge,
    UnknownMessageType,
)
from domain.context import Context
from domain.decisions import Decision, Endpoint
from domain.errors import Rejected


class HandlerRunner:
    """One endpoint's handler as every strategy runs it.

    `decide` holds the one copy of the rejection re-check: a handler's permanent failure
    judged on a state that another attempt has replaced meanwhile (maybe by committing this
    very message) is a `Conflict` to retry, not a verdict to dead-letter.
    """

    def __init__(self, endpoint: Endpoint[Any], max_state_bytes: int | None = None) -> None:
        """`max_state_bytes`: the most a partition's state may take as JSON (UTF-8 bytes,
        `application.codec.encode`); None: no bound."""
        self.endpoint, self.max_state_bytes = endpoint, max_state_bytes

    def decode(self, envelope: Envelope) -> Any:
        """The domain message of `envelope`; raises `UnknownMessageType` / `MalformedMessage`."""
        cls = self.endpoint.messages.get(envelope.type)
        if cls is None:
            raise UnknownMessageType(f"unknown message type {envelope.type!r}")
        return decode(cls, envelope.body)

    def partition_of(self, message: Any) -> str:
        """The partition key of `message`."""
        return self.endpoint.partition_of(message)

    def handle(self, state: Any, message: Any, context: Context) -> Decision[Any]:
        """The handler's decision. Raises `HandlerRejected` for `Rejected`, `StateTooLarge`
        when the new state takes more than `max_state_bytes`, and `PermanentError` for any
        other exception: a pure handler fails deterministically, so retrying would not
        help."""
        try:
            decision = self.endpoint.handle(state, message, context)
        except Rejected as exc:
            raise HandlerRejected(f"rejected by handler: {exc.reason}") from exc
        except Exception as exc:  # a pure handler's failure is deterministic
            raise PermanentError(f"handler failed: {type(exc).__name__}: {exc}") from exc
        limit = self.max_state_bytes
        if limit is not None and decision.state is not None:
            size = len(encode(decision.state))
            if size > limit:
                raise StateTooLarge(f"the new state of the partition takes {size} bytes, over "
                                    f"the limit of {limit} (EO_MAX_STATE_BYTES)")
        return decision

    async def decide(self, state: Any, message: Any, context: Context, partition: str,
                     changed: Callable[[], Awaitable[bool]]) -> Decision[Any]:
        """`handle`, with the rejection re-check: when the handler fails permanently and
        `changed()` says the partition moved since `state` was read, raise `Conflict`
        instead (the retry sees the new state, or finds the message processed)."""
        try:
            return self.handle(state, message, context)
        except PermanentError:
            if await changed():
                raise Conflict(f"partition {partition} changed while the handler ran") from None
            raise
