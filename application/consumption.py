"""How `finish` consumes the incoming token and clears the transaction record (protocol 3.1's
last steps), chosen once when the system is built (`application.assembly`): by the clear
itself when the tokens share the partition store's database (protocol 3.2's fast path), by a
delete just before the clear when they live apart (not at all on the outbox path: its
messages come with no token)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from application.ports import Clear, IncomingTokens, PartitionStore

#: Called for each transaction whose token was consumed (its index in the call's lists).
Consumed = Callable[[int], None]
#: A failpoint hit (`Failpoints.hit`, or nothing).
Hit = Callable[[str], Awaitable[None]]


class Consumption(Protocol):
    """The consume-and-clear step of `finish` for the endpoint's token placement."""

    @property
    def batches(self) -> bool:
        """Whether many transactions can be consumed and cleared in one statement (the
        batched token path)."""

    def consumed_by_clear(self, message_id: uuid.UUID) -> uuid.UUID | None:
        """The token the clear itself consumes (`Clear.consume`), or None."""

    async def consume_and_clear(self, store: PartitionStore, clears: Sequence[Clear],
                                message_ids: Sequence[uuid.UUID], consumed: Consumed,
                                hit: Hit, batched: bool = False) -> list[bool]:
        """Consume the tokens of `message_ids` and run `clears` (compare-and-clear; with
        `batched`, which needs `batches`, one statement for them all), hitting
        `after_consume_token` once they are consumed; returns whether each cleared."""


@dataclass(frozen=True)
class ConsumedByTheClear:
    """Tokens in the partition store's database: the clear deletes the token in the same
    transaction, for one transaction or many (`clear_many`)."""

    batches: bool = True

    def consumed_by_clear(self, message_id: uuid.UUID) -> uuid.UUID | None:
        return message_id

    async def consume_and_clear(self, store: PartitionStore, clears: Sequence[Clear],
                                message_ids: Sequence[uuid.UUID], consumed: Consumed,
                                hit: Hit, batched: bool = False) -> list[bool]:
        if batched:
            cleared = await store.clear_many(clears)
        else:
            [clear] = clears
            cleared = [await store.clear(clear)]
        for i in range(len(message_ids)):
            consumed(i)
        await hit("after_consume_token")
        return cleared


@dataclass(frozen=True)
class DeletedBeforeTheClear:
    """Tokens in a database of their own: the token is deleted (the last publication step),
    then the TR cleared; one transaction at a time. `tokens` None: the outbox path, whose
    messages come with no token, only clears."""

    tokens: IncomingTokens | None
    batches: bool = False

    def consumed_by_clear(self, message_id: uuid.UUID) -> uuid.UUID | None:
        return None

    async def consume_and_clear(self, store: PartitionStore, clears: Sequence[Clear],
                                message_ids: Sequence[uuid.UUID], consumed: Consumed,
                                hit: Hit, batched: bool = False) -> list[bool]:
        [clear], [m] = clears, message_ids
        if self.tokens is not None:
            await self.tokens.delete(m)  # consume: the last publication step
            consumed(0)
        await hit("after_consume_token")
        return [await store.clear(clear)]
