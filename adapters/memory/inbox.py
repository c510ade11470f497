"""A boundary endpoint's inbox in a dict: `Inbox` for the embedded profile and unit tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime

from application.envelope import Envelope
from application.ports import Clock, Inbox, InboxClaim


@dataclass
class InboxRow:
    """One inbox row: the command, when it was received and when it was relayed (None:
    pending)."""

    envelope: Envelope
    received_at: datetime
    relayed_at: datetime | None = None


@dataclass
class MemoryClaim(InboxClaim):
    """Rows claimed by one relay; marks are applied when the claim ends without error."""

    envelopes: Sequence[Envelope]
    marked: set[uuid.UUID] = field(default_factory=set)

    async def mark_relayed(self, message_ids: Sequence[uuid.UUID]) -> None:
        await asyncio.sleep(0)
        claimed = {e.message_id for e in self.envelopes}
        self.marked.update(m for m in message_ids if m in claimed)


class MemoryInbox(Inbox):
    """Rows keyed by natural message ID in arrival order. Each call yields to the event loop
    once, as a round trip would; a claim hides its rows from other claims until it ends."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: dict[uuid.UUID, InboxRow] = {}
        self._claimed: set[uuid.UUID] = set()

    async def add(self, envelopes: Sequence[Envelope]) -> int:
        await asyncio.sleep(0)
        now, new = self.clock.now(), 0
        for envelope in envelopes:
            if envelope.message_id not in self.rows:
                self.rows[envelope.message_id] = InboxRow(envelope, now)
                new += 1
        return new

    @asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[InboxClaim]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        await asyncio.sleep(0)
        ids = [m for m, row in self.rows.items()
               if row.relayed_at is None and m not in self._claimed][:limit]
        self._claimed.update(ids)
        claim = MemoryClaim([self.rows[m].envelope for m in ids])
        try:
            yield claim
            now = self.clock.now()  # "commit": only a claim that ended cleanly marks
            for m in claim.marked:
                self.rows[m].relayed_at = now
        finally:
            self._claimed.difference_update(ids)

    async def purge_relayed(self, before: datetime) -> int:
        await asyncio.sleep(0)
        old = [m for m, row in self.rows.items()
               if row.relayed_at is not None and row.relayed_at < before]
        for m in old:
            del self.rows[m]
        return len(old)

    async def count_pending(self) -> int:
        await asyncio.sleep(0)
        return sum(1 for row in self.rows.values() if row.relayed_at is None)
