"""Tokens in a dict: `TokenStore` for the embedded profile and unit tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from application.envelope import Envelope
from application.ports import TokenStore


class MemoryTokenStore(TokenStore):
    """Token rows keyed by message ID, holding the envelope (claim check) in `rows` and the
    endpoint each is addressed to in `addresses`. Each call yields to the event loop once, as
    a network round trip would, then acts atomically."""

    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, Envelope] = {}
        self.addresses: dict[uuid.UUID, str] = {}

    async def create(self, endpoint: str, envelopes: Sequence[Envelope]) -> None:
        await asyncio.sleep(0)
        self.insert(endpoint, envelopes)

    def insert(self, endpoint: str, envelopes: Sequence[Envelope]) -> None:
        """Create without a round trip: a co-located store's commit inserting tokens."""
        for envelope in envelopes:
            if envelope.message_id not in self.rows:
                self.rows[envelope.message_id] = envelope
                self.addresses[envelope.message_id] = endpoint

    def holds(self, endpoint: str, message_id: uuid.UUID) -> bool:
        """Whether a token addressed to `endpoint` exists (no round trip)."""
        return self.addresses.get(message_id) == endpoint

    async def get(self, endpoint: str, message_id: uuid.UUID) -> Envelope | None:
        await asyncio.sleep(0)
        return self.rows[message_id] if self.holds(endpoint, message_id) else None

    async def exists(self, endpoint: str, message_id: uuid.UUID) -> bool:
        await asyncio.sleep(0)
        return self.holds(endpoint, message_id)

    async def delete(self, endpoint: str, message_id: uuid.UUID) -> None:
        await asyncio.sleep(0)
        self.discard(endpoint, message_id)

    def discard(self, endpoint: str, message_id: uuid.UUID) -> None:
        """Delete without a round trip: a co-located store's transaction consuming a token."""
        if self.holds(endpoint, message_id):
            del self.rows[message_id], self.addresses[message_id]

    async def count(self) -> int:
        return len(self.rows)

    async def count_of(self, addresses: Sequence[tuple[str, uuid.UUID]]) -> int:
        await asyncio.sleep(0)
        return sum(1 for endpoint, m in set(addresses) if self.holds(endpoint, m))
