"""The state stream in memory: one append-only list of snapshots per partition."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from application.errors import Conflict, MessageIdReused, OutsideRetention
from application.ports import Clock, StateStream
from application.records import StateEntry


class MemoryStateStream(StateStream):
    """Every method yields to the event loop once (the round trip), then reads or writes
    without yielding, so it is atomic among coroutines, like one SQL statement."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.entries: dict[str, list[StateEntry]] = {}
        #: message ID -> the partition whose entry claims it (one per endpoint)
        self._claims: dict[uuid.UUID, str] = {}

    async def load(
        self, partition: str, message_id: uuid.UUID
    ) -> tuple[Any, int, StateEntry | None]:
        await asyncio.sleep(0)
        entries = self.entries.get(partition, [])
        for i, entry in enumerate(entries):
            if entry.message_id == message_id:
                if entry.version == 1:
                    return None, 0, entry
                if i == 0 or entries[i - 1].version != entry.version - 1:
                    raise OutsideRetention(
                        f"partition {partition}: the entry before message {message_id} "
                        "was truncated (duplicate older than the retention window)")
                return entries[i - 1].state, entry.version - 1, entry
        if not entries:
            return None, 0, None
        return entries[-1].state, entries[-1].version, None

    async def append(
        self,
        partition: str,
        expected_version: int,
        message_id: uuid.UUID,
        state: Any,
        recorded: Mapping[str, Any],
    ) -> int:
        await asyncio.sleep(0)
        entries = self.entries.setdefault(partition, [])
        newest = entries[-1].version if entries else 0
        if newest != expected_version:
            raise Conflict(f"partition {partition}: stream at v{newest}, expected "
                           f"v{expected_version}")
        holder = self._claims.get(message_id)
        if holder == partition:
            raise Conflict(f"partition {partition}: message {message_id} already appended")
        if holder is not None:
            raise MessageIdReused(message_id)  # the ID is another partition's (I1)
        self._claims[message_id] = partition
        entries.append(StateEntry(partition, newest + 1, message_id, state,
                                  MappingProxyType(dict(recorded)), self.clock.now()))
        return newest + 1

    async def truncate(self, before: datetime) -> int:
        await asyncio.sleep(0)
        dropped = 0
        for partition, entries in self.entries.items():
            kept = [e for e, nxt in zip(entries, [*entries[1:], None], strict=True)
                    if nxt is None or nxt.appended_at >= before]
            dropped += len(entries) - len(kept)
            for entry in entries:
                if entry not in kept:  # the claim goes with its entry, as the row does
                    self._claims.pop(entry.message_id, None)
            self.entries[partition] = kept
        return dropped

    def states(self) -> dict[str, Any]:
        """The newest state of every partition (oracles, the demo)."""
        return {p: e[-1].state for p, e in self.entries.items() if e}

    def entry_count(self) -> int:
        """Entries kept over all partitions."""
        return sum(len(e) for e in self.entries.values())
