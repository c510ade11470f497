"""The HTTP callee's stored requests in memory: `RequestStore`."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

from application.envelope import Envelope
from application.ports import PutResult, RequestStore


class MemoryRequestStore(RequestStore):
    """Requests with an answered flag, and tombstones with their time. A request is a token
    while stored and unanswered."""

    def __init__(self) -> None:
        self.requests: dict[uuid.UUID, tuple[Envelope, bool]] = {}
        self.tombstones: dict[uuid.UUID, datetime] = {}

    async def put(self, request_id: uuid.UUID, envelope: Envelope) -> PutResult:
        await asyncio.sleep(0)
        if request_id in self.tombstones:
            return PutResult.GONE
        existing = self.requests.get(request_id)
        if existing is None:
            self.requests[request_id] = (envelope, False)
            return PutResult.CREATED
        return PutResult.SAME if existing[0].body == envelope.body else PutResult.DIFFERENT

    async def known(self, request_id: uuid.UUID) -> bool:
        await asyncio.sleep(0)
        return request_id in self.requests

    async def remove(self, request_id: uuid.UUID, now: datetime) -> None:
        await asyncio.sleep(0)
        self.requests.pop(request_id, None)
        self.tombstones.setdefault(request_id, now)

    async def purge_tombstones(self, before: datetime) -> int:
        await asyncio.sleep(0)
        old = [k for k, t in self.tombstones.items() if t < before]
        for k in old:
            del self.tombstones[k]
        return len(old)

    async def get(self, message_id: uuid.UUID) -> Envelope | None:
        await asyncio.sleep(0)
        row = self.requests.get(message_id)
        return row[0] if row is not None and not row[1] else None

    async def exists(self, message_id: uuid.UUID) -> bool:
        return await self.get(message_id) is not None

    async def delete(self, message_id: uuid.UUID) -> None:
        """Mark the request answered (the callee's consume step)."""
        await asyncio.sleep(0)
        row = self.requests.get(message_id)
        if row is not None:
            self.requests[message_id] = (row[0], True)

    async def count(self) -> int:
        """Requests stored, answered or not (deleted ones are gone)."""
        return len(self.requests)
