"""A copy whose handler rejects a state another attempt just committed must not be
dead-lettered: it is a conflict (then a duplicate), not a verdict. Found by `eo demo`.

The shipped adapters read the transaction record and the state in one snapshot (the port
contract asks for it), and then a copy never runs its handler on a state its own message
produced: the token is consumed before the TR is cleared. The re-check
(`HandlerRunner.decide`) is what keeps an adapter correct whose read is *not* one snapshot (two
statements under READ COMMITTED, a read replica for the state). So the explorations below
run on such adapters, composed from the memory ones: `TornLoads` reads the TR and the state
in two port calls, `TornStream` looks up the message's own entry and the newest state in
two. The scheduler can then stop a worker between the two reads, and the `Conflict` branches
of the re-check are reached (each exploration asserts that they are).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from application.envelope import Envelope
from application.errors import PermanentError
from application.observability import TRANSACTION_CONFLICT, CountingSink
from application.outcome import Outcome
from application.ports import Loaded
from domain.context import Context
from domain.decisions import Decision, Endpoint
from domain.errors import Rejected
from tests.support.scheduler import Choice, GatedPort, Run, explore
from tests.support.world import StateWorld, World


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

M = uuid.UUID(int=9)
#: a message ID no test sends: its lookup in a stream returns the newest state
_NOBODY = uuid.UUID(int=0)


class TornLoads:
    """A partition store whose `load` is two reads: the TR, then the state (and token)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def load(self, partition: str, token: uuid.UUID | None = None) -> Loaded:
        tr = await self._store.load_tr(partition)
        later = await self._store.load(partition, token)
        return Loaded(tr, later.state, later.token_exists)


class TornStream:
    """A state stream whose `load` is two reads: the message's own entry, then the newest
    state."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def load(self, partition: str, message_id: uuid.UUID) -> tuple[Any, int, Any]:
        before, version, mine = await self._stream.load(partition, message_id)
        if mine is not None:
            return before, version, mine
        newest, version, _ = await self._stream.load(partition, _NOBODY)
        return newest, version, None


async def _two_copies(world_of: Any, torn: str, wrapper: Any) -> tuple[int, set[str], int]:
    """Every schedule of two copies of `M` within two preemptions, each worker's port `torn`
    wrapped by `wrapper` (over the gate, so the scheduler may stop it between its two
    reads): (schedules, outcomes, conflicts raised by the re-check). `world_of(sink)` makes
    the world and the envelope to deliver."""
    outcomes: set[str] = set()
    rechecks = 0

    async def one(prefix: list[Choice]) -> Run:
        nonlocal rechecks
        conflicts = _Conflicts()
        world, envelope = await world_of(CountingSink(conflicts))
        run = Run(prefix)

        async def body(wid: int) -> None:
            def gated(name: str, port: Any) -> Any:
                port = GatedPort(port, run, wid, name)
                return wrapper(port) if name == torn else port
            try:
                outcomes.add(str(await world.processor(wrap=gated).process(envelope)))
            except PermanentError as exc:
                outcomes.add(f"dead-lettered: {exc.reason}")

        await run.execute({0: body, 1: body}, lambda _wid: None)
        rechecks += conflicts.rechecks
        return run

    explored = await explore(one, max_preemptions=2, max_crashes=0, limit=100_000)
    print(f"\n{torn} torn: {explored} schedules, {rechecks} re-check conflicts")
    return explored, outcomes, rechecks


async def test_the_token_path_rechecks_a_rejection_against_its_transaction_record() -> None:
    """Two copies of one message on the token path: no schedule dead-letters the copy that
    lost, and some schedules take the re-check's `Conflict` branch."""
    async def world_of(sink: CountingSink) -> tuple[World, Envelope]:
        world = World(LATCH, events=sink)
        return world, await world.send(Close("p"), M)

    explored, outcomes, rechecks = await _two_copies(world_of, "store", TornLoads)
    assert 50 <= explored < 100_000  # the bounded space, enumerated whole
    assert outcomes == {str(Outcome.PROCESSED), str(Outcome.DUPLICATE)}
    assert rechecks > 0  # the branch under test is reached


async def test_the_state_path_rechecks_a_rejection_against_its_stream() -> None:
    """Two copies of one message on the state path: the same, against the state stream."""
    async def world_of(sink: CountingSink) -> tuple[StateWorld, Envelope]:
        world = StateWorld(endpoint=LATCH, events=sink)
        return world, await world.envelope(Close("p"), 9)

    explored, outcomes, rechecks = await _two_copies(world_of, "stream", TornStream)
    assert 10 <= explored < 100_000
    assert outcomes == {str(Outcome.PROCESSED), str(Outcome.DUPLICATE)}
    assert rechecks > 0


class _Conflicts:
    """Counts the conflicts raised by the rejection re-check (by the reason
    `HandlerRunner.decide` gives them)."""

    def __init__(self) -> None:
        self.rechecks = 0

    def emit(self, event: str, **fields: object) -> None:
        if event == TRANSACTION_CONFLICT and "while the handler ran" in str(fields["reason"]):
            self.rechecks += 1
