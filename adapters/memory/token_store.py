"""Tokens in a dict: `TokenStore` for the embedded profile and unit tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from application.envelope import Envelope
from application.ports import TokenStore


class MemoryTokenStore(TokenStore):
    """Token rows keyed by message ID, holding the envelope (claim check). Each call yields
    to the event loop once, as a network round trip would, then acts atomically."""

    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, Envelope] = {}

    async def create(self, envelopes: Sequence[Envelope]) -> None:
        await asyncio.sleep(0)
        for envelope in envelopes:
            self.rows.setdefault(envelope.message_id, envelope)

    async def get(self, message_id: uuid.UUID) -> Envelope | None:
        await asyncio.sleep(0)
        return self.rows.get(message_id)

    async def exists(self, message_id: uuid.UUID) -> bool:
        await asyncio.sleep(0)
        return message_id in self.rows

    async def delete(self, message_id: uuid.UUID) -> None:
        await asyncio.sleep(0)
        self.discard(message_id)

    def discard(self, message_id: uuid.UUID) -> None:
        """Delete without a round trip: a co-located store's transaction consuming a token."""
        self.rows.pop(message_id, None)

    async def count(self) -> int:
        return len(self.rows)
