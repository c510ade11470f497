"""The dead letters kept for operators: which to select, one held for an action, and their
store."""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from application.records import (
    DeadLetter,
    DeadLetterStatus,
)


@dataclass(frozen=True)
class DeadLetterQuery:
    """Which dead letters: those of `endpoints` (all when empty), with `ids` (any when
    empty), in `status` (any when None), whose latest reason contains `reason` (case
    apart), last dead-lettered before `before` and from `after` on (UTC; None: no bound);
    at most `limit` (>= 1), oldest first."""

    endpoints: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    status: DeadLetterStatus | None = DeadLetterStatus.DEAD
    reason: str | None = None
    before: datetime | None = None
    after: datetime | None = None
    limit: int = 100


class HeldDeadLetter(Protocol):
    """A dead letter held for one operator's action (`DeadLetterStore.hold`): no other hold
    gets it meanwhile. The mark takes effect when the hold ends without an exception."""

    letter: DeadLetter

    async def replayed(self, by: str) -> None:
        """Mark it republished by `by`."""

    async def discarded(self, by: str, why: str) -> None:
        """Mark it discarded by `by`, for `why`."""


class DeadLetterStore(Protocol):
    """The dead letters of a service's endpoints, kept until an operator acts on them
    (application/dead_letters.py) and purged after the retention window. Raises
    `TransientError` when unreachable."""

    async def add(self, letter: DeadLetter) -> int:
        """Keep `letter`; returns its `dead_letter_id`. A replayable message already kept
        under the same endpoint, producer, message ID and digest is the same dead letter
        dead-lettered again: its reasons are appended (a reason already there, same time
        and text, is not repeated: the collector is at least once) and it is `dead` again."""

    async def find(self, query: DeadLetterQuery) -> list[DeadLetter]:
        """The dead letters `query` selects, oldest first."""

    def hold(self, dead_letter_id: int) -> AbstractAsyncContextManager[HeldDeadLetter | None]:
        """Hold dead letter `dead_letter_id` for an action; None when it does not exist or
        another hold has it (two operators, one action)."""

    async def waiting(self) -> list[tuple[str, uuid.UUID]]:
        """(endpoint, message ID) of the `dead` ones with a message ID (the gauges: the
        tokens that dead letters keep)."""

    async def counts(self) -> dict[str, dict[str, int]]:
        """Per endpoint, how many dead letters are in each status."""

    async def purge(self, before: datetime) -> int:
        """Delete the replayed and discarded ones acted on before `before` (the record of
        what operators did stays a retention window); returns how many."""
