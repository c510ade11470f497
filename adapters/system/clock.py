"""The system clock, a clock moved ahead (final sweeps), and deterministic stand-ins for tests
and the demo."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

from application.ports import Clock, IdGenerator


class SystemClock(Clock):
    """`datetime.now(UTC)`."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock(Clock):
    """A clock that moves only when told (tests of grace periods and retention)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.current = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self.current

    def advance(self, delta: timedelta) -> None:
        """Move the clock forward by `delta`."""
        self.current += delta


class OffsetClock(Clock):
    """`clock` moved `offset` ahead: a final sweep with it acts as if every grace period had
    passed (quiescence in `eo embedded`, the test API, the demo and `eo chaos`)."""

    def __init__(self, clock: Clock, offset: timedelta) -> None:
        self.clock, self.offset = clock, offset

    def now(self) -> datetime:
        return self.clock.now() + self.offset


class SeededIds(IdGenerator):
    """Reproducible version-4 UUIDs from a seed (tests and replayable runs)."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def __call__(self) -> uuid.UUID:
        return uuid.UUID(int=self._random.getrandbits(128), version=4)
