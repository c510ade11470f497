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


#: an inbox row's key: its producer and natural message ID
Key = tuple[str, uuid.UUID]


def _key(envelope: Envelope) -> Key:
    return envelope.producer, envelope.message_id


@dataclass
class MemoryClaim(InboxClaim):
    """Rows claimed by one relay; marks are applied when the claim ends without error."""

    envelopes: Sequence[Envelope]
    marked: set[Key] = field(default_factory=set)

    async def mark_relayed(self, rows: Sequence[Envelope]) -> None:
        await asyncio.sleep(0)
        claimed = {_key(e) for e in self.envelopes}
        self.marked.update(k for k in map(_key, rows) if k in claimed)


class MemoryInbox(Inbox):
    """Rows keyed by (producer, natural message ID) in arrival order, the producer being the
    envelope's as given (no roles here). Each call yields to the event loop once, as a round
    trip would; a claim hides its rows from other claims until it ends."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: dict[Key, InboxRow] = {}
        self._claimed: set[Key] = set()

    async def add(self, envelopes: Sequence[Envelope]) -> int:
        await asyncio.sleep(0)
        now, new = self.clock.now(), 0
        for envelope in envelopes:
            if _key(envelope) not in self.rows:
                self.rows[_key(envelope)] = InboxRow(envelope, now)
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
