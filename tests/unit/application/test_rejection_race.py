"""A copy whose handler rejects a state another attempt just committed must not be
dead-lettered: it is a conflict (then a duplicate), not a verdict. Found by `eo demo`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from application.errors import PermanentError
from application.processor import Outcome
from domain.context import Context
from domain.decisions import Decision, Endpoint
from domain.errors import Rejected
from tests.support.scheduler import Choice, GatedPort, Run, explore
from tests.support.world import World


@dataclass(frozen=True)
class Close:
    partition: str


@dataclass(frozen=True)
class Latch:
    closed: bool = False


def handle(state: Latch | None, message: Close, context: Context) -> Decision[Latch]:
    if state is not None and state.closed:
        raise Rejected("already closed")
    return Decision(state=Latch(closed=True))


LATCH: Endpoint[Latch] = Endpoint("latch", {"Close": Close}, lambda m: m.partition, handle, Latch)


async def test_no_schedule_dead_letters_a_duplicate_copy() -> None:
    outcomes: list[str] = []

    async def one(prefix: list[Choice]) -> Run:
        world = World(LATCH)
        envelope = await world.send(Close("p"), uuid.UUID(int=9))
        run = Run(prefix)

        async def body(wid: int) -> None:
            processor = world.processor(wrap=lambda n, p: GatedPort(p, run, wid, n))
            try:
                outcomes.append(str(await processor.process(envelope)))
            except PermanentError as exc:
                outcomes.append(f"dead-lettered: {exc.reason}")

        await run.execute({0: body, 1: body}, lambda _wid: None)
        return run

    explored = await explore(one, max_preemptions=2, max_crashes=0, limit=100_000)
    assert explored >= 20  # the bounded space is enumerated whole
    assert set(outcomes) == {str(Outcome.PROCESSED), str(Outcome.DUPLICATE)}
