"""Tokens: the rows whose existence authorises processing a message (protocol 3), and an
HTTP callee's stored requests, which are its tokens (protocol 6)."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from application.envelope import Envelope


class TokenStore(Protocol):
    """Tokens: a row per in-flight message whose existence authorises processing it.

    A token is *addressed*: it names the endpoint the message was sent to, and only that
    endpoint may read, check or consume it (every method takes the `endpoint`). A message ID
    alone never reaches another endpoint's token, so a delivery to one endpoint whose ID
    equals another's live token (an outside producer can read IDs in logs) finds no token
    (project amendment to protocol 3; tokens written before the amendment have no address
    and stay readable by any endpoint of the token path until they drain). The row holds the
    message (claim check), so reading the body and checking the token are one read. All
    methods are idempotent. Raises `TransientError` when the store is unreachable.
    """

    async def create(self, endpoint: str, envelopes: Sequence[Envelope]) -> None:
        """Create a token addressed to `endpoint` per envelope; an existing token is left as
        it is."""

    async def get(self, endpoint: str, message_id: uuid.UUID) -> Envelope | None:
        """The stored message of the token addressed to `endpoint`, or None when there is no
        such token (a duplicate, consumed, or addressed to another endpoint)."""

    async def exists(self, endpoint: str, message_id: uuid.UUID) -> bool:
        """Whether the token addressed to `endpoint` exists."""

    async def delete(self, endpoint: str, message_id: uuid.UUID) -> None:
        """Delete the token addressed to `endpoint` (consume); a missing token is a no-op."""

    async def count(self) -> int:
        """Tokens in flight, all endpoints (a gauge, and the I9 check)."""

    async def count_of(self, addresses: Sequence[tuple[str, uuid.UUID]]) -> int:
        """How many of these tokens, each (endpoint, message ID), exist (the tokens that
        dead letters keep: `application.dead_letters.DeadLetters.gauges`)."""


class IncomingTokens(Protocol):
    """The tokens one endpoint may consume: what its token path reads, checks after the TR
    load, and deletes last in `finish` (protocol 3.1). For a consumer, its addressed tokens
    in the `TokenStore` (`application.token_path.AddressedTokens`); for an HTTP callee, its
    stored requests (`RequestStore`). Raises `TransientError` when unreachable."""

    async def get(self, message_id: uuid.UUID) -> Envelope | None:
        """The stored message, or None when no token exists (duplicate or consumed)."""

    async def exists(self, message_id: uuid.UUID) -> bool:
        """Whether the token exists."""

    async def delete(self, message_id: uuid.UUID) -> None:
        """Consume the token; a missing token is a no-op."""


class PutResult(enum.StrEnum):
    """Outcome of storing a request on the HTTP callee (protocol 6, PUT)."""

    CREATED = "created"
    SAME = "same"  # same body stored before: 200
    DIFFERENT = "different"  # another body under this ID: 409
    GONE = "gone"  # deleted before (tombstone): 410


class RequestStore(IncomingTokens, Protocol):
    """The HTTP callee's stored requests. As its `IncomingTokens` a request is a token: `get`
    and `exists` see it while stored and not answered, `delete` marks it answered (the
    consume step). Tombstones of deleted requests are kept for the retention window."""

    async def put(self, request_id: uuid.UUID, envelope: Envelope) -> PutResult:
        """Store a request create-only; see `PutResult`."""

    async def known(self, request_id: uuid.UUID) -> bool:
        """Whether the request is stored, answered or not (not deleted)."""

    async def remove(self, request_id: uuid.UUID, now: datetime) -> None:
        """Delete the request and keep a tombstone, also for an unknown ID (idempotent)."""

    async def purge_tombstones(self, before: datetime) -> int:
        """Drop tombstones made before `before`; returns how many."""

    async def count(self) -> int:
        """Requests stored, answered or not (what the caller has yet to DELETE)."""
