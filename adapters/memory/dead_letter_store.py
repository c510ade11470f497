"""Dead letters in a dict: `DeadLetterStore` for the embedded profile and unit tests."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime

from application.dead_letter_copies import dead_letter_of
from application.envelope import Envelope
from application.ports import Clock, DeadLetterQuery, DeadLetterStore, HeldDeadLetter
from application.records import DeadLetter, DeadLetterStatus


def _key(letter: DeadLetter) -> tuple[object, ...] | None:
    """The key a message dead-lettered again is found under (None: never merged): its
    endpoint, producer, message ID (a UUID, else as it came) and digest."""
    if letter.digest is None or (letter.message_id or letter.raw_message_id) is None:
        return None
    return (letter.endpoint, letter.producer, letter.message_id, letter.raw_message_id,
            letter.digest)


@dataclass
class _Held(HeldDeadLetter):
    letter: DeadLetter
    clock: Clock
    marked: DeadLetter | None = None

    async def replayed(self, by: str) -> None:
        self.marked = replace(self.letter, status=DeadLetterStatus.REPLAYED,
                              replays=self.letter.replays + 1, acted_at=self.clock.now(),
                              acted_by=by, discard_reason=None)

    async def discarded(self, by: str, why: str) -> None:
        self.marked = replace(self.letter, status=DeadLetterStatus.DISCARDED,
                              acted_at=self.clock.now(), acted_by=by, discard_reason=why)


class MemoryDeadLetterStore(DeadLetterStore):
    """Dead letters by ID in `letters`. Each call yields to the event loop once, as a round
    trip would, then acts atomically; a hold keeps its letter from other holds until it
    ends, and applies its mark only when it ends without an exception."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.letters: dict[int, DeadLetter] = {}
        self._ids = itertools.count(1)
        self._held: set[int] = set()

    async def add(self, letter: DeadLetter) -> int:
        await asyncio.sleep(0)
        key = _key(letter)
        known = next((d for d in self.letters.values() if key is not None and _key(d) == key),
                     None)
        if known is None:
            letter = replace(letter, dead_letter_id=next(self._ids))
        else:
            new = tuple(r for r in letter.reasons if r not in known.reasons)
            letter = replace(known, reasons=tuple(sorted((*known.reasons, *new),
                                                         key=lambda r: r.at)),
                             status=DeadLetterStatus.DEAD, headers=letter.headers)
        self.letters[letter.dead_letter_id] = letter
        return letter.dead_letter_id

    async def find(self, query: DeadLetterQuery) -> list[DeadLetter]:
        await asyncio.sleep(0)
        found = [d for d in self.letters.values() if _selected(d, query)]
        return sorted(found, key=lambda d: (d.last_at, d.dead_letter_id))[: query.limit]

    @asynccontextmanager
    async def hold(self, dead_letter_id: int) -> AsyncIterator[HeldDeadLetter | None]:
        await asyncio.sleep(0)
        letter = self.letters.get(dead_letter_id)
        if letter is None or dead_letter_id in self._held:
            yield None
            return
        self._held.add(dead_letter_id)
        held = _Held(letter, self.clock)
        try:
            yield held
            if held.marked is not None:  # "commit": only a hold that ended cleanly marks
                self.letters[dead_letter_id] = held.marked
        finally:
            self._held.discard(dead_letter_id)

    async def waiting(self) -> list[tuple[str, uuid.UUID]]:
        await asyncio.sleep(0)
        return [(d.endpoint, d.message_id) for d in self.letters.values()
                if d.status is DeadLetterStatus.DEAD and d.message_id is not None]

    async def counts(self) -> dict[str, dict[str, int]]:
        await asyncio.sleep(0)
        counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        for d in self.letters.values():
            counts[d.endpoint][str(d.status)] += 1
        return {endpoint: dict(c) for endpoint, c in counts.items()}

    async def purge(self, before: datetime) -> int:
        await asyncio.sleep(0)
        old = [i for i, d in self.letters.items()
               if d.status is not DeadLetterStatus.DEAD and (d.acted_at or d.last_at) < before]
        for i in old:
            del self.letters[i]
        return len(old)


def _selected(letter: DeadLetter, query: DeadLetterQuery) -> bool:
    return ((not query.endpoints or letter.endpoint in query.endpoints)
            and (not query.ids or letter.dead_letter_id in query.ids)
            and (query.status is None or letter.status is query.status)
            and (query.reason is None or query.reason.lower() in letter.reason.lower())
            and (query.before is None or letter.last_at < query.before)
            and (query.after is None or letter.last_at >= query.after))


async def collect(queue: str, letters: list[Envelope], store: DeadLetterStore,
                  clock: Clock) -> int:
    """Move the memory broker's dead letters of `queue` (its `dead_letters[queue]` list,
    emptied) into `store`, as the RabbitMQ adapter's collector moves a dead-letter queue
    (adapters/rabbitmq/dead_letter_queue.py); returns how many."""
    moved = 0
    while letters:
        e = letters.pop(0)
        await store.add(dead_letter_of(queue, str(e.message_id), e.type, e.body, e.headers,
                                       e.producer, clock.now()))
        moved += 1
    return moved
